"""Archive ingest: rows/s of batched `record()` against row-by-row inserts, and snapshot cost.

    python benchmarks/archive_ingest.py [--programs 20000] [--batch 100 1000]
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store.duckdb_archive import DuckDBArchive  # noqa: E402
from store.records import Candidate, EvalResult, Status  # noqa: E402


def pairs(n: int, run_id: str):
    now = time.time()
    for i in range(n):
        pid = f"p{i}"
        code = f"def policy(state, params):\n    return state['on_hand'] * 0 + {i}\n"
        yield (Candidate(pid, run_id, i % 4, i // 4, (f"p{i - 4}",) if i >= 4 else (), code,
                         "embedded:perturb_const", now),
               EvalResult(pid, "search", Status.OK, score=-1.0 - i * 1e-6, metrics={"cost": 4.2, "fill": 0.9},
                          instance_scores=(-1.0, -1.1, -0.9), descriptors=(0.9, 0.3), duration_s=0.5))


def batched(n: int, batch: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp, DuckDBArchive(Path(tmp) / "a.duckdb") as archive:
        archive.create_run("r", {}, "")
        items = list(pairs(n, "r"))
        start = time.perf_counter()
        for i in range(0, n, batch):
            archive.record(items[i:i + batch])
        rate = n / (time.perf_counter() - start)
        publish = statistics.median(archive.publish_snapshot(Path(tmp) / "snap.duckdb") for _ in range(5))
        return rate, publish


def row_by_row(n: int) -> float:
    with tempfile.TemporaryDirectory() as tmp, DuckDBArchive(Path(tmp) / "a.duckdb") as archive:
        archive.create_run("r", {}, "")
        start = time.perf_counter()
        for candidate, result in pairs(n, "r"):
            archive.con.execute("INSERT INTO programs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                [candidate.program_id, "r", candidate.island, candidate.generation,
                                 list(candidate.parent_ids), candidate.code, candidate.code_hash,
                                 candidate.mutator, candidate.created_at, 0])
            archive.con.execute("INSERT INTO evaluations (program_id, run_id, split, status, score, created_at) "
                                "VALUES (?, 'r', 'search', 'OK', ?, 0)", [result.program_id, result.score])
        return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=20000, help="programs (with one evaluation each) to ingest")
    parser.add_argument("--batch", type=int, nargs="+", default=[100, 1000], help="batch sizes to time")
    parser.add_argument("--row-by-row", type=int, default=2000, help="programs for the row-by-row contrast")
    args = parser.parse_args()
    print(f"{'method':<28}{'programs/s':>12}{'snapshot ms':>14}")
    for batch in args.batch:
        rate, publish = batched(args.programs, batch)
        print(f"{f'record(), batches of {batch}':<28}{rate:>12,.0f}{publish * 1e3:>14.1f}")
    print(f"{'row by row (execute)':<28}{row_by_row(args.row_by_row):>12,.0f}{'':>14}")
    print("each program row also writes its lineage edge and its evaluation row")


if __name__ == "__main__":
    main()
