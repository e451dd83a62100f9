"""How much an inventory run's held-out verdict owes to the luck of its tuning data.

The held-out split re-tunes a program's PARAMS on every instance's own tuning trajectories,
drawn from the run's secret, then measures it on fresh ones. This script takes the evolved best
(the best search score) of each run directory given, scores it on the held-out split under
`--secrets` different secrets with each of the `--trials` trial counts, and prints the mean
ratio of its cost to optimized base-stock's on the same data (the held-out score, negated: below
1 is better than base-stock) for every secret, with the median and the range. Each evaluation
runs in the real sandbox, as a run's evaluator actor would, on the default inventory config
with only the held-out trials changed.

    python3 benchmarks/heldout_tuning.py RUN_DIR [RUN_DIR ...] --trials 32 128 --secrets 8
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb

from evaluators.evaluator import Evaluator
from evaluators.sandbox.config import SandboxConfig
from evaluators.secrets import RunSecrets
from store.records import Status


def evolved_best(run_dir: Path) -> str:
    archive = run_dir / "archive.duckdb"
    if not archive.is_file():
        sys.exit(f"{run_dir}: no archive.duckdb (give a finished run's directory)")
    with duckdb.connect(str(archive), read_only=True) as con:
        row = con.execute("SELECT code FROM programs WHERE search_score IS NOT NULL "
                          "ORDER BY search_score DESC LIMIT 1").fetchone()
    if row is None:
        sys.exit(f"{run_dir}: no program with a search score")
    return row[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished inventory run directories")
    parser.add_argument("--trials", nargs="+", type=int, default=[32, 128], help="held-out trials per instance")
    parser.add_argument("--secrets", type=int, default=8, help="secrets (RunSecrets.fixed(1..N)) per trial count")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} before", flush=True)
    for run_dir in args.runs:
        code = evolved_best(run_dir)
        for trials in args.trials:
            ratios, start = [], time.perf_counter()
            for secret in range(1, args.secrets + 1):
                evaluator = Evaluator("inventory", {"heldout_tune_trials": trials}, SandboxConfig(wall_s=600),
                                      secrets=RunSecrets.fixed(secret))
                result = evaluator.evaluate("best", code, "heldout")
                if result.status != Status.OK:
                    sys.exit(f"{run_dir}: held-out evaluation {result.status.value}: {result.error}")
                ratios.append(-result.score)
            per = (time.perf_counter() - start) / args.secrets
            print(f"{run_dir}  {trials:4d} trials: median {statistics.median(ratios):.3f} "
                  f"({min(ratios):.3f} to {max(ratios):.3f}), {per:.1f} s an evaluation; "
                  + " ".join(f"{r:.3f}" for r in ratios), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
