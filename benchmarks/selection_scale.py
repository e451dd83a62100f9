"""The driver's population work per proposal as an island grows.

Every proposal draws a parent and its inspirations from an island, and the loop asks
for the best member on every pass. With signature niches (the default), nearly every
program that scores differently on some instance opens a niche of its own, and only
the weaker half of the islands is ever reset, so the best islands of a long run hold
thousands of niches. This script fills one island with N niches of 2 KB programs and
prints, per proposal, the microseconds of `Archipelago.next_parent` (parent and
inspirations), of `Archipelago.best` over 4 islands, and of adding one member, then the
size of the islands' snapshot (a run writes one every 3 s) and the time to pack it.
`islands.max_niches` (1,000 by default) bounds what a run reaches. Last, at that bound on
4 islands, the snapshot as a run writes it (members without their code, which the
archive holds) against one with every member's code, as it was: its size and the
milliseconds to pack it and to write it into a DuckDB archive, and what adding a member
to a full island costs (the new niche takes the worst one's place).

    python3 benchmarks/selection_scale.py [--niches 100 1000 10000 100000]
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.resume import islands_snapshot  # noqa: E402
from islands.archipelago import Archipelago  # noqa: E402
from islands.config import IslandsConfig  # noqa: E402
from islands.population import Island, Member  # noqa: E402
from store.duckdb_archive import DuckDBArchive  # noqa: E402


def filled(niches: int, seed: int = 0) -> Archipelago:
    """4 islands; island 0 holds `niches` niches of one member each (2 per-instance scores apiece)."""
    rng = np.random.default_rng(seed)
    arch = Archipelago(IslandsConfig(count=4, max_niches=1_000_000), seed + 1)  # no bound: the scale itself
    scores = rng.normal(size=(niches, 2)).round(3)
    for i, (a, b) in enumerate(scores):
        arch.add_result(0, Member(f"p{i}", float(a + b), "x" * 2000, 1, (float(a), float(b)), ()))
    for island in range(1, 4):
        arch.add_result(island, Member(f"s{island}", 0.0, "x" * 2000, 1, (0.0, 0.0), ()))
    return arch


def _add_worse(arch: Archipelago, i: int) -> None:
    """A new niche below every other, as most children of a long run are."""
    arch.add_result(0, Member(f"n{i}", -50.0 - i, "x" * 2000, 1, (-50.0 - i, 0.0), ()))


def per_call_us(fn, budget_s: float = 1.0, least: int = 20) -> float:
    calls, start = 0, time.perf_counter()
    while calls < least or time.perf_counter() - start < budget_s:
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--niches", type=int, nargs="+", default=[100, 1000, 10000, 100000])
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for n in args.niches:
        start = time.perf_counter()
        arch = filled(n)
        fill_s = time.perf_counter() - start
        niches = len(arch.islands[0].niches())
        parent = per_call_us(lambda arch=arch: arch.next_parent(0))
        best = per_call_us(arch.best)
        start = time.perf_counter()
        size = len(islands_snapshot(arch, 0))
        packed = time.perf_counter() - start
        counter = itertools.count()
        added = per_call_us(lambda arch=arch, counter=counter: _add_worse(arch, next(counter)))
        print(f"{niches:>7,} niches: next_parent (parent + 2 inspirations) {parent:8.1f} µs, best over 4 islands "
              f"{best:7.1f} µs, add a member {added:7.1f} µs; snapshot {size / 2**20:.1f} MiB packed in "
              f"{packed * 1000:.0f} ms (filling took {fill_s:.1f} s)", flush=True)
    at_bound()
    full_adds()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def full_adds() -> None:
    """Adding a member to a full island: each new niche takes the place of the worst, and the
    niches after it move up one place. As in a search that improves, the worst is the oldest,
    so every niche moves: the dearest case."""
    for bound in (1000, 10000):
        island = Island(0, IslandsConfig(max_niches=bound))
        for i in range(bound):
            island.add(Member(f"p{i}", float(i), "x", 1, (float(i),), ()))
        counter = itertools.count(bound)

        def better(island=island, counter=counter):
            i = next(counter)
            island.add(Member(f"p{i}", float(i), "x", 1, (float(i),), ()))

        print(f"adding a member to a full island of {bound:,} niches (it takes the worst niche's place): "
              f"{per_call_us(better):.1f} µs", flush=True)


def at_bound(writes: int = 20) -> None:
    """A run's snapshot with 4 full islands, without and with the members' code."""
    rng = np.random.default_rng(2)
    arch = Archipelago(IslandsConfig(count=4), 1)
    for island in range(4):
        for i in range(arch.config.max_niches):
            a, b = rng.normal(size=2).round(3)
            code = "".join(chr(97 + int(x)) for x in rng.integers(0, 26, 2000))
            arch.add_result(island, Member(f"p{island}-{i}", float(a + b), code, 1, (float(a), float(b)), ()))
    with tempfile.TemporaryDirectory() as tmp:
        for label, pack in (("as a run writes it, no code", lambda seq: islands_snapshot(arch, seq)),
                            ("with every member's code", lambda seq: msgpack.packb(
                                {"version": 2, "seq": seq, "islands": arch.to_msgpack()}))):
            archive = DuckDBArchive(Path(tmp) / f"{len(label)}.duckdb")
            archive.create_run("r", {})
            packed, written = [], []
            for seq in range(writes):
                start = time.perf_counter()
                blob = pack(seq)
                middle = time.perf_counter()
                archive.save_snapshot("r", blob)
                packed.append(middle - start)
                written.append(time.perf_counter() - middle)
            archive.close()
            print(f"snapshot of 4 islands x {arch.config.max_niches:,} niches, {label}: {len(blob) / 2**20:.2f} MiB, "
                  f"packed in {np.median(packed) * 1000:.0f} ms, written in {np.median(written) * 1000:.0f} ms "
                  f"(medians of {writes})", flush=True)


if __name__ == "__main__":
    main()
