"""Where the sandbox channel's time goes: CPU of both processes, sandboxed and with no confinement at all.

Runs the default inventory search evaluation of the seed program three ways,
alternated: through the real sandbox; through the same serve loop and frames in
a plain fork of this process (no namespaces, seccomp, limits or fresh
interpreter: a benchmark-only shortcut, trusted code only); and in process.
Prints wall time and CPU time per evaluation (this process from
`time.process_time`, the candidate's from `/proc/PID/schedstat`), so what the
confinement costs and what any two processes cost can be told apart.

    python3 benchmarks/channel_floor.py [--repeats N]
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.channel_overhead import in_process  # noqa: E402
from evaluators.params import read_params  # noqa: E402
from evaluators.registry import get_domain  # noqa: E402
from evaluators.sandbox import _child, wire  # noqa: E402
from evaluators.sandbox.area import StateArea  # noqa: E402
from evaluators.sandbox.config import SandboxConfig  # noqa: E402
from evaluators.sandbox.process import PolicyProcess  # noqa: E402


def cpu_ms(pid: int) -> float:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e6


def sandboxed(domain, code: str) -> tuple[float, float, float]:
    """(wall, this process's CPU, the candidate's CPU) in ms."""
    with PolicyProcess(code, "policy", SandboxConfig()) as policy:
        # the candidate's own process, cloned by the fork server into its namespaces (pid 1 there)
        return _timed(lambda: domain.evaluate(policy, read_params(code), "search"), policy._pid)


def bare(domain, code: str) -> tuple[float, float, float]:
    """The same, with the candidate's serve loop in a plain fork of this process."""
    area = StateArea()
    to_child_r, to_child = os.pipe()
    from_child, from_child_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(to_child)
        os.close(from_child)
        view = mmap.mmap(area.fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)
        _child.serve(_child.Channel(to_child_r, from_child_w), [], {}, [], view)
        os._exit(0)
    os.close(to_child_r)
    os.close(from_child_w)
    area.close_fd()
    policy = PolicyProcess(code, "policy", SandboxConfig())
    policy._to_child, policy._from_child, policy._area = to_child, from_child, area
    policy._deadline = policy._startup = time.monotonic() + 600
    policy._startup_clock = "start-up"
    policy._write(wire.pack({"code": code, "entry": "policy"}), policy._startup, policy._startup_clock)
    policy._starting = True
    policy.confirm_started()
    try:
        return _timed(lambda: domain.evaluate(policy, read_params(code), "search"), pid)
    finally:
        os.close(to_child)
        os.close(from_child)
        os.waitpid(pid, 0)
        area.close()


def direct(domain, code: str) -> tuple[float, float, float]:
    return _timed(lambda: domain.evaluate(in_process(code), read_params(code), "search"), None)


def _timed(run, pid: int | None) -> tuple[float, float, float]:
    wall, cpu, other = time.perf_counter(), time.process_time(), cpu_ms(pid) if pid else 0.0
    run()
    return ((time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3,
            cpu_ms(pid) - other if pid else 0.0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="evaluations of each kind, alternated; medians shown")
    args = parser.parse_args(argv)
    domain = get_domain("inventory")
    code = domain.seed_program
    domain.base_stock("search")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    ways = {"sandboxed": sandboxed, "plain fork, no confinement": bare, "in process": direct}
    runs: dict[str, list] = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, way in ways.items():
            runs[name].append(way(domain, code))
    base = statistics.median(c for _, c, _ in runs["in process"])
    for name, rows in runs.items():
        wall, mine, theirs = (statistics.median(col) for col in zip(*rows))
        print(f"  {name:27} wall {wall:4.0f} ms, CPU: evaluator {mine:4.0f} ms + candidate {theirs:4.0f} ms "
              f"= {(mine + theirs) / base:.2f}x the in-process CPU")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
