"""Members and islands: one island is a set of niches, each keeping its best members."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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

    Each niche keeps at most `max_members_per_niche` members, best first, and the island
    at most `max_niches` niches: past it, a new niche takes the place of the one whose best
    scores worst, or is not kept when it scores below that. The island never advances its
    own generation: the caller does, via `advance`.

    The best island of a long run holds thousands of niches, and every proposal draws
    from one, so the island keeps what a draw needs up to date as members come and
    go: each niche's best score in one array (in the niches' order), each member's
    niche, the member count and the best niche. A draw then costs a few vectorised
    passes, not a walk over every niche and member (`benchmarks/selection_scale.py`).
    """

    def __init__(self, island_id: int, config: IslandsConfig):
        self.island_id = island_id
        self.config = config
        self.generation = 0
        self._grid = DescriptorGrid(config.descriptor_bins, config.descriptor_bounds)
        self._reset_index()

    def _reset_index(self) -> None:
        self._niches: dict[tuple, list[Member]] = {}
        self._keys: list[tuple] = []  # niche keys in the niches' order
        # a niche's place in that order is found by its birth number (niches keep their order, so
        # the births are ascending): evicting one then moves no Python object, only two arrays
        self._birth: dict[tuple, int] = {}  # niche key -> its birth number
        self._births = np.empty(16, dtype=np.int64)  # birth numbers, by slot
        self._born = 0
        self._scores = np.empty(16)  # each niche's best score, by slot (the first len(self._keys) are used)
        self._where: dict[str, tuple] = {}  # program id -> its niche's key
        self._best = -1  # slot of the best niche, -1 when empty

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
        niche = self._niches.get(key)
        if niche is None:
            if len(self._keys) >= self.config.max_niches:  # full: the worst niche makes room, or none is made
                worst = int(np.argmin(self.niche_scores()))
                if member.score < self._scores[worst]:
                    return False
                self._evict(worst)
            niche = self._niches[key] = []
            if len(self._keys) == len(self._scores):
                self._scores = np.concatenate([self._scores, np.empty(len(self._scores))])
                self._births = np.concatenate([self._births, np.empty(len(self._births), dtype=np.int64)])
            self._births[len(self._keys)] = self._birth[key] = self._born
            self._born += 1
            self._keys.append(key)
        niche.append(member)
        self._where[member.program_id] = key
        niche.sort(key=rank_key)
        for dropped in niche[self.config.max_members_per_niche:]:
            del self._where[dropped.program_id]
        del niche[self.config.max_members_per_niche:]
        if niche[0] is not member:
            return False
        slot = self._slot(key)
        self._scores[slot] = member.score
        # a niche's best only ever gets better, so the island's best is the better of the two;
        # on a tie the earlier niche stays first, as a walk over the niches in order would find
        if self._best < 0 or (rank_key(member), slot) < (rank_key(self._niches[self._keys[self._best]][0]),
                                                         self._best):
            self._best = slot
        return True

    def _evict(self, slot: int) -> None:
        """Drop the niche at `slot` and its members; the other niches keep their order."""
        key = self._keys.pop(slot)
        for m in self._niches.pop(key):
            del self._where[m.program_id]
        del self._birth[key]
        count = len(self._keys)
        self._scores[slot:count] = self._scores[slot + 1:count + 1]
        self._births[slot:count] = self._births[slot + 1:count + 1]
        if self._best > slot:
            self._best -= 1
        elif self._best == slot:  # the worst is the best only when every niche scores the same: find it again
            self._best = min(range(count), key=lambda i: (rank_key(self.niche_at(i)[0]), i)) if count else -1

    def _key(self, member: Member) -> tuple:
        if self.config.niche == "map_elites":
            return self._grid.key(member.descriptors)
        return signature_key(member.instance_scores, member.score, self.config.signature_decimals)

    def _rebin(self) -> None:
        """Learned bounds widened: put every member back into its new cell, in order."""
        old = self.members()
        self._reset_index()
        for member in old:
            self._insert(self._key(member), member)

    def contains(self, program_id: str) -> bool:
        return program_id in self._where

    def member(self, program_id: str) -> Member | None:
        """The member with this program id, or None if it is not here."""
        key = self._where.get(program_id)
        return None if key is None else next(m for m in self._niches[key] if m.program_id == program_id)

    def best(self) -> Member | None:
        """The best member of the island, or None when it is empty."""
        return self._niches[self._keys[self._best]][0] if self._best >= 0 else None

    def members(self) -> list[Member]:
        """Every member, niche by niche in the order the niches appeared."""
        return [m for niche in self._niches.values() for m in niche]

    def niches(self) -> dict[tuple, list[Member]]:
        """Niche key -> its members, best first (a copy: editing it changes nothing)."""
        return {key: list(niche) for key, niche in self._niches.items()}

    def niche_count(self) -> int:
        return len(self._keys)

    def niche_scores(self) -> np.ndarray:
        """Each niche's best score, in the niches' order (read-only view)."""
        view = self._scores[:len(self._keys)]
        view.flags.writeable = False
        return view

    def niche_at(self, slot: int) -> list[Member]:
        """The members of the niche at `slot` in the niches' order, best first (do not edit)."""
        return self._niches[self._keys[slot]]

    def slot_of(self, program_id: str) -> int | None:
        """The place, in the niches' order, of the niche holding `program_id`; None if it is not here."""
        key = self._where.get(program_id)
        return None if key is None else self._slot(key)

    def _slot(self, key: tuple) -> int:
        return int(np.searchsorted(self._births[:len(self._keys)], self._birth[key]))

    def niche_of(self, program_id: str) -> tuple | None:
        """The key of the niche holding `program_id`, or None if it is not here."""
        return self._where.get(program_id)

    def advance(self) -> int:
        """Count one more generation on this island; returns the new count."""
        self.generation += 1
        return self.generation

    def clear(self) -> None:
        """Drop every member (a reset); the generation count and learned bounds stay."""
        self._reset_index()

    def __len__(self) -> int:
        return len(self._where)

    def state(self, code: bool = True) -> dict:
        """Plain data for snapshots, keeping niche order so sampling continues identically;
        without `code`, the members' code is left out (the caller keeps it elsewhere)."""
        return {"generation": self.generation, "grid": self._grid.state(),
                "niches": [[list(key), [member_state(m, code) for m in niche]] for key, niche in self._niches.items()]}

    def restore(self, state: dict, codes: dict[str, str] | None = None) -> int:
        """Back to a `state()`, taking left-out code from `codes` (program id -> code); returns how
        many of its niches `max_niches` did not leave room for.

        Each member's niche is found again under this island's config, in stored order (niche by
        niche, best first): under the config the state was saved with that is its stored niche, in
        its stored order; a resume that changed how niches are formed (`niche`, the descriptor bins
        or bounds, `signature_decimals`) regroups the members, where the stored keys would mix two
        layouts (and a MAP-Elites grid never fed their descriptors raised IndexError)."""
        self.generation = state["generation"]
        self._grid.restore(state["grid"])
        self._reset_index()
        members = [member_from_state(m, codes) for _, niche in state["niches"] for m in niche]
        if self.config.niche == "map_elites":
            for member in members:
                self._grid.observe(member.descriptors)
        keys = [self._key(member) for member in members]
        for key, member in zip(keys, members):
            self._insert(key, member)
        return len(set(keys)) - len(self._keys)


def member_state(member: Member, code: bool = True) -> list:
    """A member as a plain list (msgpack-friendly); its code None when left out."""
    return [member.program_id, member.score, member.code if code else None, member.generation,
            list(member.instance_scores), list(member.descriptors)]


def member_from_state(state: list, codes: dict[str, str] | None = None) -> Member:
    pid, score, code, generation, instance_scores, descriptors = state
    if code is None:
        code = (codes or {}).get(pid)
        if code is None:
            raise KeyError(f"member {pid}: its code was left out of the snapshot and is not in the archive")
    return Member(pid, score, code, generation, tuple(instance_scores), tuple(descriptors))
