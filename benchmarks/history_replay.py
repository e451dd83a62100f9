"""How much a program gains by remembering a demand history's repeats within one pass.

An inventory run on a user's demand history draws its trajectories as chains of blocks of that
history (`evaluators/domains/inventory/history.py`, `bootstrap`): one pass shows far more periods
than a short history holds, so every stretch of it recurs many times. A program that records, per
instance, which demand followed each run of a few demands inside a block, and orders exactly that
when the run comes back, orders with hindsight no real policy has. This script scores the domain's
seed (base-stock, tuned) and such a program through the real sandboxed evaluator on a synthetic
history (independent Poisson draws with a weekly peak: nothing a real forecast could learn beyond
the weekly mean), and prints both scores per split. The gap is the protocol's blind spot with short
histories, not a defect of either program.

    python3 benchmarks/history_replay.py [--periods 120 1095] [--splits search heldout]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.evaluator import Evaluator
from evaluators.sandbox.config import SandboxConfig
from evaluators.secrets import RunSecrets
from tests.userdata_files import write_demand

# The remembering program: for K to BLOCK-1 demands met in a row inside one block (the bootstrap's block),
# the demand that followed; where the continuation met so far is unique, it orders for exactly that demand
# over the lead time, else it plays base-stock.
REMEMBERS = '''import numpy as np

PARAMS = {"level": (15.0, 0.0, 80.0)}

K, BLOCK = 3, 7
_NEXT = {}   # (instance, demands in a row) -> the demand that followed (-1: more than one seen)
_ROWS = {}   # (instance, rows) -> [period, on_hand, pipeline, each row's demands met]


def _learn(key, seen, t):
    for row in seen:
        for k in range(K, BLOCK):
            inside = (t - k - 1) // BLOCK == (t - 1) // BLOCK
            if len(row) > k and inside and None not in row[-k - 1:]:
                g = (key,) + tuple(row[-k - 1:-1])
                _NEXT[g] = row[-1] if _NEXT.get(g, row[-1]) == row[-1] else -1


def policy(state, params):
    on_hand, pipe, t = state["on_hand"], state["pipeline"], int(state["period"])
    lead, n = state["lead_time"], len(on_hand)
    key = (lead, state["penalty"], state["mean_demand"])
    mem = _ROWS.get((key, n))
    if mem is None or mem[0] != t - 1:
        mem = [t, on_hand, pipe, [[] for _ in range(n)]]
    else:
        met = mem[1] + mem[2][:, 0] - on_hand   # demand, where none was lost
        for i in range(n):
            mem[3][i].append(int(met[i]) if on_hand[i] > 0 else None)
        _learn(key, mem[3], t)
    _ROWS[(key, n)] = [t, on_hand.copy(), pipe.copy(), mem[3]]
    orders = np.maximum(params["level"] - (on_hand + pipe.sum(axis=1)), 0).astype(float)
    if t // BLOCK != (t + lead) // BLOCK or t % BLOCK < K:
        return orders
    for i in range(n):
        last = mem[3][i][-(t % BLOCK):]
        if len(last) < t % BLOCK or None in last:
            continue
        future = []
        for _ in range(lead + 1):
            nxt = _NEXT.get((key,) + tuple(last))
            if nxt is None or nxt < 0:
                break
            future.append(nxt)
            last = last + [nxt]
        if len(future) == lead + 1:
            x = on_hand[i]
            for k in range(lead):
                x = max(x + pipe[i, k] - future[k], 0)
            orders[i] = max(future[lead] - x, 0)
    return orders
'''


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--periods", type=int, nargs="+", default=[120, 1095], help="history lengths, in periods")
    parser.add_argument("--splits", nargs="+", default=["search", "heldout"],
                        choices=["search", "validation", "heldout"])
    parser.add_argument("--secret", type=int, default=1, help="the run secret's seed (fixed, for a benchmark)")
    args = parser.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        for periods in args.periods:
            path = write_demand(Path(tmp) / f"demand{periods}.csv", periods=periods)
            options = {"search_periods": 200, "heldout_periods": 400, "warmup": 50,
                       "demand_history": {"path": str(path), "lead_times": [1, 2], "penalties": [9.0], "block": 7}}
            evaluator = Evaluator("inventory", options, SandboxConfig(wall_s=300),
                                  secrets=RunSecrets.fixed(args.secret))
            for split in args.splits:
                start = time.monotonic()
                honest = evaluator.evaluate("seed", evaluator.domain.seed_program, split)
                remembers = evaluator.evaluate("remembers", REMEMBERS, split)
                print(f"{periods:5d} periods  {split:10s}  base-stock {_score(honest)}  remembering {_score(remembers)}"
                      f"  ({time.monotonic() - start:.0f} s)", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _score(result) -> str:
    return f"{result.score:.4f}" if result.score is not None else f"{result.status.value}: {result.error[:80]}"


if __name__ == "__main__":
    main()
