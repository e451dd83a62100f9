"""Per-candidate framework overhead and the cost of the policy channel.

    python benchmarks/sandbox_overhead.py

Prints: median ms to start a sandboxed process, load a no-op program, answer one
batch and tear it all down; median us per round trip; and one default inventory
search-split evaluation through the sandbox against the same evaluation with the
policy called in-process (trusted seed program only).
"""
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.config import SandboxConfig  # noqa: E402
from evaluators.sandbox import PolicyProcess  # noqa: E402

NOOP = "def policy(state, params):\n    return state['x']\n"


def spawn_ms(n=30):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        with PolicyProcess(NOOP, "policy", SandboxConfig()) as proc:
            proc([({"x": np.zeros(4)}, {})])
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def round_trip_us(n=3000, size=192):
    batch = [({"x": np.zeros(size), "y": np.zeros((size, 3))}, {"S": np.zeros(size)})]
    with PolicyProcess(NOOP, "policy", SandboxConfig()) as proc:
        for _ in range(100):
            proc(batch)
        t = time.perf_counter()
        for _ in range(n):
            proc(batch)
        return (time.perf_counter() - t) / n * 1e6


def inventory_evaluation():
    from evaluators.params import read_params
    from evaluators.registry import get_domain

    domain = get_domain("inventory")
    code = domain.seed_program
    params = read_params(code)
    module = {}
    exec(compile(code, "<trusted seed>", "exec"), module)  # trusted: the project's own seed
    fn = module[domain.entry_point]
    t = time.perf_counter()
    domain.evaluate(lambda batches: [np.asarray(fn(s, p)) for s, p in batches], params, "search")
    in_process = time.perf_counter() - t
    t = time.perf_counter()
    with PolicyProcess(code, domain.entry_point, SandboxConfig()) as proc:
        domain.evaluate(proc, params, "search")
        calls = proc.calls
    sandboxed = time.perf_counter() - t
    return in_process, sandboxed, calls


if __name__ == "__main__":
    print(f"sandboxed no-op candidate, start + load + 1 batch + teardown: median {spawn_ms():.1f} ms")
    print(f"policy channel round trip (192 states): {round_trip_us():.0f} us")
    inproc, sandboxed, calls = inventory_evaluation()
    print(f"default inventory search evaluation: in-process policy {inproc:.2f} s, "
          f"sandboxed {sandboxed:.2f} s ({calls} round trips, +{(sandboxed / inproc - 1) * 100:.0f}%)")
