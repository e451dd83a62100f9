"""The search loop's own cost per proposal, measured the way its peers are measured.

A trivial user domain (the program returns a constant x; the score is -(x - 3.7)^2),
an OpenAI-compatible server on loopback that answers at once with a SEARCH/REPLACE
edit moving the constant by a random step, 2 evaluators, and the whole real loop:
`atoll run` in a subprocess (real Ray, real DuckDB archive, every candidate in a fresh
sandboxed process). Twice: with a no-op evaluation, and with an evaluation that burns
200 ms of CPU in a pure-Python loop (on the trusted side, inside the domain's simulator).

    unshare -n sh -c 'ip link set lo up && python3 benchmarks/loop_overhead.py [--proposals 200 1000]'

Printed per case: proposals/s (N / wall), overhead per proposal in ms
((wall - sum of evaluation work / 2) / N, the work being the 200 ms the domain burns,
0 for no-op), evaluations/s against the ideal 10 (200 ms case), peak memory of the
whole process tree (driver, Ray's processes and workers, fork servers, sandboxes: the
sum of their RSS, sampled every 250 ms, and of their PSS, read when that sum reaches a new
high, at most every 4 s), the cost per proposal in each fifth of the run (the wall
overhead by fifth of the proposals, and the CPU of every process by fifth of the
evaluations, between commits), and the load average. The wall runs from the first proposal's arrival to the last
commit (Ray's start-up and the seed's evaluation are printed apart).
On a virtual machine whose cores are shared, the same code's CPU per proposal moves by up to
a third from one run to the next, every process alike, whatever the load average says: with
`--repeats N` each case runs N times and a summary prints the medians and ranges; with
`--compare-env NAME=VALUE` every repeat also runs with that setting in `atoll run`'s
environment (alternated, so both meet the same machine) and the summary sets the two side
by side.
The held-out check of new bests is off (peers have none); the LLM server runs in
this process, outside the measured tree.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb
import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
PEERS = ("peers, same method, 2 cores: OpenEvolve 0.4 (in-process, no sandbox): 105 proposals/s, 9.5 ms, "
         "8.1/10 evals/s, 207 MB, cost per iteration 5 -> 18 ms over 1,000; ShinkaEvolve 0.0.7 (a subprocess "
         "per evaluation): 6.6 proposals/s, 152 ms, 2.4/10 (4.4 with its job cap lifted), 244 MB")
# CPU and RSS every 250 ms; the tree's process list every second (its processes live long: each
# candidate's is counted in its fork server's reaped children); PSS, the dearest (the kernel walks
# every mapping), only when the RSS sum is 1% above what it was at the last PSS reading, and at
# most every 4 s: once the tree's memory levels off, the sampling stops paying for it
SAMPLE_S, LIST_EVERY, PSS_EVERY, PSS_RISE = 0.25, 4, 16, 1.01
TARGET = "target (sandbox fully on): <= 5 ms overhead, >= 200 proposals/s no-op, >= 9.5/10 evals/s at 200 ms, flat"

DOMAIN = '''\
"""A constant to find: the program returns x, the score is -(x - 3.7)^2."""
import time

from pydantic import Field

from evaluators.simple import SimpleDomain, SimpleOptions

SEED = """X = 0.0


def guess(state, params):
    return X
"""


class ConstOptions(SimpleOptions):
    work_ms: float = Field(0.0, ge=0, description="CPU milliseconds each evaluation burns in pure Python.")


class Const(SimpleDomain):
    name = "const"
    entry_point = "guess"
    config_model = ConstOptions
    seed_program = SEED
    baseline_programs = {"zero": SEED}
    action_shape = ()
    action_bounds = (-1e9, 1e9)

    def instances(self, split, rng):
        return [float(rng.random())]

    def simulate(self, instances, policy):
        actions = policy([{"t": 0.0} for _ in instances])
        end, n = time.process_time() + self.config.work_ms / 1000, 0
        while time.process_time() < end:  # the evaluation's work: a pure-Python loop
            for i in range(2000):
                n += i
        return [-(a - 3.7) ** 2 for a in actions]
'''

CONFIG = """
[run]
name = "loop-overhead"
max_evals = {evals}
max_wall_s = 3600

[domain]
path = "const.py"

[domain.options]
work_ms = {work_ms}

[islands]
count = 2

[mutator.llm]
weights = {{ embedded = 0.0 }}

[[mutator.llm.models]]
backend = "openai"
name = "loopback"
base_url = "{url}"
model = "step"
max_in_flight = {llm_in_flight}
timeout_s = 30
max_tokens = 64

[evaluator]
actors = 2

[controller]
heldout_on_new_best = false
"""


class StepServer:
    """Chat completions on 127.0.0.1: every reply moves the current program's constant by a random step."""

    def __init__(self, seed: int = 0):
        rng, lock = np.random.default_rng(seed), threading.Lock()
        self.count = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][-1]["content"]
                found = re.search(r"## Current program\n```python\n(.*?)```", prompt, re.S)
                line = re.search(r"^X = .*$", found.group(1) if found else "", re.M)
                old = line.group(0) if line else "X = 0.0"
                with lock:
                    step = float(rng.normal(0, 0.5))
                    outer.count += 1
                value = float(old.split("=", 1)[1]) + step
                text = f"<<<<<<< SEARCH\n{old}\n=======\nX = {value!r}\n>>>>>>> REPLACE\n"
                data = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", "content": text}}],
                                   "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": 20,
                                             "total_tokens": len(prompt) // 4 + 20}}).encode()
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(data)).encode() + b"\r\n\r\n" + data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def tree_memory(procs: list, cpu: dict, roles: dict) -> int:
    """The sum of RSS of `procs` (a process and its descendants); records each one's CPU seconds in `cpu`."""
    rss = 0
    for p in procs:
        try:
            with p.oneshot():
                times, name, resident = p.cpu_times(), p.name(), p.memory_info().rss
                if roles.get(p.pid, ("",))[0] != name:  # Ray's workers take their actor's name after they start
                    roles[p.pid] = (name, _role(p))
        except psutil.Error:
            continue
        role = roles[p.pid][1]  # a fork server's reaped children are its candidates' processes
        extra = times.children_user + times.children_system if role == "fork server" else 0.0
        cpu[p.pid] = (role, times.user + times.system)
        if extra:
            cpu[-p.pid] = ("sandboxes", extra)
        rss += resident
    return rss


def tree_pss(procs: list) -> int:
    """The sum of PSS of `procs`: shared pages counted once over the tree."""
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except psutil.Error:
            continue
    return total


def _role(p: psutil.Process) -> str:
    line = " ".join(p.cmdline())
    for key, role in (("-m controller", "driver"), ("--zygote", "fork server"), ("gcs_server", "ray gcs"),
                      ("raylet", "raylet"), ("default_worker", "ray workers")):
        if key in line:
            return role
    name = p.name()
    return "ray::NodeEvaluator" if name.startswith("ray::NodeEval") else name[:20]


def run_case(url: str, evals: int, work_ms: float, llm_in_flight: int, extra: list[str],
             profile: str | None = None, env_extra: dict | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="atoll-loop-") as tmp:
        tmp = Path(tmp)
        (tmp / "const.py").write_text(DOMAIN)
        (tmp / "bench.toml").write_text(CONFIG.format(evals=evals, work_ms=work_ms, url=url,
                                                      llm_in_flight=llm_in_flight))
        env = dict(os.environ, PYTHONPATH=str(ROOT), ATOLL_CACHE_DIR=str(tmp / "cache"),
                   ATOLL_LIBRARY=str(tmp / "library.duckdb"), **(env_extra or {}))  # its own library, gone with it
        cmd = [sys.executable, "-m", "controller", "run", "bench.toml", "--run-dir", "run", "--no-report"]
        for item in extra:
            cmd += ["--set", item]
        if profile and profile.endswith(".pstats"):  # the driver alone, under cProfile
            cmd[1:3] = ["-c", "import cProfile, sys\nfrom controller.cli import main\nprof = cProfile.Profile(__import__(\"time\").thread_time)\n"
                        "try:\n    prof.runcall(main, sys.argv[2:])\nfinally:\n    prof.dump_stats(sys.argv[1])",
                        str(Path(profile).resolve())]
        elif profile:  # every process of the tree, as collapsed stacks (py-spy's raw format)
            cmd = ["py-spy", "record", "--subprocesses", "--nonblocking", "-r", "200", "-f", "raw",
                   "-o", str(Path(profile).resolve() / f"loop-{evals - 1}-{work_ms:g}ms.txt"), "--", *cmd]
        start, peak, peak_pss, cpu, timeline, roles, sampling = time.monotonic(), 0, 0, {}, [], {}, 0.0
        pss_rss, pss_at = 0, -PSS_EVERY  # the RSS sum at the last PSS reading, and that sample's number
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:
            began = time.thread_time()
            if len(timeline) % LIST_EVERY == 0:
                procs = [watched, *watched.children(recursive=True)]
            rss = tree_memory(procs, cpu, roles)
            if rss > pss_rss * PSS_RISE and len(timeline) - pss_at >= PSS_EVERY:
                peak_pss, pss_rss, pss_at = max(peak_pss, tree_pss(procs)), rss, len(timeline)
            sampling += time.thread_time() - began
            cpu[0] = (_HERE, sum(os.times()[:2]))  # this process: the LLM server's threads and this sampling
            cpu[-1] = (_SAMPLING, sampling)  # of which the sampling
            peak = max(peak, rss)
            timeline.append((time.time(), {pid: seconds for pid, (_, seconds) in cpu.items()}))
            time.sleep(SAMPLE_S)
        output = proc.stdout.read()
        total = time.monotonic() - start
        if proc.returncode != 0:
            raise SystemExit(f"atoll run exited {proc.returncode}:\n{output[-3000:]}")
        found = figures(tmp / "run" / "archive.duckdb", work_ms / 1000)
        return dict(found, peak_mb=peak / 2**20, peak_pss_mb=peak_pss / 2**20, total_s=total, cpu=_by_role(cpu),
                    window=window_cpu(timeline, cpu, found["steady"], found["last"], found["steady_n"]),
                    window_n=found["steady_n"],
                    fifths_cpu=[_tree_total(window_cpu(timeline, cpu, t0, t1, m)) for t0, t1, m in found["fifths"]])


def _tree_total(by_role: dict) -> float:
    return sum(v for role, v in by_role.items() if role not in (_HERE, _SAMPLING))


def window_cpu(timeline: list, cpu: dict, t0: float, t1: float, n: int) -> dict:
    """CPU ms per proposal each role spent between t0 and t1 (epoch), from the 250 ms samples of
    every process (a process's role is the one it had last)."""
    times = np.array([t for t, _ in timeline])
    spent: dict = {}
    for pid, (role, _) in cpu.items():
        totals = np.array([by_pid.get(pid, 0.0) for _, by_pid in timeline])
        used = float(np.interp(t1, times, totals) - np.interp(t0, times, totals))
        spent[role] = spent.get(role, 0.0) + 1000 * used / n
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


_HERE, _SAMPLING = "benchmark process", "sampling"


def _by_role(cpu: dict) -> dict:
    roles: dict = {}
    for role, seconds in cpu.values():
        if role in (_HERE, _SAMPLING):
            continue
        roles[role] = roles.get(role, 0.0) + seconds
    return dict(sorted(roles.items(), key=lambda kv: -kv[1]))


def figures(archive: Path, work_s: float) -> dict:
    con = duckdb.connect(str(archive), read_only=True)
    rows = con.execute(
        "SELECT p.created_at, e.duration_s, e.status, e.created_at FROM programs p JOIN evaluations e "
        "ON e.program_id = p.program_id AND e.split = 'search' WHERE p.mutator <> 'seed' ORDER BY p.created_at"
    ).fetchall()
    last_commit = con.execute("SELECT max(created_at) FROM evaluations").fetchone()[0]
    seed_s = con.execute("SELECT e.duration_s FROM programs p JOIN evaluations e ON e.program_id = p.program_id "
                         "WHERE p.mutator = 'seed'").fetchone()[0]
    calls, duplicates = con.execute("SELECT count(*), count(*) FILTER (WHERE status = 'duplicate') "
                                    "FROM llm_calls").fetchone()
    con.close()
    created = np.array([r[0] for r in rows])
    n = len(rows)
    wall = last_commit - created[0]
    fifths = []
    for part in np.array_split(np.arange(n), 5):
        t1 = created[part[-1] + 1] if part[-1] + 1 < n else last_commit
        fifths.append(1000 * ((t1 - created[part[0]]) / len(part) - work_s / 2))
    commits = np.sort(np.array([r[3] for r in rows]))  # each evaluation's commit time
    t0, t1, between = _steady_window(commits)
    if not between:  # too short a run for two commits apart: from the second fifth's first proposal to the end
        t0, t1, between = float(created[n // 5]), float(last_commit), n - n // 5
    return {"n": n, "wall_s": wall, "steady": t0, "steady_n": between, "last": t1, "ok": sum(r[2] == "OK" for r in rows), "eval_s": float(np.mean([r[1] for r in rows])),
            "seed_s": seed_s, "fifths_ms": fifths, "fifths": _fifth_windows(commits),
            "calls": calls, "duplicates": duplicates,
            "overhead_ms": 1000 * (wall - n * work_s / 2) / n, "rate": n / wall}


def _fifth_windows(commits: np.ndarray) -> list[tuple[float, float, int]]:
    """(t0, t1, evaluations committed in (t0, t1]) for each fifth of the evaluations, between commits:
    from the first commit to the one that takes the run past a fifth, and so on to the last commit.
    Unlike the wall overhead by fifth of the proposals, neither the burst of proposals that fills
    the evaluators at the start nor the drain and last commit at the end weigh on one fifth alone."""
    times, counts = np.unique(commits, return_counts=True)
    done = np.cumsum(counts)
    edges = [float(times[0]), *(float(times[np.searchsorted(done, k * len(commits) / 5)]) for k in range(1, 5)),
             float(times[-1])]
    if len(set(edges)) < 6:  # too few commits for five windows
        return []
    return [(t0, t1, _committed_in(commits, t0, t1)) for t0, t1 in itertools.pairwise(edges)]


def _steady_window(commits: np.ndarray) -> tuple[float, float, int]:
    """(t0, t1, evaluations committed in (t0, t1]) for the CPU a proposal costs: from the commit that takes
    the run past a fifth of its evaluations to the one that takes it past nine tenths. Both ends are
    commits in mid-run, so the work in flight at either end (started before t0, or still running at t1)
    evens out; a window that ended at the last commit (nothing in flight) and began at a proposal's
    creation charged the evaluations queued before it to the proposals in it."""
    n = len(commits)
    if n < 10:
        return 0.0, 0.0, 0
    t0, t1 = float(commits[n // 5]), float(commits[(9 * n) // 10])
    return t0, t1, _committed_in(commits, t0, t1)


def _committed_in(commits: np.ndarray, t0: float, t1: float) -> int:
    """Evaluations committed in (t0, t1]."""
    return int(np.sum((commits > t0) & (commits <= t1)))


def show(label: str, work_ms: float, r: dict) -> None:
    print(f"{label}: {r['n']} proposals evaluated ({r['ok']} OK; {r['calls']} LLM calls, {r['duplicates']} duplicates)"
          f" in {r['wall_s']:.2f} s (whole command {r['total_s']:.1f} s, seed evaluation {r['seed_s']:.2f} s)")
    print(f"  proposals/s {r['rate']:.1f}   overhead per proposal {r['overhead_ms']:.1f} ms   "
          f"mean evaluation (evaluator's clock, sandbox included) {1000 * r['eval_s']:.1f} ms")
    if work_ms:
        print(f"  evaluations/s {r['rate']:.2f} of ideal {2000 / work_ms:.0f}")
    print(f"  peak memory of the process tree {r['peak_mb']:.0f} MB (sum of RSS, every {SAMPLE_S * 1000:.0f} ms; "
          f"{r['peak_pss_mb']:.0f} MB counting shared pages once, PSS, read as the RSS sum rose, at most every "
          f"{SAMPLE_S * PSS_EVERY:g} s)")
    here, sampling = r["window"].pop(_HERE, 0.0), r["window"].pop(_SAMPLING, 0.0)
    total = r["cpu_ms"] = sum(r["window"].values())
    print(f"  CPU per proposal, every process of the tree together, between the commits that take the run past "
          f"a fifth and nine tenths of its evaluations ({r['window_n']} evaluations; start-up and the end behind): "
          f"{total:.1f} ms (2 cores give at most {2000 / total:.0f} proposals/s at that cost): "
          + ", ".join(f"{k} {v:.2f}" for k, v in r["window"].items() if v >= 0.05))
    print(f"  beside the tree, on the same cores: this benchmark's own process (its loopback LLM server and the "
          f"sampling) {here:.2f} ms per proposal, of which the sampling {sampling:.2f} ms")
    print("  CPU seconds of the whole command by process: "
          + ", ".join(f"{k} {v:.1f}" for k, v in r["cpu"].items()))
    print("  overhead per proposal by fifth of the run (ms): " + ", ".join(f"{f:.1f}" for f in r["fifths_ms"])
          + " (wall; the first fifth's proposals fill the evaluators at once, the last waits for the drain and "
          "the last commit)")
    if r["fifths_cpu"]:
        print("  CPU per proposal by fifth of the evaluations, every process of the tree, between commits (ms): "
              + ", ".join(f"{f:.1f}" for f in r["fifths_cpu"]))


def summary(label: str, arms: dict) -> None:
    """Medians and ranges of each arm's runs of one case."""
    def spread(runs, key, fmt):
        values = [r[key] for r in runs]
        return f"{np.median(values):{fmt}} ({min(values):{fmt}} to {max(values):{fmt}})"
    for arm, runs in arms.items():
        print(f"{label}, {arm}, median of {len(runs)} (range): proposals/s {spread(runs, 'rate', '.1f')}, "
              f"overhead {spread(runs, 'overhead_ms', '.1f')} ms, "
              f"CPU per proposal {spread(runs, 'cpu_ms', '.1f')} ms")


def _env_setting(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proposals", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--work-ms", type=float, nargs="+", default=[0.0, 200.0],
                        help="CPU ms per evaluation for each case (default: 0 and 200)")
    parser.add_argument("--llm-in-flight", type=int, default=4, help="LLM requests in flight (max_in_flight)")
    parser.add_argument("--set", action="append", default=[], help="more config overrides for atoll run")
    parser.add_argument("--profile", metavar="DIR", help="record every process with py-spy into DIR (slower); "
                             "a path ending in .pstats profiles the driver alone with cProfile, in CPU time")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each case; with more than one, a summary "
                        "of medians and ranges follows (default 1)")
    parser.add_argument("--compare-env", type=_env_setting, action="append", default=[], metavar="NAME=VALUE",
                        help="also run every repeat with this in atoll run's environment, alternated (repeatable)")
    args = parser.parse_args(argv)
    arms = {"as is": None}
    if args.compare_env:
        arms[" ".join(f"{k}={v}" for k, v in args.compare_env)] = dict(args.compare_env)
    server = StepServer()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    try:
        for work_ms in args.work_ms:
            for n in args.proposals:
                label = f"{'no-op' if not work_ms else f'{work_ms:g} ms CPU'} evaluation, {n} proposals"
                runs: dict = {arm: [] for arm in arms}
                for _ in range(args.repeats):
                    for arm, env in arms.items():
                        r = run_case(server.url, n + 1, work_ms, args.llm_in_flight, args.set, args.profile, env)
                        show(label if env is None else f"{label} [{arm}]", work_ms, r)
                        print(f"  load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
                        runs[arm].append(r)
                if args.repeats > 1 or len(arms) > 1:
                    summary(label, runs)
    finally:
        server.close()
    print(PEERS)
    print(TARGET)


if __name__ == "__main__":
    main()
