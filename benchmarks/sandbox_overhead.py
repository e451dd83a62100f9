"""Framework overhead per candidate: a no-op program's whole sandbox life.

    python3 benchmarks/sandbox_overhead.py [--candidates N]

Prints the median ms to fork a sandboxed process from the warm fork server,
isolate it, load a no-op program, answer one batch and tear it all down (the
fork server's own one-off start is shown apart) and the CPU time that costs in
all processes together: once with each process forked on demand, once with the
next one made ready while the current one runs (what an evaluator does; back to
back, as here, little of that set-up can overlap). The channel's per-round-trip
cost and a whole inventory evaluation are in benchmarks/channel_overhead.py.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.sandbox import server  # noqa: E402
from evaluators.sandbox.config import SandboxConfig  # noqa: E402
from evaluators.sandbox.process import PolicyProcess  # noqa: E402

NOOP = "def policy(state, params):\n    return state['x']\n"


def cpu_s() -> float:
    """CPU seconds of this process, its fork servers and every process they reaped (the candidates).

    Unlike wall time it hardly depends on what else the machine runs; kernel work
    done later on the kernel's own threads (a network namespace's teardown) is not in it.
    """
    total = time.process_time()
    for zygote in server._ZYGOTES.values():
        fields = Path(f"/proc/{zygote.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy (not idle, not waiting on I/O), kernel threads included."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def lifetimes_ms(n: int, spare: bool) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        with PolicyProcess(NOOP, "policy", SandboxConfig(), spare=spare) as proc:
            proc([({"x": np.zeros(4)}, {})])
            held = proc.protections
        times.append((time.perf_counter() - start) * 1e3)
    PROTECTIONS[:] = held
    return times


PROTECTIONS: list[str] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=50, help="no-op candidates to time")
    args = parser.parse_args()
    first = lifetimes_ms(1, spare=False)[0]
    print(f"protections in force: {', '.join(PROTECTIONS)}")
    print(f"first candidate (starts the fork server): {first:.1f} ms")
    before, busy = cpu_s(), machine_busy_s()
    rest = lifetimes_ms(args.candidates, spare=False)
    cpu = (cpu_s() - before) / args.candidates * 1e3
    time.sleep(1.0)  # the kernel's deferred teardown of the last namespaces
    busy = (machine_busy_s() - busy) / args.candidates * 1e3
    print(f"no-op candidate, fork + isolate + load + 1 batch + teardown: median {statistics.median(rest):.1f} ms "
          f"(p90 {np.percentile(rest, 90):.1f} ms, {len(rest)} candidates); CPU {cpu:.1f} ms per candidate "
          f"in these processes, {busy:.1f} ms of the whole machine's (kernel threads and anything else running "
          f"included; load average {os.getloadavg()[0]:.2f})")
    ready = lifetimes_ms(args.candidates, spare=True)
    print(f"the same with the next process made ready in advance: median {statistics.median(ready):.1f} ms "
          f"(p90 {np.percentile(ready, 90):.1f} ms)")


if __name__ == "__main__":
    main()
