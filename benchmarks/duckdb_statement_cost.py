"""What one DuckDB statement costs here, whatever it does: the floor under every archive commit.

A commit of the driver is a handful of statements (BEGIN, one insert per table, COMMIT); at
one commit a second, their fixed cost is a share of the driver's CPU that no batching inside
a commit removes. This times, on a fresh archive file opened with the archive's own settings
(`store.duckdb_archive.CONFIG`), each with DuckDB's default threads and with one:

- `SELECT 1`;
- an empty transaction (BEGIN and COMMIT);
- appending a 10-row Arrow batch of 8 columns in a transaction, as the archive does
  (a relation from the Arrow table, then `insert_into`), and the same rows through DuckDB's
  appender.

    python3 benchmarks/duckdb_statement_cost.py [--repeat 300]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from store.duckdb_archive import CONFIG  # noqa: E402

ROWS = 10


def _batch() -> pa.Table:
    return pa.table({"a": [f"id{i}" for i in range(ROWS)], "b": ["x"] * ROWS, "c": [1.5] * ROWS,
                     "d": list(range(ROWS)), "e": ["y" * 200] * ROWS, "f": [0.1] * ROWS,
                     "g": pa.nulls(ROWS, pa.string()), "h": [3] * ROWS})


def _timed(fn, repeat: int) -> tuple[float, float]:
    """(wall µs, CPU µs of this process) per call, after a warm-up."""
    for _ in range(20):
        fn()
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(repeat):
        fn()
    return 1e6 * (time.perf_counter() - start) / repeat, 1e6 * (time.process_time() - cpu) / repeat


def measure(folder: str, threads: int | None, repeat: int) -> dict[str, tuple[float, float]]:
    config = dict(CONFIG, **({"threads": threads} if threads else {}))
    config.pop("lock_configuration", None)
    con = duckdb.connect(os.path.join(folder, f"threads-{threads or 'default'}.duckdb"), config=config)
    con.execute("CREATE TABLE t (a VARCHAR, b VARCHAR, c DOUBLE, d BIGINT, e VARCHAR, f DOUBLE, "
                "g VARCHAR, h BIGINT)")
    table = _batch()
    rows = [tuple(row.values()) for row in table.to_pylist()]
    appender = con.appender("t")

    def in_transaction(insert):
        def run():
            con.execute("BEGIN")
            insert()
            con.execute("COMMIT")
        return run

    def append():
        appender.append_rows(rows)
        appender.flush()
    found = {
        "SELECT 1": _timed(lambda: con.execute("SELECT 1"), repeat),
        "BEGIN + COMMIT, nothing written": _timed(in_transaction(lambda: None), repeat),
        f"BEGIN + {ROWS} rows from Arrow (relation insert) + COMMIT":
            _timed(in_transaction(lambda: con.from_arrow(table).insert_into("t")), repeat),
        f"BEGIN + {ROWS} rows through the appender + COMMIT": _timed(in_transaction(append), repeat),
    }
    con.close()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=300, help="calls timed per statement (default 300)")
    args = parser.parse_args()
    print(f"duckdb {duckdb.__version__}; load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="atoll-duckdb-") as folder:
        for threads in (None, 1):
            print(f"threads: {threads or 'DuckDB default (' + str(os.cpu_count()) + ')'}")
            for label, (wall, cpu) in measure(folder, threads, args.repeat).items():
                print(f"  {label:<52} {wall:8.1f} µs wall, {cpu:8.1f} µs CPU")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
