"""Niches keep their best; signatures and MAP-Elites cells group members differently."""
import pytest

from islands.config import IslandsConfig
from islands.population import Island, Member


def member(pid, score, code="x = 1", inst=(), desc=()):
    return Member(pid, score, code, 1, tuple(inst), tuple(desc))


def test_niche_keeps_its_best():
    island = Island(0, IslandsConfig())
    assert island.add(member("a", 1.0, inst=(1, 0)))
    assert not island.add(member("b", 0.5, inst=(1, 0)))
    assert island.add(member("c", 2.0, inst=(1, 0)))
    assert [m.program_id for m in island.members()] == ["c"]
    assert island.best().program_id == "c"


def test_wider_niche_orders_best_first():
    island = Island(0, IslandsConfig(max_members_per_niche=3))
    for pid, score in [("a", 1.0), ("b", 3.0), ("c", 2.0), ("d", 0.1)]:
        island.add(member(pid, score, inst=(5,)))
    (niche,) = island.niches().values()
    assert [m.program_id for m in niche] == ["b", "c", "a"]


def test_signature_groups_by_rounded_instance_scores():
    island = Island(0, IslandsConfig(signature_decimals=1, max_members_per_niche=5))
    island.add(member("a", 1.0, inst=(0.51, 0.49)))
    island.add(member("b", 1.0, inst=(0.52, 0.48)))
    island.add(member("c", 1.0, inst=(0.9, 0.1)))
    groups = sorted(sorted(m.program_id for m in n) for n in island.niches().values())
    assert groups == [["a", "b"], ["c"]]


def test_map_elites_groups_by_descriptor_cell_not_signature():
    config = IslandsConfig(niche="map_elites", descriptor_bins=2, descriptor_bounds=[(0, 1)], max_members_per_niche=5)
    island = Island(0, config)
    island.add(member("a", 1.0, inst=(1,), desc=(0.1,)))
    island.add(member("b", 2.0, inst=(2,), desc=(0.2,)))
    island.add(member("c", 1.0, inst=(1,), desc=(0.9,)))
    island.add(member("d", 1.0, inst=(1,), desc=(7.0,)))  # clipped into the top cell
    assert {k: [m.program_id for m in v] for k, v in island.niches().items()} == {(0,): ["b", "a"], (1,): ["c", "d"]}


def test_map_elites_learns_bounds_and_rebins():
    island = Island(0, IslandsConfig(niche="map_elites", descriptor_bins=2, max_members_per_niche=5))
    island.add(member("a", 1.0, desc=(0.0,)))
    island.add(member("b", 1.0, desc=(1.0,)))
    island.add(member("c", 1.0, desc=(10.0,)))  # range now [0, 10]: a and b share the low cell
    assert sorted(len(v) for v in island.niches().values()) == [1, 2]


def test_map_elites_without_descriptors_is_a_clear_error():
    island = Island(0, IslandsConfig(niche="map_elites"))
    with pytest.raises(ValueError, match="needs descriptors"):
        island.add(member("a", 1.0))


def test_duplicate_program_is_ignored_and_clear_empties():
    island = Island(0, IslandsConfig())
    island.add(member("a", 1.0))
    assert not island.add(member("a", 1.0))
    assert len(island) == 1
    island.clear()
    assert island.best() is None and island.members() == []


def test_non_finite_score_rejected():
    with pytest.raises(ValueError, match="non-finite"):
        Island(0, IslandsConfig()).add(member("a", float("nan")))


def test_config_rejects_unknown_keys_and_bad_bounds():
    with pytest.raises(ValueError, match="colour"):
        IslandsConfig(colour="red")
    with pytest.raises(ValueError, match="low must be below high"):
        IslandsConfig(descriptor_bounds=[(1, 0)])
