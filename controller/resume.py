"""The islands of a run across stops: periodic snapshots and what a resume rebuilds.

Every few seconds the driver saves its islands (generator included) with the
commit number of the last program they have seen. A resume restores the latest
snapshot and replays only the programs committed after it, reading the code of
those alone; replaying is one way (`Archipelago.replay`), so that gives the islands a
full replay from the snapshot's state would. Without a snapshot (an archive from
before snapshots, or a crash before the first) every program is replayed, streamed
from the archive a chunk at a time, so only the islands' members stay in memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import msgpack

from islands.archipelago import Archipelago

SNAPSHOT_VERSION = 3  # 3: members without their code (the archive has it); 2: with it, read too
STARTS = ("seed", "warm-start")  # joined every island: the seed, a warm start's elites (controller.memory.WARM)


@dataclass(frozen=True)
class Restored:
    """How a resume rebuilt the islands: from which snapshot seq, replaying how many rows."""

    islands: Archipelago
    snapshot_seq: int | None  # None: no usable snapshot, every row was replayed
    replayed: int


def islands_snapshot(islands: Archipelago, seq: int) -> bytes:
    """The islands after every program up to commit number `seq`, as bytes for the archive.

    The members' code is left out: it is in the archive's programs, committed in the same
    transaction as the snapshot, and a resume reads it back for the members alone. With
    it, a long run's snapshot was megabytes written every few seconds."""
    return msgpack.packb({"version": SNAPSHOT_VERSION, "seq": seq, "islands": islands.to_msgpack(code=False)})


def load_islands(archive, run_id: str, config, done: int) -> Restored:
    """The run's islands: its latest snapshot plus the rows after it, or a full replay.

    `done` (the run's committed search evaluations) seeds a full replay's generator,
    so a resumed run does not repeat the random decisions of its start.
    """
    saved = _snapshot(archive.load_snapshot(run_id), config, done, lambda ids: archive.codes(run_id, ids))
    if saved is None:
        islands, after = Archipelago(config.islands, config.run.seed + done), 0
    else:
        islands, after = saved
    rows = _Counted(expand_seeds(archive.search_rows(run_id, after_seq=after), config.islands.count))
    islands.replay(rows)
    return Restored(islands, None if saved is None else after, rows.count)


def expand_seeds(rows: Iterable[dict], count: int) -> Iterator[dict]:
    """Rows as the islands saw them live: the seed program (and a warm start's elites) joined every island."""
    for row in rows:
        if row["mutator"] in STARTS:
            yield from (dict(row, island=i) for i in range(count))
        else:
            yield row


def _snapshot(blob: bytes | None, config, done: int, fetch_code) -> tuple[Archipelago, int] | None:
    """(islands, seq they cover) from a saved snapshot, or None when there is none usable (then
    every row is replayed): also when a member's code is not in the archive."""
    if not blob:
        return None
    try:
        saved = msgpack.unpackb(blob)
        islands = Archipelago.from_msgpack(saved["islands"], config.islands, fetch_code)
        if saved.get("version") in (2, SNAPSHOT_VERSION):
            return islands, int(saved["seq"])
        return (islands, 1 << 62) if saved.get("rows") == done else None  # version 1: a clean stop only
    except (ValueError, KeyError, TypeError, msgpack.UnpackException):
        return None


class _Counted:
    """An iterator that counts the rows (seeds once) it hands out."""

    def __init__(self, rows: Iterator[dict]):
        self.rows, self.count = rows, 0

    def __iter__(self):
        for row in self.rows:
            self.count += row["mutator"] not in STARTS or row["island"] == 0
            yield row
