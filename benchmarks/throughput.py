"""Evaluation throughput with 1 versus 2 evaluator actors on a CPU-bound evaluation.

    unshare -n sh -c 'ip link set lo up && python benchmarks/throughput.py'

Each evaluation is the inventory seed program on the default search split, in the
real sandbox, through real Ray actors.
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402

from controller.actors import EvaluatorActor, connect  # noqa: E402
from evaluators.sandbox.config import SandboxConfig  # noqa: E402
from evaluators.registry import get_domain  # noqa: E402

N = 12


def throughput(actors: int) -> float:
    code = get_domain("inventory").seed_program
    pool = [EvaluatorActor.remote("inventory", {}, SandboxConfig()) for _ in range(actors)]
    ray.get([a.evaluate.remote("warm", code, "search") for a in pool])
    t = time.perf_counter()
    results = ray.get([pool[i % actors].evaluate.remote(f"p{i}", code, "search") for i in range(N)])
    elapsed = time.perf_counter() - t
    assert all(r.status.value == "OK" for r in results), results[0].error
    for a in pool:
        ray.kill(a)
    return N / elapsed


if __name__ == "__main__":
    connect(None, num_cpus=2)
    one, two = throughput(1), throughput(2)
    print(f"evaluations/s: 1 actor {one:.2f}, 2 actors {two:.2f} (speed-up {two / one:.2f}x, {N} evaluations each)")
