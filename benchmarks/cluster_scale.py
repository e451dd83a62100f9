"""Evaluations per second against the number of evaluator actors, on a simulated multi-node Ray.

    unshare -n sh -c 'ip link set lo up && python benchmarks/cluster_scale.py'
    unshare -n sh -c 'ip link set lo up && python benchmarks/cluster_scale.py --actors 1,8,64 --cost 2 --rounds 4'
    unshare -n sh -c 'ip link set lo up && python benchmarks/cluster_scale.py --instant --actors 8,64'

The cluster is `ray.cluster_utils.Cluster`: --nodes raylets on this machine (the head
included), each declaring --cpus-per-node logical CPUs, so 64 one-CPU evaluator
actors spread over 8 "nodes" of a 2-core machine. The driver is the real run loop
(`controller.loop.Search`) in this process, with the real embedded mutator and archive.

Each evaluation is the fixed-cost user domain (benchmarks/fixed_cost.py): --cost
seconds of sleep in the evaluator plus one call of the program in its real sandbox,
so the ideal rate is actors / cost. The measured window starts once every actor is
ready (the search starts only then) and the first `actors` results are in (the seed,
then the pipeline filling), and ends before the last `actors` results (the drain, when no more are sent).

Printed per actor count: evaluations per second, ideal, efficiency, the mean time an
evaluation took inside its evaluator (sleep plus sandbox: what the actors cannot beat),
busy (the share of the actors' time spent evaluating: what the driver's dispatch
achieves), the driver's
own CPU time per candidate (this process: the loop, the mutators' replies, Ray's
threads, the DuckDB commits) and the nodes that evaluated. --instant replaces the
evaluator with an actor that answers at once (no sandbox, no sleep): what the driver
alone sustains, its ceiling.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np
import ray

from controller.actors import EVALUATOR_OPTIONS, where
from controller.config import read_domain_file, validate
from controller.loop import Search
from evaluators.secrets import RunSecrets
from store.duckdb_archive import DuckDBArchive
from store.records import EvalResult, Status
from tests.local_cluster import start_cluster, stop_cluster


@ray.remote(**EVALUATOR_OPTIONS)
class InstantEvaluator:
    """Answers at once with a score from the program's text: the driver's ceiling, not a measurement of scoring."""

    def __init__(self, *args):
        self.node = where()

    def evaluate(self, program_id: str, code: str, split: str, race=None) -> EvalResult:
        score = -int(hashlib.sha256(code.encode()).hexdigest()[:6], 16) / 16**6
        return EvalResult(program_id, split, Status.OK, score=score, instance_scores=(score,),
                          node_id=self.node[0], node_ip=self.node[1])


class Timed(Search):
    """The run loop, noting when each search result arrived and the driver's CPU time then."""

    instant = False

    def _new_evaluator(self):
        if self.instant:
            return InstantEvaluator.remote()
        return super()._new_evaluator()

    def _fill(self, searching):
        if hasattr(self, "all_ready"):  # nothing starts until every actor is up: the window sees them all
            super()._fill(searching)

    def _arrived(self, probes):
        super()._arrived(probes)
        if len(self.load) == len(self.evaluators) and not hasattr(self, "all_ready"):
            self.all_ready = (time.monotonic(), time.process_time())

    def _on_eval(self, candidate, result):
        super()._on_eval(candidate, result)
        self.__dict__.setdefault("marks", []).append((time.monotonic(), time.process_time(), result.node_id,
                                                      result.duration_s))


def config_for(args, actors: int):
    tree = {"run": {"name": "scale", "max_evals": actors * (args.rounds + 2) + 1, "max_wall_s": 3600},
            # one simulate() per evaluation, whatever PARAMS a mutation adds (tuning would repeat it)
            "domain": {"path": "fixed_cost.py", "options": {"cost_s": args.cost, "instances_per_split": 2,
                                                            "tune_trials": 1, "tune_batch": 1}},
            "islands": {"count": 4},
            "mutator": {"workers": max(1, actors // 8)},
            "evaluator": {"actors": actors, "sandbox": {"wall_s": 60 + args.cost}},
            "controller": {"commit_every_s": 0.5, "snapshot_every_s": 5, "heldout_on_new_best": False}}
    return validate(read_domain_file(tree, ROOT / "benchmarks"))


def measure(args, actors: int, folder: Path) -> dict:
    config = config_for(args, actors)
    with DuckDBArchive(folder / f"a{actors}.duckdb") as archive:
        archive.create_run("scale", config.model_dump(mode="json"))
        search = Timed(config, archive, "scale", folder, secrets=RunSecrets.fixed(1))
        search.instant = args.instant
        try:
            status = search.run()
        finally:
            for actor in search.evaluators + search.mutators:
                ray.kill(actor)
    assert status == "completed", status
    after = [m for m in search.marks if m[0] > search.all_ready[0]]
    window = after[actors - 1:len(after) - actors]  # after the first round, before the drain
    # results come in waves (the actors start together): the slope of the count against time
    # (and of the driver's CPU time against the count) over the whole window, not its two ends
    times, cpus = np.array([m[0] for m in window]), np.array([m[1] for m in window])
    rate = float(np.polyfit(times - times[0], np.arange(len(window)), 1)[0])
    cpu_per = float(np.polyfit(np.arange(len(window)), cpus, 1)[0])
    duration = sum(m[3] for m in window) / len(window)  # as the evaluator measured it: sleep plus sandbox
    ideal = actors / args.cost if args.cost > 0 and not args.instant else float("nan")  # no sleep: no ideal
    return {"actors": actors, "evals": len(window), "rate": rate, "ideal": ideal, "efficiency": rate / ideal,
            "cpu_ms": 1000 * cpu_per, "eval_s": duration, "busy": rate * duration / actors, "nodes": len({m[2] for m in after})}


def _stop(signum, frame):
    raise KeyboardInterrupt  # SIGTERM: shut the simulated cluster down on the way out


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--actors", default="1,2,4,8,16,32,64", help="comma-separated actor counts")
    parser.add_argument("--nodes", type=int, default=8, help="raylets, the head included")
    parser.add_argument("--cpus-per-node", type=int, default=8, help="logical CPUs each raylet declares")
    parser.add_argument("--cost", type=float, default=2.0, help="seconds each evaluation sleeps")
    parser.add_argument("--rounds", type=int, default=4, help="evaluations per actor in the measured window")
    parser.add_argument("--instant", action="store_true", help="evaluators that answer at once (driver ceiling)")
    args = parser.parse_args()
    counts = [int(n) for n in args.actors.split(",")]
    if max(counts) > args.nodes * args.cpus_per_node:
        parser.error(f"{max(counts)} actors need more than {args.nodes} x {args.cpus_per_node} CPUs")
    cluster = start_cluster(args.nodes, args.cpus_per_node)  # leaves the machine's other Rays alone
    temp = tempfile.mkdtemp(prefix="cs", dir="/tmp")  # the archives
    ray.init(address=cluster.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    print(f"load before: {os.getloadavg()[0]:.2f} (1-min), {os.cpu_count()} cores; {args.nodes} nodes x "
          f"{args.cpus_per_node} CPUs; cost {args.cost} s per evaluation" + (" (instant evaluators)" if args.instant
                                                                           else ""))
    print(f"{'actors':>6} {'evals':>6} {'evals/s':>8} {'ideal':>7} {'effic.':>7} {'eval s':>7} {'busy':>5} "
          f"{'driver CPU ms/cand':>19} {'nodes':>6}")
    try:
        for n in counts:
            r = measure(args, n, Path(temp))
            print(f"{r['actors']:>6} {r['evals']:>6} {r['rate']:>8.1f} {r['ideal']:>7.1f} {r['efficiency']:>7.0%} "
                  f"{r['eval_s']:>7.3f} {r['busy']:>5.0%} {r['cpu_ms']:>19.2f} {r['nodes']:>6}", flush=True)
    finally:
        print(f"load after: {os.getloadavg()[0]:.2f} (1-min)")
        ray.shutdown()
        stop_cluster(cluster)
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
