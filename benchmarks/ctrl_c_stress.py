"""Ctrl-C at random moments of live `atoll run`s: does every stop end cleanly?

Each round starts a small inventory run (commits every 20 ms, islands snapshotted every
50 ms, so a Ctrl-C often lands in a commit) in a process group of its own, sends SIGINT to
the group after a random delay in [--from, --to] seconds, then two more 0.01 to 0.5 s
apart, as a user pressing Ctrl-C again would. A round is clean when the run exits 130 (or
is ended by SIGINT's default action, -2, when the last Ctrl-C came after Python restored it
at exit) and printed no traceback. The script prints each round and the counts by exit
status; a round that is not clean also prints its stderr's end.

    unshare -n sh -c 'ip link set lo up && python3 benchmarks/ctrl_c_stress.py --rounds 24'
    # Ray's own start, 1.5 to 5 s after the command began on a 2-core machine:
    unshare -n sh -c 'ip link set lo up && python3 benchmarks/ctrl_c_stress.py --rounds 16 --from 1.5 --to 5'
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"search_periods": 300, "heldout_periods": 300, "warmup": 50, "search_trajectories": 2,
         "heldout_trajectories": 2, "tune_trials": 8, "tune_batch": 4}
SETTINGS = {"run.max_wall_s": 240, "islands.count": 2, "evaluator.actors": 2, "controller.commit_every_s": 0.02,
            "controller.snapshot_every_s": 0.05, **{f"domain.options.{k}": v for k, v in SMALL.items()}}


def one_round(rng: random.Random, start: float, end: float) -> tuple[int, str]:
    """(exit status, stderr) of a run stopped by three Ctrl-Cs."""
    tmp = Path(tempfile.mkdtemp(prefix="atoll-ctrl-c-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), ATOLL_CACHE_DIR=str(tmp / "cache"),
               ATOLL_LIBRARY=str(tmp / "library.duckdb"))
    cmd = [sys.executable, "-m", "controller", "run", "configs/inventory.toml", "--run-dir", str(tmp / "run"),
           "--max-evals", "400", "--no-report"]
    for key, value in SETTINGS.items():
        cmd += ["--set", f"{key}={value}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(rng.uniform(start, end))
        for pause in (0.0, rng.uniform(0.01, 0.5), rng.uniform(0.01, 0.5)):
            time.sleep(pause)
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:  # it ended already
                break
        _, err = proc.communicate(timeout=180)
        return proc.returncode, err
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--from", dest="start", type=float, default=1.0, help="earliest first Ctrl-C, s after start")
    parser.add_argument("--to", dest="end", type=float, default=12.0, help="latest first Ctrl-C, s after start")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    counts: Counter = Counter()
    for i in range(args.rounds):
        status, err = one_round(rng, args.start, args.end)
        clean = status in (130, -signal.SIGINT) and "Traceback" not in err
        counts[(status, "clean" if clean else "NOT CLEAN")] += 1
        print(f"round {i + 1}: exit {status} {'clean' if clean else 'NOT CLEAN'}", flush=True)
        if not clean:
            print(err[-3000:], flush=True)
    print("exit status, verdict, rounds:")
    for (status, verdict), n in sorted(counts.items()):
        print(f"  {status:>4}  {verdict:<9}  {n}")
    return 0 if all(verdict == "clean" for _, verdict in counts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
