"""Ring and random migration copy bests; reset clears the weaker half from survivors."""
import numpy as np

from islands.config import IslandsConfig
from islands.migration import random_migration, reset_weakest, ring_migration
from islands.population import Island, Member


def islands_with(best_scores):
    config = IslandsConfig(count=len(best_scores), max_members_per_niche=5)
    islands = [Island(i, config) for i in range(len(best_scores))]
    for i, s in enumerate(best_scores):
        islands[i].add(Member(f"i{i}-best", s, "x", 1, (float(i),), ()))
        islands[i].add(Member(f"i{i}-low", s - 10, "x", 1, (float(i) + 0.5,), ()))
    return islands


def test_ring_migration_moves_best_to_next_island():
    islands = islands_with([1.0, 2.0, 3.0])
    moved = ring_migration(islands, 1)
    assert sorted((d, m.program_id) for d, m in moved) == [(0, "i2-best"), (1, "i0-best"), (2, "i1-best")]
    assert islands[0].best().program_id == "i2-best"
    assert islands[0].contains("i0-best")  # the sender keeps its copy
    assert ring_migration(islands, 0) == []


def test_random_migration_never_sends_to_self():
    islands = islands_with([1.0, 2.0, 3.0, 4.0])
    moved = random_migration(islands, np.random.default_rng(5), 1)
    assert len(moved) == 4
    for dest, member in moved:
        assert not member.program_id.startswith(f"i{dest}-")


def test_reset_clears_weaker_half_and_reseeds_from_survivors():
    islands = islands_with([1.0, 9.0, 2.0, 8.0])
    reset = reset_weakest(islands, np.random.default_rng(0))
    assert sorted(reset) == [0, 2]
    for i in reset:
        assert len(islands[i]) == 1
        assert islands[i].best().program_id in {"i1-best", "i3-best"}
    assert islands[1].best().program_id == "i1-best" and len(islands[1]) == 2


def test_reset_ties_are_broken_by_rng():
    outcomes = set()
    for seed in range(20):
        islands = islands_with([1.0, 1.0])
        outcomes.add(tuple(reset_weakest(islands, np.random.default_rng(seed))))
    assert outcomes == {(0,), (1,)}
