"""The archipelago: all islands, one seeded generator, and the schedule that mixes them.

It is the only object the run loop talks to for search decisions. Every random
choice draws from its single `numpy.random.Generator`, and a snapshot carries
that generator's state, so a restored archipelago decides exactly as the
original would have.
"""
from __future__ import annotations

import json
from typing import Callable, Iterable

import msgpack
import numpy as np

from islands.config import IslandsConfig
from islands.migration import random_migration, reset_weakest, ring_migration
from islands.population import Island, Member
from islands.selection import select_inspirations, select_parent

SNAPSHOT_VERSION = 2  # 2: a member's code may be left out (None); 1 is read too


class Archipelago:
    """Islands plus their schedule: round-robin turns, annealed selection, migration, resets."""

    def __init__(self, config: IslandsConfig, seed: int):
        self.config = config
        self.rng = np.random.default_rng(seed)
        self.islands = [Island(i, config) for i in range(config.count)]
        self.results_seen = 0  # results passed to on_generation, failed ones included
        self._turn = 0
        self.dropped = 0  # niches of a restored snapshot that `max_niches` left no room for

    def add_result(self, island_id: int, member: Member) -> bool:
        """Add an evaluated program to an island; True if it became its niche's best."""
        return self._island(island_id).add(member)

    def _island(self, island_id: int) -> Island:
        if not 0 <= island_id < len(self.islands):
            raise ValueError(f"island {island_id} does not exist; there are {len(self.islands)} (0..{len(self.islands) - 1})")
        return self.islands[island_id]

    def temperature(self) -> float:
        """FunSearch's annealing: T * (1 - (n % period) / period) after n results."""
        period = self.config.temperature_decay_evals
        return self.config.parent_temperature * (1 - (self.results_seen % period) / period)

    def next_parent(self, island_id: int) -> tuple[Member, list[Member]]:
        """A parent from the island and up to `inspirations` other members to show beside it."""
        island = self._island(island_id)
        parent = select_parent(island, self.rng, self.temperature())
        return parent, select_inspirations(island, self.rng, self.config.inspirations, parent.program_id)

    def pick_island(self) -> int:
        """The island whose turn it is; plain round robin, so it uses no randomness."""
        island_id = self._turn % len(self.islands)
        self._turn += 1
        return island_id

    def on_generation(self, island_id: int) -> list[str]:
        """Count one result of an island; migrate or reset on global generation boundaries.

        The global generation is the number of results divided by the number of
        islands, so with round-robin turns it advances once every island has had one.
        """
        self._island(island_id).advance()
        self.results_seen += 1
        if self.results_seen % len(self.islands):
            return []
        generation = self.results_seen // len(self.islands)
        events = []
        if self.config.migration != "none" and generation % self.config.migrate_every == 0:
            events.append(self._migrate(generation))
        if self.config.reset_every and generation % self.config.reset_every == 0:
            events.append(self._reset(generation))
        return events

    def _migrate(self, generation: int) -> str:
        if self.config.migration == "ring":
            moved = ring_migration(self.islands, self.config.migrants)
        else:
            moved = random_migration(self.islands, self.rng, self.config.migrants)
        return f"generation {generation}: {self.config.migration} migration moved {len(moved)} member(s)"

    def _reset(self, generation: int) -> str:
        reset = reset_weakest(self.islands, self.rng)
        return f"generation {generation}: reset islands {reset}"

    def best(self) -> Member | None:
        """The best member over all islands, or None before any result."""
        bests = [b for b in self.island_bests_members() if b is not None]
        return max(bests, key=lambda m: (m.score, -len(m.code))) if bests else None

    def island_bests_members(self) -> list[Member | None]:
        return [island.best() for island in self.islands]

    def island_bests(self) -> list[float | None]:
        """Each island's best score, None for an empty island."""
        return [b.score if b else None for b in self.island_bests_members()]

    # --- snapshots ------------------------------------------------------------
    def to_msgpack(self, code: bool = True) -> bytes:
        """The whole state, generator included, as msgpack bytes; without `code`, the members' code
        is left out (a run's snapshot: the archive holds every member's code)."""
        return msgpack.packb({
            "version": SNAPSHOT_VERSION, "count": len(self.islands),
            "rng": json.dumps(self.rng.bit_generator.state),  # 128-bit ints do not fit msgpack
            "results_seen": self.results_seen, "turn": self._turn,
            "islands": [island.state(code) for island in self.islands]})

    @classmethod
    def from_msgpack(cls, blob: bytes, config: IslandsConfig,
                     fetch_code: Callable[[list[str]], dict[str, str]] | None = None) -> Archipelago:
        """Restore a snapshot made by `to_msgpack` under the same islands config; `fetch_code` gives
        the code left out of it (program ids -> their code)."""
        state = msgpack.unpackb(blob)
        if state.get("version") not in (1, SNAPSHOT_VERSION) or state["count"] != config.count:
            raise ValueError(f"snapshot (version {state.get('version')}, {state.get('count')} islands) does not "
                             f"match this config ({config.count} islands, version {SNAPSHOT_VERSION})")
        left_out = sorted({m[0] for island in state["islands"] for _, niche in island["niches"] for m in niche
                           if m[2] is None})
        codes = fetch_code(left_out) if left_out and fetch_code is not None else {}
        archipelago = cls(config, seed=0)
        archipelago.rng.bit_generator.state = json.loads(state["rng"])
        archipelago.results_seen, archipelago._turn = state["results_seen"], state["turn"]
        archipelago.dropped = sum(island.restore(island_state, codes)
                                  for island, island_state in zip(archipelago.islands, state["islands"]))
        return archipelago

    @classmethod
    def rebuild(cls, config: IslandsConfig, seed: int, rows: Iterable[dict]) -> "Archipelago":
        """Rebuild from archive rows in insertion order, as after a crash (see `replay`).

        Random decisions draw from a fresh generator, so they may differ from the
        original run's; the populations' shape is what is reproduced.
        """
        return cls(config, seed).replay(rows)

    def replay(self, rows: Iterable[dict]) -> "Archipelago":
        """Apply archive rows in insertion order, as they happened live; returns self.

        OK rows join their island. Rows with generation > 0 (everything but the
        seed program) count as results, as they did live, so the generation
        counters, the temperature schedule, migrations and resets are replayed.
        Replaying rows[k:] on a snapshot taken after rows[:k] gives the same state
        as replaying all of them.
        """
        for row in rows:
            if _status(row) == "OK" and row.get("score") is not None:
                self.add_result(int(row["island"]), _row_member(row))
            if int(row["generation"]) > 0:
                self.on_generation(int(row["island"]))
        return self


def _status(row: dict) -> str:
    status = row["status"]
    return getattr(status, "value", status)


def _row_member(row: dict) -> Member:
    return Member(row["program_id"], float(row["score"]), row["code"], int(row["generation"]),
                  tuple(row.get("instance_scores") or ()), tuple(row.get("descriptors") or ()))
