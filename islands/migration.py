"""Migration and reset across islands, as pure functions over explicit generators.

Migrants are copies: the sender keeps its members. Every function decides from a
snapshot of the islands taken before it moves anything, so the order in which
islands are visited never changes the outcome.
"""
from __future__ import annotations

import heapq

import numpy as np

from islands.population import Island, Member, rank_key


def best_members(island: Island, k: int) -> list[Member]:
    """The `k` best members of an island, best first (ties in the members' order)."""
    if k == 1:  # the usual case: the island keeps its best at hand
        best = island.best()
        return [best] if best is not None else []
    return heapq.nsmallest(k, island.members(), key=rank_key)


def _deliver(islands: list[Island], plan: list[tuple[int, Member]]) -> list[tuple[int, Member]]:
    """Copy each planned migrant to its destination; returns those that were new there and were kept
    (a full island keeps no migrant that scores below its worst niche)."""
    moved = []
    for dest, member in plan:
        if not islands[dest].contains(member.program_id):
            islands[dest].add(member)
            if islands[dest].contains(member.program_id):
                moved.append((dest, member))
    return moved


def ring_migration(islands: list[Island], k: int) -> list[tuple[int, Member]]:
    """Copy the best `k` of island i to island (i + 1) % n; returns (destination, member)."""
    n = len(islands)
    if n < 2:
        return []
    plan = [((i + 1) % n, m) for i, island in enumerate(islands) for m in best_members(island, k)]
    return _deliver(islands, plan)


def random_migration(islands: list[Island], rng: np.random.Generator, k: int) -> list[tuple[int, Member]]:
    """Copy the best `k` of each island to one other island drawn uniformly."""
    n = len(islands)
    if n < 2:
        return []
    plan = []
    for i, island in enumerate(islands):
        dest = (i + 1 + int(rng.integers(n - 1))) % n  # any island but i
        plan += [(dest, m) for m in best_members(island, k)]
    return _deliver(islands, plan)


def weakest_first(islands: list[Island], rng: np.random.Generator) -> list[int]:
    """Island indices from weakest best score to strongest; empty islands are weakest, ties random."""
    scores = np.array([b.score if (b := island.best()) else -np.inf for island in islands])
    return [int(i) for i in np.lexsort((rng.random(len(islands)), scores))]


def reset_weakest(islands: list[Island], rng: np.random.Generator) -> list[int]:
    """FunSearch's reset: clear the weaker half, reseed each from a random survivor's best.

    Returns the indices of the islands that were reset, weakest first.
    """
    order = weakest_first(islands, rng)
    doomed, survivors = order[:len(islands) // 2], order[len(islands) // 2:]
    founders = [b for i in survivors if (b := islands[i].best()) is not None]
    if not founders:
        return []
    for i in doomed:
        islands[i].clear()
        islands[i].add(founders[int(rng.integers(len(founders)))])
    return doomed
