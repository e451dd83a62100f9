"""How steady each solve-time clock is, alone and beside other busy processes.

Solves the first held-out instances (of at least 0.5 s) of a MILP config `--repeats` times with
SCIP's own pscost rule, under the domain's protocol, and reads two clocks on
every solve: SCIP's wall clock and the process's CPU time (user + system, what
the domain's "cpu" clock reads). It does this twice: alone, then beside
`--load` processes that keep solving another instance (as a second evaluator
and the controller do during a run). Prints per instance and condition each
clock's median and spread (max / min - 1), then the median spread per clock
and condition. The same solves are timed by both clocks, so the difference
between them is the clock, not the machine's mood.

    python3 benchmarks/milp_clock_noise.py [--config configs/milp_setcover.toml] [--instances 3]
        [--repeats 4] [--load 2]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.domains.milp.scip import POLICY_PRIORITY, new_model  # noqa: E402
from evaluators.registry import get_domain  # noqa: E402


def _solve(path: str, limit_s: float) -> tuple[float, float]:
    """(SCIP wall seconds, process CPU seconds) of one pscost solve."""
    model = new_model(path, 0, limit_s, clock="wall")
    model.setParam("branching/pscost/priority", POLICY_PRIORITY)
    before = os.times()
    model.optimize()
    after = os.times()
    wall = float(model.getSolvingTime())
    model.freeProb()
    return wall, (after.user - before.user) + (after.system - before.system)


def _busy(path: str, limit_s: float, stop) -> None:
    while not stop.is_set():
        _solve(path, limit_s)


def _spread(values: list[float]) -> float:
    return max(values) / max(min(values), 1e-9) - 1.0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/milp_setcover.toml", help="a MILP domain config")
    parser.add_argument("--instances", type=int, default=3, help="held-out instances to time")
    parser.add_argument("--repeats", type=int, default=4, help="solves per instance and condition (at least 2)")
    parser.add_argument("--load", type=int, default=2, help="busy solving processes in the loaded condition")
    args = parser.parse_args(argv)
    if args.repeats < 2 or args.instances < 1 or args.load < 1:
        parser.error("need --repeats >= 2, --instances >= 1 and --load >= 1")
    options = tomllib.loads(Path(args.config).read_text())["domain"]["options"]
    domain = get_domain("milp", **options)
    limit = domain.config.time_limit_s
    runs = domain.runs("heldout")
    paths = [run.path for run in runs if run.scip_seed == 0]
    # instances solved in well under a second show the clocks' 10 ms ticks more than the machine
    timed = [path for path in paths if _solve(path, limit)[0] >= 0.5][:args.instances]
    if not timed:
        parser.error("no held-out instance of this config takes half a second; nothing to time")
    filler = paths[-1]
    spreads: dict[tuple[str, str], list[float]] = {}
    print(f"{'condition':10s} {'instance':>8s} {'wall median':>12s} {'wall spread':>12s} "
          f"{'cpu median':>11s} {'cpu spread':>11s}")
    for condition in ("alone", f"load {args.load}"):
        stop, workers = mp.Event(), []
        if condition != "alone":
            workers = [mp.Process(target=_busy, args=(filler, limit, stop), daemon=True) for _ in range(args.load)]
            for w in workers:
                w.start()
        try:
            for k, path in enumerate(timed):
                pairs = [_solve(path, limit) for _ in range(args.repeats)]
                walls, cpus = [w for w, _ in pairs], [c for _, c in pairs]
                spreads.setdefault((condition, "wall"), []).append(_spread(walls))
                spreads.setdefault((condition, "cpu"), []).append(_spread(cpus))
                print(f"{condition:10s} {k:8d} {statistics.median(walls):11.2f}s {_spread(walls):12.0%} "
                      f"{statistics.median(cpus):10.2f}s {_spread(cpus):11.0%}", flush=True)
        finally:
            stop.set()
            for w in workers:
                w.join(timeout=120)
    for (condition, clock), values in spreads.items():
        print(f"median spread, {condition}, {clock} clock: {statistics.median(values):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
