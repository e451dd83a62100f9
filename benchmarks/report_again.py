"""What `atoll report` costs on a finished run, whose held-out results are all in its archive.

One tiny inventory run (2 evaluators, 8 search evaluations, its own held-out report at the
end) is made once; then `atoll report` on it is timed `--rounds` times, wall clock of the whole
command. With `--against DIR` each round also times the report of the Atoll checkout in DIR (an
older commit, say) on a copy of the same run, alternated, so both meet the same load. Each
report says whether it started a Ray of its own (a session folder in its own RAY_TMPDIR).

    unshare -n sh -c 'ip link set lo up && python3 benchmarks/report_again.py --rounds 5'
    git worktree add /tmp/atoll-old HEAD~1
    unshare -n sh -c 'ip link set lo up && python3 benchmarks/report_again.py --against /tmp/atoll-old'
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"run.max_wall_s": 240, "islands.count": 2, "evaluator.actors": 2, "domain.options.search_periods": 300,
         "domain.options.heldout_periods": 300, "domain.options.warmup": 50, "domain.options.search_trajectories": 2,
         "domain.options.heldout_trajectories": 2, "domain.options.tune_trials": 8, "domain.options.tune_batch": 4}


def atoll(root: str, args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller", *args], cwd=root,
                          env={**env, "PYTHONPATH": root}, capture_output=True, text=True, timeout=600, check=False)


def report(root: str, run_dir: Path, env: dict) -> tuple[float, bool]:
    """Seconds of one `atoll report` from `root`, and whether it started a Ray."""
    sessions = Path(tempfile.mkdtemp(prefix="atoll-b-"))  # short: Ray's sockets go in it
    try:
        start = time.perf_counter()
        proc = atoll(root, ["report", str(run_dir)], {**env, "RAY_TMPDIR": str(sessions)})
        seconds = time.perf_counter() - start
        started = (sessions / "ray").exists()
    finally:
        shutil.rmtree(sessions, ignore_errors=True)
    if proc.returncode:
        sys.exit(f"atoll report from {root} failed:\n{proc.stderr[-2000:]}")
    return seconds, started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="reports timed for each checkout (default 5)")
    parser.add_argument("--against", metavar="DIR", help="another Atoll checkout, its reports alternated with these")
    args = parser.parse_args()
    ways = {"this tree": str(ROOT), **({args.against: str(Path(args.against).resolve())} if args.against else {})}
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["ATOLL_LIBRARY"] = str(Path(tmp) / "library.duckdb")  # a library of its own: no warm start
        made = Path(tmp) / "run"
        sets = [arg for key, value in SMALL.items() for arg in ("--set", f"{key}={value}")]
        proc = atoll(str(ROOT), ["run", "configs/inventory.toml", "--run-dir", str(made), "--max-evals", "8", *sets],
                     env)
        if proc.returncode:
            sys.exit(f"the run failed:\n{proc.stderr[-2000:]}")
        runs = {}
        for name in ways:  # a copy each: a report writes into its run
            runs[name] = Path(tmp) / f"copy-{len(runs)}"
            shutil.copytree(made, runs[name])
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        found: dict[str, list[tuple[float, bool]]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, root in ways.items():
                found[name].append(report(root, runs[name], env))
        for name, times in found.items():
            seconds = [s for s, _ in times]
            print(f"{name}: atoll report on a finished run, median of {len(times)}: {statistics.median(seconds):.2f} s "
                  f"(range {min(seconds):.2f} to {max(seconds):.2f}); started a Ray in {sum(r for _, r in times)} "
                  f"of {len(times)}")
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
