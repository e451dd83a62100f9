"""How much of a MILP solve the branching rule can change, and how much timing noise hides it.

For each held-out instance of a MILP config, solves with SCIP's own pscost rule
(in C, no sandbox) under the domain's protocol: once stopped after the root node
(`limits/nodes = 1`: LP, cuts, root heuristics; no branching decision has an
effect yet), then `--repeats` times to the end. Prints per instance the root's
time, the whole solve's median time, nodes, and the spread of the repeats
(max / min - 1), then the shares over all instances. Run it on an idle machine.

    python3 benchmarks/milp_root_share.py [--config configs/milp_setcover.toml] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.domains.milp.scip import POLICY_PRIORITY, new_model  # noqa: E402
from evaluators.registry import get_domain  # noqa: E402


def _solve(path: str, seed: int, limit_s: float, nodes: int = -1) -> tuple[float, int]:
    model = new_model(path, seed, limit_s)
    model.setParam("branching/pscost/priority", POLICY_PRIORITY)
    model.setParam("limits/nodes", nodes)
    model.optimize()
    result = float(model.getSolvingTime()), int(model.getNNodes())
    model.freeProb()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/milp_setcover.toml", help="a MILP domain config")
    parser.add_argument("--repeats", type=int, default=3, help="whole solves per instance (at least 2)")
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats must be at least 2 to show a spread")
    options = tomllib.loads(Path(args.config).read_text())["domain"]["options"]
    domain = get_domain("milp", **options)
    limit = domain.config.time_limit_s
    roots, wholes, spreads = [], [], []
    print(f"{'instance':28s} {'root s':>7s} {'whole s':>8s} {'nodes':>6s} {'root share':>10s} {'spread':>7s}")
    for label, path, _, seed in domain.runs("heldout"):
        root, _ = _solve(path, seed, limit, nodes=1)
        runs = [_solve(path, seed, limit) for _ in range(args.repeats)]
        times = [t for t, _ in runs]
        whole = statistics.median(times)
        spread = max(times) / max(min(times), 1e-9) - 1.0
        roots.append(root)
        wholes.append(whole)
        spreads.append(spread)
        print(f"{label:28s} {root:7.2f} {whole:8.2f} {runs[0][1]:6d} {min(root / max(whole, 1e-9), 1.0):10.0%} "
              f"{spread:7.0%}", flush=True)
    print(f"root share of total time: {sum(roots) / max(sum(wholes), 1e-9):.0%}; "
          f"median spread of {args.repeats} repeats: {statistics.median(spreads):.0%}, "
          f"largest {max(spreads):.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
