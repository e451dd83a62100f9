"""What the sandbox channel costs: one round trip, and one whole inventory evaluation.

Prints the median time of a policy round trip for a small batch, then one
search-split evaluation of the inventory seed program through the real sandbox
against the same evaluation with the policy called directly in this process
(a benchmark-only shortcut; the project never runs candidate code in-process).

    python3 benchmarks/channel_overhead.py [--round-trips N] [--repeats N] [--option key=json ...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.sandbox.config import SandboxConfig  # noqa: E402
from evaluators.params import read_params  # noqa: E402
from evaluators.registry import get_domain  # noqa: E402
from evaluators.sandbox.process import PolicyProcess  # noqa: E402


def _args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=2000, help="round trips to time (default 2000)")
    parser.add_argument("--rows", type=int, default=8, help="rows in the small batch (default 8)")
    parser.add_argument("--repeats", type=int, default=5, help="evaluations of each kind, alternated; medians shown")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=JSON",
                        help="an inventory domain option, e.g. --option tune_trials=16 (repeatable)")
    return parser.parse_args(argv)


def round_trip_us(code: str, rows: int, count: int) -> float:
    batch = [({"on_hand": np.zeros(rows, np.int64), "pipeline": np.zeros((rows, 2), np.int64)},
              {"level": np.full(rows, 15.0)})]
    with PolicyProcess(code, "policy", SandboxConfig()) as policy:
        for _ in range(50):
            policy(batch)
        times = []
        for _ in range(count):
            start = time.perf_counter()
            policy(batch)
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def in_process(code: str):
    namespace: dict = {}
    exec(code, namespace)
    fn = namespace["policy"]
    return lambda batches: [fn(state, params) for state, params in batches]


def evaluation_s(domain, code: str, sandboxed: bool) -> tuple[float, float, int]:
    """Seconds, the score and the round trips of one search-split evaluation."""
    start = time.perf_counter()
    if sandboxed:
        with PolicyProcess(code, "policy", SandboxConfig()) as policy:
            score = domain.evaluate(policy, read_params(code), "search").score
            calls = policy.calls
    else:
        score, calls = domain.evaluate(in_process(code), read_params(code), "search").score, 0
    return time.perf_counter() - start, score, calls


def side_by_side(domain, code: str, repeats: int) -> tuple[list, list, float, float, int]:
    """Sandboxed and in-process evaluations alternated (so both meet the same load): their times, scores, calls."""
    boxed, direct = [], []
    for _ in range(repeats):
        seconds, score, calls = evaluation_s(domain, code, True)
        boxed.append(seconds)
        seconds, direct_score, _ = evaluation_s(domain, code, False)
        direct.append(seconds)
    return boxed, direct, score, direct_score, calls


def main(argv=None) -> None:
    args = _args(argv)
    options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)}
    domain = get_domain("inventory", **options)
    code = domain.seed_program
    print(f"round trip, 1 batch of {args.rows} rows: median {round_trip_us(code, args.rows, args.round_trips):.0f} us "
          f"over {args.round_trips}")
    domain.base_stock("search")  # the normalizer is computed once per evaluator; keep it out of the timing
    cfg = domain.config
    print(f"search split: {len(cfg.search_instances)} instances x {cfg.search_trajectories} trajectories, "
          f"{cfg.tune_trials} trials in rounds of {cfg.tune_batch}, {cfg.warmup}+{cfg.search_periods} periods")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    boxed, direct, score, direct_score, calls = side_by_side(domain, code, args.repeats)
    sandboxed, inproc = statistics.median(boxed), statistics.median(direct)
    ratios = sorted(b / d for b, d in zip(boxed, direct))
    print(f"  through the sandbox: {sandboxed:.2f} s median of {args.repeats} ({calls} round trips, "
          f"{1e6 * sandboxed / calls:.0f} us each), score {score:.4f}")
    print(f"  in-process:          {inproc:.2f} s median, score {direct_score:.4f}")
    print(f"  sandboxed / in-process: {sandboxed / inproc:.2f}x (medians; pairwise {ratios[0]:.2f}x to "
          f"{ratios[-1]:.2f}x); channel share {100 * (1 - inproc / sandboxed):.0f}% of the sandboxed time")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
