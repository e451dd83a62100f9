"""What one Ray actor call costs on this machine, alone and in batches.

The search loop makes two actor calls per proposal (the mutator or LLM worker, then the
evaluator). This script measures the floor of such a call: an actor method that returns its
argument (a 2 KB program and two small fields, like an evaluation job), called with four calls
in flight over two actors, the way the loop keeps its evaluators busy. It prints wall time and
the CPU of every process on the machine (driver, actors, raylet, GCS) per job, for one job per
call and for batches of jobs per call (returned as one list, and returned one by one as a
streaming generator yields them: the form that would keep the loop's rule that an actor's
oldest unfinished job is the one it was running), then what Ray's processes cost the machine each second
while the two actors sit idle (what a run pays for Ray whatever its evaluations cost), against
the machine's own before Ray starts, and the load average around the run.

    unshare -n sh -c 'ip link set lo up && python3 benchmarks/ray_call_cost.py'
"""
from __future__ import annotations

import argparse
import os
import time

import ray

JOB = ("x" * 2000, "search", None)


@ray.remote(num_cpus=1)
class Echo:
    def one(self, job):
        return job

    def many(self, jobs):
        return list(jobs)

    def each(self, jobs):
        """The jobs back one at a time (a streaming generator: the caller sees each as it is yielded)."""
        for job in jobs:
            yield job


def busy_cpu_s() -> float:
    """CPU seconds the whole machine spent busy so far (every process, kernel threads included)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run(actors: list, jobs: int, batch: int, in_flight: int = 4, streaming: bool = False) -> None:
    """`jobs` jobs through the actors, `batch` per call, `in_flight` calls at a time; `streaming`:
    each job of a batch comes back as its own object, as it is yielded."""
    pending, sent, done = [], 0, 0
    while done < jobs:
        while len(pending) < in_flight and sent < jobs:
            actor = actors[(sent // batch) % len(actors)]
            if streaming:
                pending.append(actor.each.options(num_returns="streaming").remote([JOB] * batch))
            else:
                pending.append(actor.one.remote(JOB) if batch == 1 else actor.many.remote([JOB] * batch))
            sent += batch
        if streaming:
            for ref in pending.pop(0):
                ray.get(ref)
                done += 1
            continue
        ready, pending = ray.wait(pending, num_returns=1)
        result = ray.get(ready[0])
        done += 1 if batch == 1 else len(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4000, help="jobs per measurement (default 4000)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8], help="jobs per call to measure")
    parser.add_argument("--idle-s", type=float, default=10.0, help="seconds of idle Ray to measure (default 10)")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    cpu = busy_cpu_s()
    time.sleep(args.idle_s)
    print(f"before Ray starts: {(busy_cpu_s() - cpu) / args.idle_s * 1e3:.1f} ms of machine CPU per second")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    actors = [Echo.remote(), Echo.remote()]
    ray.get([a.one.remote(JOB) for a in actors])
    run(actors, 400, 1)  # warm: workers, connections
    for streaming in (False, True):
        for batch in args.batches:
            if streaming and batch == 1:
                continue
            cpu, start = busy_cpu_s(), time.perf_counter()
            run(actors, args.jobs, batch, streaming=streaming)
            wall, cpu = time.perf_counter() - start, busy_cpu_s() - cpu
            print(f"{batch} job(s) per call{', each returned as yielded' if streaming else ''}: "
                  f"{wall / args.jobs * 1e6:6.0f} us wall, {cpu / args.jobs * 1e6:6.0f} us of machine CPU per job")
    cpu = busy_cpu_s()
    time.sleep(args.idle_s)
    print(f"idle, two actors: {(busy_cpu_s() - cpu) / args.idle_s * 1e3:.1f} ms of machine CPU per second "
          "(Ray's processes, and anything else running)")
    ray.shutdown()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
