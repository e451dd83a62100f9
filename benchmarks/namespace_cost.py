"""What each kind of namespace adds to a process's life: raw clone(2) and exit, no Python work.

    python3 benchmarks/namespace_cost.py [--processes N] [--rounds N]

Clones N children that exit at once, with the namespaces a candidate gets, with all of
them but the network namespace, and with none, and prints the wall time per child and
the whole machine's busy CPU per child (from /proc/stat, kernel threads included, after
a pause for the kernel's deferred teardown). Needs root, or unprivileged user namespaces
(the user namespace is among the flags).
"""
import argparse
import ctypes
import os
import time
from pathlib import Path

SYS_CLONE, SIGCHLD = 56, 17  # x86_64
FLAGS = {"mount": 0x20000, "cgroup": 0x2000000, "uts": 0x4000000, "ipc": 0x8000000, "user": 0x10000000,
         "pid": 0x20000000, "network": 0x40000000}
_libc = ctypes.CDLL(None, use_errno=True)


def machine_busy_s() -> float:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def per_child_ms(flags: int, n: int) -> tuple[float, float]:
    """(wall ms, whole-machine busy CPU ms) per child cloned with `flags`."""
    busy, start = machine_busy_s(), time.perf_counter()
    for _ in range(n):
        pid = _libc.syscall(SYS_CLONE, ctypes.c_ulong(flags | SIGCHLD), None, None, None, None)
        if pid == 0:
            os._exit(0)
        if pid < 0:
            err = ctypes.get_errno()
            raise SystemExit(f"clone refused: {os.strerror(err)}")
        os.waitpid(pid, 0)
    wall = time.perf_counter() - start
    time.sleep(1.0)  # the kernel tears some namespaces down later, on its own threads
    return wall / n * 1e3, (machine_busy_s() - busy) / n * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=300, help="children per case and round (default 300)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the three cases, alternated (default 2)")
    args = parser.parse_args()
    every = sum(FLAGS.values())
    cases = {"every namespace": every, "all but network": every & ~FLAGS["network"], "none": 0}
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for _ in range(args.rounds):
        for name, flags in cases.items():
            wall, busy = per_child_ms(flags, args.processes)
            print(f"{name:16s} wall {wall:.3f} ms per child, whole machine busy {busy:.3f} ms per child")


if __name__ == "__main__":
    main()
