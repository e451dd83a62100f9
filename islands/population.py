"""Members and islands: one island is a set of niches, each keeping its best members."""
from __future__ import annotations

import math
from dataclasses import dataclass

from islands.config import IslandsConfig
from islands.niches import DescriptorGrid, signature_key


@dataclass(frozen=True)
class Member:
    """One evaluated program as the population sees it (score: higher is better)."""

    program_id: str
    score: float
    code: str
    generation: int
    instance_scores: tuple = ()
    descriptors: tuple = ()


def rank_key(member: Member) -> tuple:
    """Sort key putting the better member first: higher score, then shorter code."""
    return (-member.score, len(member.code))


class Island:
    """A population split into niches (score-signature clusters or MAP-Elites cells).

    Each niche keeps at most `max_members_per_niche` members, best first. The
    island never advances its own generation: the caller does, via `advance`.
    """

    def __init__(self, island_id: int, config: IslandsConfig):
        self.island_id = island_id
        self.config = config
        self.generation = 0
        self._niches: dict[tuple, list[Member]] = {}
        self._ids: set[str] = set()  # program ids of the members, so `contains` does not walk them
        self._grid = DescriptorGrid(config.descriptor_bins, config.descriptor_bounds)

    def add(self, member: Member) -> bool:
        """Offer `member` to its niche; True if it became that niche's best.

        A program already on the island is ignored (migration may offer it twice).
        """
        if not math.isfinite(member.score):
            raise ValueError(f"member {member.program_id} has non-finite score {member.score}")
        if self.contains(member.program_id):
            return False
        if self.config.niche == "map_elites" and self._grid.observe(member.descriptors):
            self._rebin()
        return self._insert(self._key(member), member)

    def _insert(self, key: tuple, member: Member) -> bool:
        niche = self._niches.setdefault(key, [])
        niche.append(member)
        self._ids.add(member.program_id)
        niche.sort(key=rank_key)
        for dropped in niche[self.config.max_members_per_niche:]:
            self._ids.discard(dropped.program_id)
        del niche[self.config.max_members_per_niche:]
        return niche[0] is member

    def _key(self, member: Member) -> tuple:
        if self.config.niche == "map_elites":
            return self._grid.key(member.descriptors)
        return signature_key(member.instance_scores, member.score, self.config.signature_decimals)

    def _rebin(self) -> None:
        """Learned bounds widened: put every member back into its new cell, in order."""
        old, self._niches, self._ids = self.members(), {}, set()
        for member in old:
            self._insert(self._key(member), member)

    def contains(self, program_id: str) -> bool:
        return program_id in self._ids

    def best(self) -> Member | None:
        """The best member of the island, or None when it is empty."""
        bests = [niche[0] for niche in self._niches.values()]
        return min(bests, key=rank_key) if bests else None

    def members(self) -> list[Member]:
        """Every member, niche by niche in the order the niches appeared."""
        return [m for niche in self._niches.values() for m in niche]

    def niches(self) -> dict[tuple, list[Member]]:
        """Niche key -> its members, best first (a copy: editing it changes nothing)."""
        return {key: list(niche) for key, niche in self._niches.items()}

    def niche_of(self, program_id: str) -> tuple | None:
        """The key of the niche holding `program_id`, or None if it is not here."""
        for key, niche in self._niches.items():
            if any(m.program_id == program_id for m in niche):
                return key
        return None

    def advance(self) -> int:
        """Count one more generation on this island; returns the new count."""
        self.generation += 1
        return self.generation

    def clear(self) -> None:
        """Drop every member (a reset); the generation count and learned bounds stay."""
        self._niches, self._ids = {}, set()

    def __len__(self) -> int:
        return sum(len(niche) for niche in self._niches.values())

    def state(self) -> dict:
        """Plain data for snapshots, keeping niche order so sampling continues identically."""
        return {"generation": self.generation, "grid": self._grid.state(),
                "niches": [[list(key), [member_state(m) for m in niche]] for key, niche in self._niches.items()]}

    def restore(self, state: dict) -> None:
        self.generation = state["generation"]
        self._grid.restore(state["grid"])
        self._niches = {tuple(key): [member_from_state(m) for m in niche] for key, niche in state["niches"]}
        self._ids = {m.program_id for m in self.members()}


def member_state(member: Member) -> list:
    """A member as a plain list (msgpack-friendly)."""
    return [member.program_id, member.score, member.code, member.generation,
            list(member.instance_scores), list(member.descriptors)]


def member_from_state(state: list) -> Member:
    pid, score, code, generation, instance_scores, descriptors = state
    return Member(pid, score, code, generation, tuple(instance_scores), tuple(descriptors))
