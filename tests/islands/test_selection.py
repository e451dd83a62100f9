"""Parent selection: greedy at low temperature, spread at high; clear errors when empty."""
from collections import Counter

import numpy as np
import pytest

from islands.config import IslandsConfig
from islands.population import Island, Member
from islands.selection import select_inspirations, select_parent


def island_with(scores, max_members=1):
    island = Island(3, IslandsConfig(max_members_per_niche=max_members))
    for i, s in enumerate(scores):
        island.add(Member(f"p{i}", s, "x" * (i + 1), 1, (float(i),), ()))
    return island


def test_near_zero_temperature_picks_best_niche():
    island, rng = island_with([1.0, 5.0, 3.0, 4.9]), np.random.default_rng(0)
    picks = {select_parent(island, rng, 1e-4).program_id for _ in range(200)}
    assert picks == {"p1"}


def test_large_temperature_spreads_over_niches():
    island, rng = island_with([1.0, 5.0, 3.0, 4.9]), np.random.default_rng(0)
    counts = Counter(select_parent(island, rng, 100.0).program_id for _ in range(2000))
    assert set(counts) == {"p0", "p1", "p2", "p3"}
    assert min(counts.values()) > 300


def test_within_niche_shorter_code_is_preferred():
    island = Island(0, IslandsConfig(max_members_per_niche=2))
    island.add(Member("long", 1.0, "y" * 400, 1, (1.0,), ()))
    island.add(Member("short", 1.0, "y", 1, (1.0,), ()))
    rng = np.random.default_rng(1)
    counts = Counter(select_parent(island, rng, 0.1).program_id for _ in range(2000))
    assert counts["short"] > counts["long"] > 0


def test_empty_island_gives_clear_error():
    with pytest.raises(ValueError, match="island 3 is empty"):
        select_parent(island_with([]), np.random.default_rng(0), 0.1)


def test_inspirations_are_distinct_from_other_niches_and_exclude_parent():
    island, rng = island_with([1.0, 2.0, 3.0, 4.0]), np.random.default_rng(0)
    for _ in range(50):
        picks = select_inspirations(island, rng, 2, exclude_id="p3")
        ids = [m.program_id for m in picks]
        assert len(ids) == 2 == len(set(ids)) and "p3" not in ids


def test_inspirations_fill_from_parent_niche_when_needed():
    island = Island(0, IslandsConfig(max_members_per_niche=3))
    for pid in "abc":
        island.add(Member(pid, 1.0, pid, 1, (1.0,), ()))
    picks = select_inspirations(island, np.random.default_rng(0), 5, exclude_id="a")
    assert sorted(m.program_id for m in picks) == ["b", "c"]
