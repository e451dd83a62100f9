"""What starting and stopping a local Ray costs an `atoll` command, as Atoll did it and as it does.

Every `atoll` command that searches or reports starts a Ray of its own and then its actors.
Each round runs two fresh processes, alternated so both meet the same load. Each starts Ray,
starts two actors that import from Atoll's tree (one CPU each, as evaluators are) and shuts
Ray down. "before" gives the workers their PYTHONPATH in a runtime_env, leaves Ray's helpers
running and calls `ray.shutdown()`; "now" is `controller.actors.start_local` (the path
through the environment Ray's processes inherit, and neither a log monitor nor an autoscaler
monitor started), stopped as a command's exit stops it (`controller.actors._forget_session`,
which also removes Ray's session folder). Each run also prints the CPU that the driver and
every process it started spent from the driver's start until its two actors were ready. Between the actors' start and
the shutdown, each run idles `--idle` seconds with its two actors alive and measures the CPU
that every process of its Ray spends meanwhile (the driver and all it started: what a run
pays each second beside its work), then their memory (PSS, shared pages counted once).
The script prints the medians of each step and the load average around them. With
`--against DIR`, a third way "DIR" runs `start_local` and `_forget_session` of the Atoll
checkout in DIR (an older commit, say) in every round too, so a change to it is measured side by side.

    unshare -n sh -c 'ip link set lo up && python3 benchmarks/ray_start.py --rounds 5'
    git worktree add /tmp/atoll-old HEAD~1
    unshare -n sh -c 'ip link set lo up && python3 benchmarks/ray_start.py --rounds 3 --idle 20 --against /tmp/atoll-old'
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
import psutil
import ray


def cpu_per_s(seconds):
    """CPU ms a second of this process and all it started, over `seconds` of idling, by process name."""
    def sample():
        me = psutil.Process()
        out = {{}}
        for p in [me, *me.children(recursive=True)]:
            try:
                times, name = p.cpu_times(), p.name()
                if p.pid == me.pid:
                    name = "driver"
                elif name.startswith("python"):  # Ray's helpers in Python: named by their script
                    script = next((a for a in p.cmdline()[1:] if a.endswith(".py")), name)
                    name = os.path.basename(script)
                out[p.pid] = (name, times.user + times.system)
            except psutil.Error:
                pass
        return out
    if not seconds:
        return {{}}
    time.sleep(1.0)  # the actors' own start behind
    a, start = sample(), time.monotonic()
    time.sleep(seconds)
    b, spent = sample(), time.monotonic() - start
    found = {{}}
    for pid, (name, cpu) in b.items():
        if pid in a:
            found[name] = found.get(name, 0.0) + 1000 * (cpu - a[pid][1]) / spent
    return found


def tree_sum(measure):
    """`measure(p)` summed over this process and all it started (one gone meanwhile adds nothing)."""
    me, total = psutil.Process(), 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += measure(p)
        except psutil.Error:
            pass
    return total


def tree_cpu_s():
    """CPU seconds of this process and all it started so far: those alive, and those they reaped."""
    def cpu(p):
        t = p.cpu_times()
        return t.user + t.system + t.children_user + t.children_system
    return tree_sum(cpu)


def tree_pss_mb():
    """The PSS of this process and all it started, in MB: shared pages counted once."""
    return tree_sum(lambda p: p.memory_full_info().pss) / 2**20
from controller.actors import project_root, start_local
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
cpu = tree_cpu_s()
idle = cpu_per_s({idle})
pss = tree_pss_mb()
t4 = time.perf_counter()
if {way!r} == "before":
    ray.shutdown()
else:  # as the command's exit does it: Ray stopped, its session folder removed
    from controller.actors import _forget_session
    _forget_session()
t5 = time.perf_counter()
print(json.dumps({{"cpu": cpu, "import": t1 - t0, "init": t2 - t1, "actors": t3 - t2, "shutdown": t5 - t4,
                  "idle": idle, "pss": pss, "found": found}}))
'''

WAYS = ("before", "now")
STEPS = ("init", "actors", "shutdown")


def one(way: str, idle: float) -> dict:
    """One run of `way`: "before", "now", or the path of another Atoll checkout (its start_local)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the path comes from `way` alone
    root = way if way not in WAYS else str(ROOT)
    proc = subprocess.run([sys.executable, "-c", ONE.format(root=root, way=way, idle=idle)], env=env, cwd="/",
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode:
        sys.exit(f"the {way} run failed:\n{proc.stderr[-2000:]}")
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    if not all(f.startswith(root) for f in figures["found"]):
        sys.exit(f"the {way} run's actors imported Atoll from elsewhere: {figures['found']}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="pairs of runs, alternated (default 5)")
    parser.add_argument("--idle", type=float, default=10.0,
                        help="seconds each run idles with its actors alive while its Ray's CPU is measured "
                             "(default 10; 0 skips it)")
    parser.add_argument("--against", metavar="DIR",
                        help="also run start_local of the Atoll checkout in DIR in every round, alternated")
    args = parser.parse_args()
    ways = WAYS
    if args.against:
        against = str(Path(args.against).resolve())
        if not (Path(against) / "controller" / "actors.py").is_file():
            sys.exit(f"--against {args.against}: no Atoll checkout there (no controller/actors.py)")
        ways = (*WAYS, against)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    runs: dict[str, list[dict]] = {w: [] for w in ways}
    for i in range(args.rounds):
        for way in ways if i % 2 == 0 else reversed(ways):
            runs[way].append(one(way, args.idle))
    for way in ways:
        med = {s: statistics.median(r[s] for r in runs[way]) for s in STEPS}
        total = statistics.median(sum(r[s] for s in STEPS) for r in runs[way])
        cpu = statistics.median(r["cpu"] for r in runs[way])
        print(f"{way:6s} median of {args.rounds}: ray.init {med['init']:.2f} s, two actors ready "
              f"{med['actors']:.2f} s, shutdown {med['shutdown']:.2f} s, all three {total:.2f} s; "
              f"CPU of every process from the driver's start to the actors ready {cpu:.2f} s")
        if args.idle:
            names = sorted({n for r in runs[way] for n in r["idle"]})
            by_name = {n: statistics.median(r["idle"].get(n, 0.0) for r in runs[way]) for n in names}
            whole = statistics.median(sum(r["idle"].values()) for r in runs[way])
            pss = statistics.median(r["pss"] for r in runs[way])
            print(f"       idle, CPU of its Ray and driver: {whole:.1f} ms a second; their memory {pss:.0f} MB (PSS) "
                  "(medians: "
                  + ", ".join(f"{n} {v:.1f}" for n, v in sorted(by_name.items(), key=lambda kv: -kv[1]) if v >= 0.05)
                  + ")")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
