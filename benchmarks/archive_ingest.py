"""Archive ingest: rows/s of batched `record()` against row-by-row inserts, and the reads of a resume.

    python benchmarks/archive_ingest.py [--programs 20000] [--batch 100 1000] [--row-by-row 2000]

Each program is one (Candidate, EvalResult) pair: one program row, one lineage edge
and one evaluation row, so rows/s is three times programs/s. The row-by-row contrast
writes the same three rows per program with `executemany`, in one transaction. The
reads are the ones a resume makes. `benchmarks/archive_scale.py` takes all of this
to a million programs.
"""
import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store.duckdb_archive import DuckDBArchive  # noqa: E402
from store.hash_index import id_hash  # noqa: E402
from store.records import Candidate, EvalResult, Status  # noqa: E402


def pairs(n: int, run_id: str):
    now = time.time()
    for i in range(n):
        pid = f"p{i}"
        code = f"def policy(state, params):\n    return state['on_hand'] * 0 + {i}\n"
        yield (Candidate(pid, run_id, i % 4, i // 4, (f"p{i - 4}",) if i >= 4 else (), code,
                         "embedded:perturb_const" if i else "seed", now),
               EvalResult(pid, "search", Status.OK, score=-1.0 - i * 1e-6, metrics={"cost": 4.2, "fill": 0.9},
                          instance_scores=(-1.0, -1.1, -0.9), descriptors=(0.9, 0.3), duration_s=0.5))


def _seconds(work, repeat: int = 1) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def batched(archive: DuckDBArchive, n: int, batch: int) -> float:
    items = list(pairs(n, "r"))
    return n / _seconds(lambda: [archive.record(items[i:i + batch]) for i in range(0, n, batch)])


def row_by_row(archive: DuckDBArchive, n: int) -> float:
    items = list(pairs(n, "r"))
    con = archive.con

    def insert():
        con.execute("BEGIN")
        con.executemany("INSERT INTO programs (program_id, run_id, island, generation, parent_ids, code, code_hash, "
                        "mutator, created_at, seq, id_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [[c.program_id, c.run_id, c.island, c.generation, list(c.parent_ids), c.code, c.code_hash,
                          c.mutator, c.created_at, i + 1, id_hash(c.program_id)] for i, (c, _) in enumerate(items)])
        con.executemany("INSERT INTO lineage (child_id, parent_id, run_id) VALUES (?, ?, ?)",
                        [[c.program_id, p, c.run_id] for c, _ in items for p in c.parent_ids])
        con.executemany("INSERT INTO evaluations (program_id, run_id, split, status, score, metrics, "
                        "instance_scores, descriptors, duration_s, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [[r.program_id, "r", r.split, r.status.value, r.score, '{"cost": 4.2}',
                          list(r.instance_scores), list(r.descriptors), r.duration_s, time.time()] for _, r in items])
        con.execute("COMMIT")
    return n / _seconds(insert)


def fresh(tmp: str, label: str) -> DuckDBArchive:
    archive = DuckDBArchive(Path(tmp) / f"{label}.duckdb")
    archive.create_run("r", {}, "")
    return archive


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=20000, help="programs (with one evaluation each) to ingest")
    parser.add_argument("--batch", type=int, nargs="+", default=[100, 1000], help="batch sizes to time")
    parser.add_argument("--row-by-row", type=int, default=2000, help="programs for the row-by-row contrast")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"ingest ({args.programs:,} programs; rows = programs + lineage edges + evaluations)")
        print(f"  {'method':<34}{'programs/s':>12}{'rows/s':>12}")
        for batch in args.batch:
            with fresh(tmp, f"b{batch}") as archive:
                rate = batched(archive, args.programs, batch)
            print(f"  {f'record(), batches of {batch}':<34}{rate:>12,.0f}{3 * rate:>12,.0f}")
        with fresh(tmp, "rows") as archive:
            rate = row_by_row(archive, args.row_by_row)
        print(f"  {f'executemany, {args.row_by_row:,} programs':<34}{rate:>12,.0f}{3 * rate:>12,.0f}")
        with fresh(tmp, "reads") as archive:
            batched(archive, args.programs, 1000)
            report_reads(archive, Path(tmp))


def report_reads(archive: DuckDBArchive, tmp: Path) -> None:
    archive.con.execute("CHECKPOINT")  # the file's size, the write-ahead log folded in
    size = archive.path.stat().st_size / 2**20
    print(f"reads of a resume on that archive ({size:.1f} MiB), median of 5, ms")
    figures = {
        "search_rows, last 1,000 (islands' tail)": lambda: list(archive.search_rows("r", archive.last_seq() - 1000)),
        "operator_stats": lambda: archive.operator_stats("r"),
        "known_hashes": lambda: archive.known_hashes("r")}
    for label, work in figures.items():
        print(f"  {label:<34}{_seconds(work, repeat=5) * 1e3:>12.1f}")


if __name__ == "__main__":
    main()
