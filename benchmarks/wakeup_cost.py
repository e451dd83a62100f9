"""What waking the other process costs: a pipe round trip between two processes, as the policy channel makes one.

The evaluator and a candidate's process take turns: one writes a request and blocks reading
the reply, the other wakes, answers and blocks again. This times that ping-pong with a
16-byte message and no work on either side, three ways:

- blocking reads, the processes free to run on any core (as the sandbox runs them);
- blocking reads, both pinned to one core (no wake-up of another core);
- reads that spin on a non-blocking pipe for up to `--spin-us` before they block.

It prints the wall time and the CPU of both processes per round trip, and the load average.
The CPU per round trip is what the machine pays beside the work; on a virtual machine, waking
an idle core costs the waker far more than on bare metal.

    python3 benchmarks/wakeup_cost.py [--round-trips 20000] [--spin-us 100]
"""
from __future__ import annotations

import argparse
import os
import time


def _wait_read(fd: int, spin_s: float) -> bytes:
    if not spin_s:
        return os.read(fd, 64)
    end = time.perf_counter() + spin_s
    while True:
        try:
            return os.read(fd, 64)
        except BlockingIOError:
            if time.perf_counter() > end:
                os.set_blocking(fd, True)
                try:
                    return os.read(fd, 64)
                finally:
                    os.set_blocking(fd, False)


def round_trips(n: int, spin_s: float, cpu: int | None) -> tuple[float, float]:
    """(wall µs, CPU µs of both processes) per round trip."""
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    before = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # the child inherits it
    pid = os.fork()
    if pid == 0:
        try:
            if spin_s:
                os.set_blocking(to_child_r, False)
            for _ in range(n):
                os.write(to_parent_w, _wait_read(to_child_r, spin_s))
        finally:
            os._exit(0)
    try:
        if spin_s:
            os.set_blocking(to_parent_r, False)
        message = b"x" * 16
        start, times = time.perf_counter(), os.times()
        for _ in range(n):
            os.write(to_child_w, message)
            _wait_read(to_parent_r, spin_s)
        wall = time.perf_counter() - start
        os.waitpid(pid, 0)
        after = os.times()
    finally:
        os.sched_setaffinity(0, before)
        for fd in (to_child_r, to_child_w, to_parent_r, to_parent_w):
            os.close(fd)
    cpu_s = sum(after[:4]) - sum(times[:4])  # user and system, of this process and its reaped child
    return 1e6 * wall / n, 1e6 * cpu_s / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=20000, help="round trips per way (default 20000)")
    parser.add_argument("--spin-us", type=float, default=100.0, help="how long a read spins before it blocks")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {len(cpus)} cores")
    ways = [("blocking, any core", 0.0, None), ("blocking, both on one core", 0.0, cpus[0]),
            (f"spinning up to {args.spin_us:g} µs, any core", args.spin_us / 1e6, None)]
    for label, spin_s, cpu in ways:
        wall, cpu_us = round_trips(args.round_trips, spin_s, cpu)
        print(f"  {label:<32} {wall:7.1f} µs wall, {cpu_us:7.1f} µs CPU per round trip")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
