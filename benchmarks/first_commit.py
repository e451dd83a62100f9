"""What the first commit of a run costs its driver, in a fresh process: the archive's first write.

Every `atoll run` and `resume` is a fresh driver whose first commit builds the archive's first
Arrow tables. Each round starts a fresh process that opens a new archive, then commits 10
programs with their evaluations and an event, as the loop's first commit does, and prints the
CPU and wall time of that commit and whether it imported pandas (pyarrow does, to look for
pandas objects among Python values and to guess a column's type, unless told otherwise:
`store/arrow.py`). With `--against DIR` each round also runs the same in the Atoll checkout
DIR (an older commit, say), alternated, so both meet the same load.

    python3 benchmarks/first_commit.py --rounds 8
    git worktree add /tmp/atoll-old HEAD~1 && python3 benchmarks/first_commit.py --against /tmp/atoll-old
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ONE = r'''
import json, sys, time
sys.path.insert(0, sys.argv[1])
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

pairs = [(Candidate(f"p{i}", "r1", i % 2, 1, ("p0",) if i else (), f"def policy(s, p):\n    return {i}\n",
                    "seed" if i == 0 else "embedded:perturb_const", time.time()),
          EvalResult(f"p{i}", "search", Status.OK, score=-1.0 / (i + 1), metrics={"cost": 1.0 / (i + 1)},
                     instance_scores=(-1.0, -0.5), descriptors=(0.1, 0.2), duration_s=0.1))
         for i in range(10)]
with DuckDBArchive(sys.argv[2] + "/archive.duckdb") as archive:
    archive.create_run("r1", {"run": {"name": "bench"}}, "")
    cpu, wall = time.process_time(), time.perf_counter()
    archive.write("r1", pairs=pairs, events=[("started", {"pid": 1})])
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"cpu_ms": 1000 * cpu, "wall_ms": 1000 * wall, "pandas": "pandas" in sys.modules}))
'''


def one(root: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run([sys.executable, "-c", ONE, root, tmp], env=env, cwd="/", capture_output=True,
                              text=True, timeout=120, check=False)
    if proc.returncode:
        sys.exit(f"the run in {root} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="fresh processes for each checkout (default 8)")
    parser.add_argument("--against", metavar="DIR", help="another Atoll checkout, run alternated with this one")
    args = parser.parse_args()
    ways = {"this tree": str(ROOT), **({args.against: str(Path(args.against).resolve())} if args.against else {})}
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    found: dict[str, list[dict]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, root in ways.items():
            found[name].append(one(root))
    for name, runs in found.items():
        cpu = statistics.median(r["cpu_ms"] for r in runs)
        wall = statistics.median(r["wall_ms"] for r in runs)
        pandas = sum(r["pandas"] for r in runs)
        print(f"{name}: first commit, median of {len(runs)}: {cpu:.1f} ms CPU, {wall:.1f} ms wall; "
              f"pandas imported in {pandas} of {len(runs)}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
