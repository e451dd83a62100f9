"""What starting and stopping a local Ray costs an `atoll` command, as Atoll did it and as it does.

Every `atoll` command that searches or reports starts a Ray of its own and then its actors.
Each round runs two fresh processes, alternated so both meet the same load. Each starts Ray,
starts two actors that import from Atoll's tree (one CPU each, as evaluators are) and shuts
Ray down. "before" gives the workers their PYTHONPATH in a runtime_env and leaves the shutdown
to Ray; "now" is `controller.actors.start_local` (the path through the environment Ray's
processes inherit) and `stop_monitor` ahead of the shutdown, as at an `atoll` command's exit.
The script prints the medians of each step and the load average around them.

    unshare -n sh -c 'ip link set lo up && python3 benchmarks/ray_start.py --rounds 5'
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ONE = r'''
import json, os, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
import ray
from controller.actors import project_root, start_local, stop_monitor
t1 = time.perf_counter()
if {way!r} == "before":
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={{"env_vars": {{"PYTHONPATH": str(project_root())}}}})
else:
    start_local(2, str(project_root()))
t2 = time.perf_counter()

@ray.remote(num_cpus=1)
class Probe:
    def where(self):
        import controller.actors  # found through the path given
        return controller.actors.__file__

actors = [Probe.remote() for _ in range(2)]
found = ray.get([a.where.remote() for a in actors])
t3 = time.perf_counter()
if {way!r} == "now":
    stop_monitor()
ray.shutdown()
t4 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "init": t2 - t1, "actors": t3 - t2, "shutdown": t4 - t3,
                  "found": found}}))
'''

WAYS = ("before", "now")
STEPS = ("init", "actors", "shutdown")


def one(way: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the path comes from `way` alone
    proc = subprocess.run([sys.executable, "-c", ONE.format(root=str(ROOT), way=way)], env=env, cwd="/",
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode:
        sys.exit(f"the {way} run failed:\n{proc.stderr[-2000:]}")
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    if not all(f.startswith(str(ROOT)) for f in figures["found"]):
        sys.exit(f"the {way} run's actors imported Atoll from elsewhere: {figures['found']}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="pairs of runs, alternated (default 5)")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    runs: dict[str, list[dict]] = {w: [] for w in WAYS}
    for i in range(args.rounds):
        for way in WAYS if i % 2 == 0 else reversed(WAYS):
            runs[way].append(one(way))
    for way in WAYS:
        med = {s: statistics.median(r[s] for r in runs[way]) for s in STEPS}
        total = statistics.median(sum(r[s] for s in STEPS) for r in runs[way])
        print(f"{way:6s} median of {args.rounds}: ray.init {med['init']:.2f} s, two actors ready "
              f"{med['actors']:.2f} s, shutdown {med['shutdown']:.2f} s, all three {total:.2f} s")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
