"""What one period's frame costs on the wire: the list form against the flat form, side by side.

    python3 benchmarks/wire_frames.py [--rows 128] [--leads 1 2 3 4 2 3]

The batches are shaped like the default inventory evaluation's (one per instance, each with
`rows` rows: trajectories x trials). Printed per step, the best of several timings in µs:
packing the request (trusted side), decoding it (the candidate's side), packing the reply
(candidate) and reading it with every check (trusted side), then the policy's own calls.
"""
from __future__ import annotations

import argparse
import os
import sys
import timeit
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluators.sandbox import replies, wire  # noqa: E402
from evaluators.sandbox.process import reply_bounds  # noqa: E402


def best_us(fn, number: int = 300, repeat: int = 9) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def policy(state, params):
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    return np.maximum(params["level"] - position, 0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--leads", type=int, nargs="+", default=[1, 2, 3, 4, 2, 3])
    args = parser.parse_args(argv)
    rows = args.rows
    batches = [(dict(lead_time=lead, penalty=9.0, holding=1.0, mean_demand=5.0, on_hand=np.zeros(rows, np.int64),
                     pipeline=np.zeros((rows, lead), np.int64), period=3), {"level": np.full(rows, 15.0)})
               for lead in args.leads]
    actions = [np.asarray(policy(s, p), dtype=float) for s, p in batches]
    items, _ = reply_bounds(batches)
    listed, flat = wire.pack({"batches": batches}), wire.pack(wire.flat_batches(batches))
    list_reply, flat_reply = wire.pack({"actions": actions}), wire.pack(wire.flat_actions(actions))
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {len(batches)} batches of {rows} rows")
    print(f"{'step (µs)':34} {'list form':>10} {'flat form':>10}")
    steps = [
        ("pack the request", lambda: wire.pack({"batches": batches}),
         lambda: wire.pack(wire.flat_batches(batches))),
        ("decode it (candidate)", lambda: wire.unpack(listed[4:])["batches"],
         lambda: wire.unflatten(wire.unpack(flat[4:])["flat"])),
        ("pack the reply (candidate)", lambda: wire.pack({"actions": actions}),
         lambda: wire.pack(wire.flat_actions(actions))),
        ("read the reply, every check", lambda: replies.read_reply(list_reply[4:], items),
         lambda: replies.read_reply(flat_reply[4:], items)),
    ]
    total = [0.0, 0.0]
    for name, as_list, as_flat in steps:
        a, b = best_us(as_list), best_us(as_flat)
        total = [total[0] + a, total[1] + b]
        print(f"{name:34} {a:10.1f} {b:10.1f}")
    print(f"{'together':34} {total[0]:10.1f} {total[1]:10.1f}")
    print(f"{'reply bounds (both forms)':34} {best_us(lambda: reply_bounds(batches)):10.1f}")
    print(f"{'the policy calls themselves':34} {best_us(lambda: [policy(s, p) for s, p in batches]):10.1f}")
    print(f"frame bytes: request {len(listed)} / {len(flat)}, reply {len(list_reply)} / {len(flat_reply)}")


if __name__ == "__main__":
    main()
