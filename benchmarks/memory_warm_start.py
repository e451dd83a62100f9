"""Does memory across runs help? Inventory with the embedded mutator, four real runs.

1. run A: configs/inventory.toml, cold (it fills a fresh library: elites, skills);
2. run B: the same config, warm-started from A (A's elites first, A's skills replayed);
3. run C0: other instances (geometric demand instead of Poisson), cold;
4. run C: those instances, warm-started from A.

It prints how many search evaluations B needs to reach A's final best search score
(against A's own count), the same for C against C0, the skills learned and used, and
the held-out table of every run. A and B (and C0 and C) share `run.replay_seed`, so
each pair is scored on the same search data and the counts compare like with like.

    python3 benchmarks/memory_warm_start.py [--evals 48] [--keep DIR]

With --keep, a run already completed in DIR is kept (its held-out table printed again by
`atoll report`), so a call stopped half-way goes on where it stopped.

Runs `atoll` as subprocesses (each starts its own local Ray); the library is a fresh
file in the work directory, never the user's.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from store.library import Library  # noqa: E402
from store.library_query import run_library_query  # noqa: E402
from store.query import run_query  # noqa: E402

OTHER_INSTANCES = "[" + ", ".join(f'{{lead_time = {lead}, penalty = {p}, demand = "geometric"}}'
                                  for lead in (1, 2, 4) for p in (4, 19)) + "]"


RAY_DID_NOT_START = "Failed to connect to Ray cluster"  # a local Ray that did not come up (a loaded machine)


def _atoll(args: list[str], env: dict, tries: int = 3) -> tuple[str, float]:
    """Run `atoll ARGS`; a local Ray that fails to start (before the run exists) is tried again."""
    start = time.monotonic()
    for _ in range(tries):
        proc = subprocess.run([sys.executable, "-m", "controller", *args], cwd=ROOT, env=env, text=True,
                              capture_output=True)
        if proc.returncode == 0 or RAY_DID_NOT_START not in proc.stderr:
            break
        print(f"  (Ray did not start; trying atoll {args[0]} again)", flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"atoll {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout, time.monotonic() - start


def _trajectory(run_dir: Path) -> list[float]:
    """Best-so-far search score after each search evaluation, in commit order (failures count)."""
    _, rows, _ = run_query(run_dir, "SELECT e.status, e.score FROM evaluations e JOIN programs p USING (program_id) "
                                    "WHERE e.split = 'search' AND p.mutator NOT LIKE 'baseline:%' ORDER BY p.seq")
    best, out = float("-inf"), []
    for status, score in rows:
        if status == "OK" and score is not None:
            best = max(best, score)
        out.append(best)
    return out


def _reach(trajectory: list[float], target: float) -> int | None:
    """Evaluations until the best-so-far first reaches `target` (None: never)."""
    return next((i + 1 for i, best in enumerate(trajectory) if best >= target - 1e-12), None)


def _completed(run_dir: Path) -> bool:
    if not (run_dir / "archive.duckdb").exists():
        return False
    _, rows, _ = run_query(run_dir, "SELECT status FROM runs")
    return rows == [("completed",)]


def _heldout_table(stdout: str) -> str:
    lines = stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if "held-out split (" in line), None)
    return "\n".join(lines[start:]) if start is not None else "(no held-out table printed)"


def _compare(label: str, cold: str, warm: str, trajectories: dict) -> None:
    target = trajectories[cold][-1]
    reached = _reach(trajectories[warm], target)
    print(f"{label}: {cold}'s final best search score {target:.5f}, first reached after "
          f"{_reach(trajectories[cold], target)} of its {len(trajectories[cold])} evaluations; {warm} "
          + (f"reached it after {reached} evaluations" if reached else
             f"did not reach it in {len(trajectories[warm])} evaluations")
          + f" and ended at {trajectories[warm][-1]:.5f}")
    for n in (1, 5, 10, 20, 40, len(trajectories[cold])):
        if n <= min(len(trajectories[cold]), len(trajectories[warm])):
            print(f"  best after {n:3d} evaluations: {cold} {trajectories[cold][n - 1]:.5f}   "
                  f"{warm} {trajectories[warm][n - 1]:.5f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--evals", type=int, default=48, help="search evaluations per run")
    parser.add_argument("--replay-seed", type=int, default=11, help="run.replay_seed shared by each pair")
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    args = parser.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="atoll-memory-"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), ATOLL_LIBRARY=str(work / "library.duckdb"))
    common = ["configs/inventory.toml", "--max-evals", str(args.evals), "--set", f"run.replay_seed={args.replay_seed}"]
    warm = ["--set", "memory.warm_start=true", "--set", f'memory.warm_from=["{work / "A"}"]']
    other = ["--set", f"domain.options.search_instances={OTHER_INSTANCES}"]
    plan = {"A": [], "B": warm, "C0": other, "C": other + warm}
    print(f"load average at start: {os.getloadavg()}; {os.cpu_count()} CPUs; work directory {work}")
    outputs, trajectories = {}, {}
    for name, extra in plan.items():
        if _completed(work / name):  # kept from an earlier call with the same --keep: its table again
            outputs[name], seconds = _atoll(["report", str(work / name)], env)
            print(f"run {name}: kept from before", flush=True)
        else:
            outputs[name], seconds = _atoll(["run", *common, "--run-dir", str(work / name), *extra], env)
        trajectories[name] = _trajectory(work / name)
        print(f"run {name}: {len(trajectories[name])} evaluations, best {trajectories[name][-1]:.5f}, "
              f"{seconds:.0f} s (load average now {os.getloadavg()[0]:.1f})", flush=True)
    print()
    _compare("same config", "A", "B", trajectories)
    _compare("other instances (geometric demand)", "C0", "C", trajectories)
    library = Library(work / "library.duckdb")
    _, rows, _ = run_library_query(library, "SELECT run_id, count(*), count(*) FILTER (WHERE success) "
                                            "FROM skill_uses GROUP BY 1 ORDER BY 1")
    _, learned, _ = run_library_query(library, "SELECT run_id, count(*) FROM skill_sightings GROUP BY 1 ORDER BY 1")
    print(f"\nskills learned per run (validated on the validation split): {learned}")
    print(f"skill uses per run (uses, successes): {rows}")
    for name in plan:
        print(f"\n--- run {name} ---\n{_heldout_table(outputs[name])}")
    print(json.dumps({"load_average_end": os.getloadavg()}))


if __name__ == "__main__":
    main()
