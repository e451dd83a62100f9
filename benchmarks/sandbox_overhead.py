"""Framework overhead per candidate: a no-op program's whole sandbox life.

    python3 benchmarks/sandbox_overhead.py [--candidates N]

Prints the median ms to fork a sandboxed process from the warm fork server,
isolate it, load a no-op program, answer one batch and tear it all down (the
fork server's own one-off start is shown apart): once with each process forked
on demand, once with the next one made ready while the current one runs (what
an evaluator does; back to back, as here, little of the set-up can overlap). The
channel's per-round-trip cost and a whole inventory evaluation are in
benchmarks/channel_overhead.py.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.sandbox.config import SandboxConfig  # noqa: E402
from evaluators.sandbox.process import PolicyProcess  # noqa: E402

NOOP = "def policy(state, params):\n    return state['x']\n"


def lifetimes_ms(n: int, spare: bool) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        with PolicyProcess(NOOP, "policy", SandboxConfig(), spare=spare) as proc:
            proc([({"x": np.zeros(4)}, {})])
            held = proc.protections
        times.append((time.perf_counter() - start) * 1e3)
    print(f"protections in force: {', '.join(held)}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=50, help="no-op candidates to time")
    args = parser.parse_args()
    first, *rest = lifetimes_ms(args.candidates + 1, spare=False)
    print(f"first candidate (starts the fork server): {first:.1f} ms")
    print(f"no-op candidate, fork + isolate + load + 1 batch + teardown: median {statistics.median(rest):.1f} ms "
          f"(p90 {np.percentile(rest, 90):.1f} ms, {len(rest)} candidates)")
    ready = lifetimes_ms(args.candidates, spare=True)
    print(f"the same with the next process made ready in advance: median {statistics.median(ready):.1f} ms "
          f"(p90 {np.percentile(ready, 90):.1f} ms)")


if __name__ == "__main__":
    main()
