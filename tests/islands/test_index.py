"""The island's index (niche scores, each member's niche, its count and best niche) gives
exactly what walking every niche and member gives, draw for draw, through adds, truncated
niches, MAP-Elites re-binning, resets, migration and snapshots. The walks below are the
definitions; the island no longer walks on every draw (`benchmarks/selection_scale.py`)."""
import numpy as np
import pytest

from islands.config import IslandsConfig
from islands.migration import best_members, ring_migration
from islands.population import Island, Member, rank_key
from islands.selection import normalise, select_inspirations, select_parent, softmax


def parent_by_walking(island, rng, temperature):
    niches = list(island.niches().values())
    scores = np.array([niche[0].score for niche in niches], dtype=float)
    chosen = niches[rng.choice(len(niches), p=softmax(normalise(scores) / temperature))]
    if len(chosen) == 1:
        return chosen[0]
    lengths = np.array([len(m.code) for m in chosen], dtype=float)
    scaled = (lengths - lengths.min()) / (lengths.max() + 1e-6)
    return chosen[rng.choice(len(chosen), p=softmax(-scaled))]


def inspirations_by_walking(island, rng, k, exclude_id):
    own = next((key for key, niche in island.niches().items() if any(m.program_id == exclude_id for m in niche)),
               None)
    others = [niche[0] for key, niche in island.niches().items() if key != own]
    shown = {m.program_id for m in others} | {exclude_id}
    rest = [m for m in island.members() if m.program_id not in shown]
    picked = [others[i] for i in rng.permutation(len(others))][:k]
    return picked + [rest[i] for i in rng.permutation(len(rest))][:k - len(picked)]


def best_by_walking(island):
    bests = [niche[0] for niche in island.niches().values()]
    return min(bests, key=rank_key) if bests else None


def same_draws(island, seed, exclude=None, k=3):
    a, b = np.random.default_rng(seed), np.random.default_rng(seed)
    for temperature in (0.05, 1.0, 50.0):
        assert select_parent(island, a, temperature) == parent_by_walking(island, b, temperature)
    for k_ in (1, k, 40):
        assert select_inspirations(island, a, k_, exclude) == inspirations_by_walking(island, b, k_, exclude)
    assert a.bit_generator.state == b.bit_generator.state  # and the same randomness used


def check(island, rng):
    assert island.best() == best_by_walking(island)
    members = island.members()
    assert len(island) == len(members) == len({m.program_id for m in members})
    for m in members[:: max(1, len(members) // 20)]:
        assert island.contains(m.program_id) and island.member(m.program_id) == m
        assert island.niche_of(m.program_id) in island.niches()
    assert not island.contains("nobody") and island.member("nobody") is None
    if members:
        same_draws(island, int(rng.integers(1 << 30)), exclude=members[int(rng.integers(len(members)))].program_id)
        same_draws(island, int(rng.integers(1 << 30)), exclude="not-a-member")


@pytest.mark.parametrize("config", [
    IslandsConfig(signature_decimals=1),
    IslandsConfig(signature_decimals=1, max_members_per_niche=3),
    IslandsConfig(niche="map_elites", descriptor_bins=3, max_members_per_niche=2),
    IslandsConfig(signature_decimals=1, max_members_per_niche=2, max_niches=7),
], ids=["signature", "signature-3-per-niche", "map-elites-learned-bounds", "7-niches-at-most"])
def test_the_index_draws_exactly_what_walking_the_niches_draws(config):
    rng = np.random.default_rng(7)
    island = Island(0, config)
    for i in range(400):
        if i % 97 == 96:
            island.clear()
        scores = rng.integers(0, 6, size=2) / 10  # few signatures: niches fill up and truncate
        score = float(scores.sum() + (rng.integers(0, 3) / 100 if i % 5 else 0.0))  # ties, too
        code = "x" * int(rng.integers(1, 4))  # equal lengths: ties on rank_key as well
        desc = (float(rng.normal() * (1 + i / 50)),)  # widening: MAP-Elites re-bins
        island.add(Member(f"p{i}", score, code, 1, tuple(scores), desc))
        if i % 13 == 0:
            check(island, rng)
    check(island, rng)
    again = Island(0, config)
    again.restore(island.state())
    assert again.niches() == island.niches() and again.best() == island.best()
    same_draws(again, 5, exclude=island.members()[0].program_id)
    same_draws(island, 5, exclude=island.members()[0].program_id)


def test_migration_and_best_members_agree_with_sorting():
    rng = np.random.default_rng(3)
    islands = [Island(i, IslandsConfig(max_members_per_niche=2, signature_decimals=1)) for i in range(3)]
    for i in range(120):
        scores = tuple(rng.integers(0, 4, size=2) / 10)
        islands[i % 3].add(Member(f"p{i}", float(sum(scores)), "y" * int(rng.integers(1, 3)), 1, scores, ()))
    for island in islands:
        for k in (1, 2, 5):
            assert best_members(island, k) == sorted(island.members(), key=rank_key)[:k]
    ring_migration(islands, 2)
    for island in islands:
        assert island.best() == best_by_walking(island)


def test_on_a_tie_the_best_is_the_earlier_niches_as_a_walk_finds_it():
    island = Island(0, IslandsConfig())
    added = [("a1", 1.0, 0.0, "a1"), ("b1", 1.0, 1.0, "a1"),  # a later niche ties the best: the earlier stays
             ("b2", 2.0, 1.0, "b2"), ("a2", 2.0, 0.0, "a2"),  # an earlier niche catches up: it becomes the best
             ("c1", 2.0, 2.0, "a2")]
    for pid, score, signature, best in added:
        island.add(Member(pid, score, "xx", 1, (signature,), ()))
        assert island.best() == best_by_walking(island) and island.best().program_id == best, pid


def test_a_full_island_keeps_its_best_niches_and_refuses_worse_newcomers():
    island = Island(0, IslandsConfig(max_niches=5))
    rng = np.random.default_rng(11)
    added = []
    for i, score in enumerate(rng.normal(size=60)):
        member = Member(f"p{i}", float(score), "x", 1, (float(i),), ())  # each its own niche
        kept = island.add(member)
        added.append(member)
        best5 = sorted(added, key=rank_key)[:5]
        assert kept == (member in best5) and island.contains(member.program_id) == kept
        assert sorted(island.members(), key=rank_key) == best5 and island.best() == best5[0]
        assert island.niche_count() == len(island) == min(i + 1, 5)
    again = Island(0, IslandsConfig(max_niches=3))  # a resume with a lower bound keeps the best 3
    again.restore(island.state())
    assert again.members() == [m for m in island.members() if m in sorted(island.members(), key=rank_key)[:3]]
    tied = Island(0, IslandsConfig(max_niches=3))  # the best is the worst too: it is found again
    for i, code in enumerate(["x", "xxx", "xx", "xxxx"]):  # all score 1.0; the shortest code ranks first
        tied.add(Member(f"t{i}", 1.0, code, 1, (float(i),), ()))
        assert tied.best() == best_by_walking(tied)
    assert tied.best().program_id == "t2"


def test_a_full_island_refuses_a_weaker_migrant_and_migration_does_not_count_it():
    strong, weak = (Island(i, IslandsConfig(max_niches=2)) for i in range(2))
    for i, score in enumerate([5.0, 6.0]):
        strong.add(Member(f"s{i}", score, "x", 1, (float(i),), ()))
    weak.add(Member("w", 1.0, "x", 1, (9.0,), ()))
    moved = ring_migration([weak, strong], 1)  # weak's best goes to strong, strong's to weak
    assert [(dest, m.program_id) for dest, m in moved] == [(0, "s1")]
    assert not strong.contains("w") and len(strong) == 2


def test_a_snapshot_restored_under_a_lower_bound_says_how_many_niches_it_dropped():
    from islands.archipelago import Archipelago

    wide = Archipelago(IslandsConfig(count=2, max_niches=50), 0)
    for i in range(30):
        wide.add_result(i % 2, Member(f"p{i}", float(i), "x", 1, (float(i),), ()))
    assert Archipelago.from_msgpack(wide.to_msgpack(), IslandsConfig(count=2, max_niches=50)).dropped == 0
    narrow = Archipelago.from_msgpack(wide.to_msgpack(), IslandsConfig(count=2, max_niches=10))
    assert narrow.dropped == 10 and [len(island) for island in narrow.islands] == [10, 10]
    assert narrow.best() == wide.best()
