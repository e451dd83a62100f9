"""Archipelago: determinism by seed, schedule events, snapshots and rebuild from rows."""
import pytest

from islands.archipelago import Archipelago
from islands.config import IslandsConfig
from islands.population import Member

CONFIG = IslandsConfig(count=3, migrate_every=2, reset_every=4, max_members_per_niche=2)


def drive(arch, steps, start=0):
    """A toy search: children score a deterministic function of the parent; returns choices and rows."""
    choices, rows = [], []
    for step in range(start, start + steps):
        island = arch.pick_island()
        parent, inspirations = arch.next_parent(island)
        choices.append((island, parent.program_id, tuple(m.program_id for m in inspirations)))
        score = parent.score + ((step * 7919) % 13 - 6) / 3
        child = Member(f"c{step}", score, parent.code + "+", step + 1, (round(score) % 4,), ())
        status = "OK" if step % 5 else "FAILED"
        if status == "OK":
            arch.add_result(island, child)
        rows.append(dict(program_id=child.program_id, island=island, generation=child.generation, code=child.code,
                         status=status, score=score if status == "OK" else None,
                         instance_scores=list(child.instance_scores), descriptors=[]))
        arch.on_generation(island)
    return choices, rows


def seeded(seed, config=CONFIG):
    arch = Archipelago(config, seed)
    seed_rows = []
    for i in range(config.count):
        arch.add_result(i, Member("seed", 0.0, "s", 0, (0,), ()))
        seed_rows.append(dict(program_id="seed", island=i, generation=0, code="s", status="OK", score=0.0,
                              instance_scores=[0], descriptors=[]))
    return arch, seed_rows


def test_same_seed_same_choices_and_different_seeds_differ():
    assert drive(seeded(7)[0], 60)[0] == drive(seeded(7)[0], 60)[0]
    assert drive(seeded(7)[0], 60)[0] != drive(seeded(8)[0], 60)[0]


def test_pick_island_is_round_robin():
    arch = Archipelago(CONFIG, 0)
    assert [arch.pick_island() for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_events_fire_on_global_generation_boundaries():
    arch, _ = seeded(0)
    events = [arch.on_generation(i % 3) for i in range(12)]
    fired = [(n, e) for n, es in enumerate(events) for e in es]
    assert [n for n, _ in fired] == [5, 11, 11]
    assert "ring migration" in fired[0][1] and "reset islands" in fired[2][1]
    assert [island.generation for island in arch.islands] == [4, 4, 4]


def test_temperature_anneals_and_restarts_each_period():
    arch = Archipelago(IslandsConfig(parent_temperature=1.0, temperature_decay_evals=4), 0)
    temps = []
    for _ in range(5):
        temps.append(arch.temperature())
        arch.on_generation(0)
    assert temps == [1.0, 0.75, 0.5, 0.25, 1.0]


def test_msgpack_round_trip_continues_same_decisions():
    original, _ = seeded(3)
    drive(original, 25)
    restored = Archipelago.from_msgpack(original.to_msgpack(), CONFIG)
    assert restored.island_bests() == original.island_bests()
    assert drive(restored, 30, start=25)[0] == drive(original, 30, start=25)[0]
    assert restored.rng.integers(2**31) == original.rng.integers(2**31)


def test_msgpack_rejects_mismatched_config():
    blob = seeded(0)[0].to_msgpack()
    with pytest.raises(ValueError, match="does not match"):
        Archipelago.from_msgpack(blob, IslandsConfig(count=5))


def test_rebuild_from_rows_reproduces_island_bests():
    config = IslandsConfig(count=3, migrate_every=3, reset_every=0, max_members_per_niche=2)
    arch, seed_rows = seeded(11, config)
    _, rows = drive(arch, 40)
    rebuilt = Archipelago.rebuild(config, 99, seed_rows + rows)
    assert rebuilt.island_bests() == arch.island_bests()
    assert rebuilt.best() == arch.best()
    assert [i.generation for i in rebuilt.islands] == [i.generation for i in arch.islands]
    assert rebuilt.results_seen == 40


def test_empty_archipelago_errors_clearly():
    arch = Archipelago(CONFIG, 0)
    assert arch.best() is None and arch.island_bests() == [None, None, None]
    with pytest.raises(ValueError, match="island 0 is empty"):
        arch.next_parent(0)
    with pytest.raises(ValueError, match="does not exist"):
        arch.add_result(9, Member("a", 1.0, "x", 0))


@pytest.mark.parametrize("changed", [
    {"niche": "map_elites"},
    {"niche": "map_elites", "descriptor_bins": 2, "descriptor_bounds": [(0, 1), (0, 4)]},
    {"signature_decimals": 0},
])
def test_a_snapshot_restored_under_another_niche_layout_regroups_its_members(changed):
    """A resume's `--set islands.niche=...` (or new bins, bounds, rounding) puts every member in its niche
    under the new layout, as a run begun with it would have: no IndexError, no mix of stored and new keys."""
    saved = Archipelago(IslandsConfig(count=2, max_members_per_niche=10), 0)
    for i in range(12):
        saved.add_result(i % 2, Member(f"p{i}", float(i), "x", 1, (i / 10, 0.25), (i / 12, float(i % 4))))
    config = IslandsConfig(count=2, max_members_per_niche=10, **changed)
    restored = Archipelago.from_msgpack(saved.to_msgpack(), config)
    fresh = Archipelago(config, 0)
    for i, island in enumerate(saved.islands):
        for m in island.members():
            fresh.add_result(i, m)
    for new, built in zip(restored.islands, fresh.islands):
        assert {k: sorted(m.program_id for m in v) for k, v in new.niches().items()} == \
               {k: sorted(m.program_id for m in v) for k, v in built.niches().items()}
    child = Member("c", 20.0, "x", 2, (0.5, 0.25), (0.5, 1.0))
    assert restored.add_result(0, child) and restored.best() == child
    assert Archipelago.from_msgpack(restored.to_msgpack(), config).to_msgpack() == restored.to_msgpack()
