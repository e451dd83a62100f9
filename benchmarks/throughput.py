"""Evaluation throughput with 1 versus 2 evaluator actors on a CPU-bound evaluation.

    unshare -n sh -c 'ip link set lo up && python benchmarks/throughput.py [--evaluations N]'

Each evaluation is the inventory seed program on the default search split, in the
real sandbox, through real Ray actors.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

from controller.actors import EvaluatorActor, connect  # noqa: E402
from evaluators.sandbox.config import SandboxConfig  # noqa: E402
from evaluators.registry import get_domain  # noqa: E402

def throughput(actors: int, n: int) -> float:
    code = get_domain("inventory").seed_program
    pool = [EvaluatorActor.remote("inventory", {}, SandboxConfig()) for _ in range(actors)]
    ray.get([a.evaluate.remote("warm", code, "search") for a in pool])
    t = time.perf_counter()
    results = ray.get([pool[i % actors].evaluate.remote(f"p{i}", code, "search") for i in range(n)])
    elapsed = time.perf_counter() - t
    assert all(r.status.value == "OK" for r in results), results[0].error
    for a in pool:
        ray.kill(a)
    return n / elapsed


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--evaluations", type=int, default=48, help="evaluations timed for each actor count (default 48)")
    n = parser.parse_args().evaluations
    connect(None, num_cpus=2)
    before = os.getloadavg()[0]
    one, two = throughput(1, n), throughput(2, n)
    print(f"evaluations/s: 1 actor {one:.2f}, 2 actors {two:.2f} (speed-up {two / one:.2f}x, {n} evaluations each; "
          f"load average {before:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} cores)")
