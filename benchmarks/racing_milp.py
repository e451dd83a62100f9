"""Racing on the MILP set cover config: the same wall-clock budget with and without racing.

Runs `atoll run configs/milp_setcover.toml` twice at once (racing off, racing on), each with
one evaluator actor, the same replay seed (so both meet the same instances and SCIP seeds)
and the same search wall-clock budget, each followed by its held-out report. Then it reruns
in full, with the racing run's secrets, a sample of the evaluations racing stopped, and
counts those that were not worse than their parent after all (full score >= the parent's
stored search score): the wrong stops. Prints, per arm: candidates evaluated (by status),
instance solves spent, the best search score, and the held-out verdict of the evolved best
against the pscost baseline; then the wrong stops of the sample. Prints the load average.

The shipped config's evaluation (4 standard instances) takes 46-53 s idle, and with only 4
instances a race can stop after at most 3; the defaults here scale it down (small instances,
10 of them per search evaluation, 6 held out) so that a short budget sees tens of candidates.

    unshare -n sh -c 'ip link set lo up && python3 benchmarks/racing_milp.py --budget 420'
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from store.duckdb_archive import DuckDBArchive  # noqa: E402

VERDICT = re.compile(r"evolved best against 'baseline: pscost' on the same runs: (.*)")


def arm_args(args, racing: bool, run_dir: Path) -> list[str]:
    sets = {"run.max_wall_s": args.budget, "run.max_evals": 10_000, "run.replay_seed": args.seed,
            "domain.options.search_size": args.size, "domain.options.heldout_size": args.size,
            "domain.options.search_instances": args.instances, "domain.options.heldout_instances": args.heldout,
            "domain.options.reference_rules": '["scip pscost"]', "evaluator.actors": 1,
            "evaluator.racing.enabled": str(racing).lower(), "evaluator.racing.alpha": args.alpha,
            "evaluator.racing.min_instances": args.min_instances, "evaluator.sandbox.wall_s": args.wall}
    out = ["run", "configs/milp_setcover.toml", "--run-dir", str(run_dir)]
    for key, value in sets.items():
        out += ["--set", f"{key}={value}"]
    return out


def start(args, racing: bool, work: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ATOLL_CACHE_DIR": str(work / "cache"),
           "ATOLL_LIBRARY": str(work / "library.duckdb")}  # never the user's library
    log = open(work / f"{'racing' if racing else 'full'}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "controller", *arm_args(args, racing, work / ("on" if racing else "off"))],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)


def wait_for_ray(log: Path, proc: subprocess.Popen, limit: float = 300) -> None:
    """Until the first arm is past Ray's start (its first progress line)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None and "evals" not in log.read_text():
        time.sleep(1)


def summary(run_dir: Path, log: str) -> dict:
    with DuckDBArchive(run_dir / "archive.duckdb", read_only=True) as archive:
        con = archive.con
        by_status = dict(con.execute("SELECT status, count(*) FROM evaluations WHERE split = 'search' "
                                     "GROUP BY status").fetchall())
        solves = con.execute(
            "SELECT sum(CASE WHEN status = 'RACED' THEN CAST(json_extract(metrics, '$.instances_seen') AS INTEGER) "
            "WHEN status = 'OK' THEN json_array_length(json_extract(metrics, '$.per_run')) ELSE 0 END), "
            "max(score) FILTER (WHERE status = 'OK'), sum(duration_s) FROM evaluations WHERE split = 'search'"
        ).fetchone()
    verdict = VERDICT.search(log)
    return {"evaluated": sum(by_status.values()), "by_status": by_status, "instances_scored": solves[0],
            "best_search_score": solves[1], "evaluation_s": solves[2],
            "heldout_vs_pscost": verdict.group(1) if verdict else "no verdict (see the log)"}


def replayed(run_dir: Path, alpha: float, min_instances: int) -> dict:
    """Racing replayed on the arm without it: each child's full per-instance scores fed to `Race.look` in
    the race's order (`Race.shuffle`, from that arm's secrets) against its parent's; how many it would stop, after how many instances, and how many of
    those were not worse in full (full score >= parent's score): wrong stops, measured without reruns."""
    from evaluators.racing import Race, RaceSpec, RaceStopped, RacingConfig
    from evaluators.secrets import RunSecrets

    with DuckDBArchive(run_dir / "archive.duckdb", read_only=True) as archive:
        (run_id,), = archive.con.execute("SELECT run_id FROM runs").fetchall()
        secrets = RunSecrets.from_record(archive.load_secrets(run_id))
        rows = archive.con.execute(
            "SELECT e.instance_scores, e.score, pe.instance_scores, pe.score FROM evaluations e "
            "JOIN programs p USING (program_id) JOIN evaluations pe ON pe.program_id = p.parent_ids[1] "
            "AND pe.split = 'search' AND pe.status = 'OK' WHERE e.split = 'search' AND e.status = 'OK'").fetchall()
    config, stops, seen, wrong = RacingConfig(enabled=True, alpha=alpha, min_instances=min_instances), 0, 0, 0
    lowest = []  # each child's smallest p-value over its looks, against the level of one look
    for scores, score, parent, parent_score in rows:
        race = Race(RaceSpec(config, "parent", tuple(parent), parent_score))
        scores = [scores[i] for i in race.shuffle(len(scores), secrets)]
        ps = [race._test(tuple(scores[:k]), len(scores))[0] for k in range(1, len(scores))
              if race.due(k, len(scores))]
        lowest.append(round(min((p for p in ps if p == p), default=1.0), 3))
        try:
            for k in range(1, len(scores) + 1):
                race.look(scores[:k], len(scores))
        except RaceStopped as stop:
            stops, seen, wrong = stops + 1, seen + len(stop.seen), wrong + (score >= parent_score)
    return {"children": len(rows), "would_stop": stops, "instances_seen_when_stopped": seen,
            "would_stop_wrongly": wrong, "level_per_look": round(alpha / max(Race(RaceSpec(config, "")).looks(
                len(rows[0][0])) if rows else 1, 1), 4), "smallest_p_per_child": sorted(lowest)}


def raced_sample(run_dir: Path, count: int) -> tuple[list[dict], dict, str]:
    """Up to `count` raced programs (evenly spread over the run) with their parent's score; config; run id."""
    with DuckDBArchive(run_dir / "archive.duckdb", read_only=True) as archive:
        (run_id, config), = archive.con.execute("SELECT run_id, config FROM runs").fetchall()
        rows = archive.con.execute(
            "SELECT p.program_id, p.code, json_extract_string(e.metrics, '$.reason'), pe.score "
            "FROM evaluations e JOIN programs p USING (program_id) "
            "LEFT JOIN evaluations pe ON pe.program_id = p.parent_ids[1] AND pe.split = 'search' "
            "WHERE e.split = 'search' AND e.status = 'RACED' ORDER BY p.seq").fetchall()
        secrets = archive.load_secrets(run_id)
    step = max(1, len(rows) // max(count, 1))
    picked = [dict(zip(("program_id", "code", "reason", "parent_score"), row)) for row in rows[::step][:count]]
    return picked, {"config": json.loads(config) if isinstance(config, str) else config, "secrets": secrets}, run_id


def rerun(picked: list[dict], stored: dict) -> list[dict]:
    """Each picked program scored in full (no race) with the racing run's secrets and options."""
    from controller.config import validate
    from evaluators.evaluator import Evaluator
    from evaluators.secrets import RunSecrets

    config = validate(stored["config"])
    evaluator = Evaluator(config.domain, {}, config.evaluator.sandbox, secrets=RunSecrets.from_record(stored["secrets"]))
    out = []
    for item in picked:
        result = evaluator.evaluate(item["program_id"], item["code"], "search")
        out.append({"program_id": item["program_id"], "parent_score": item["parent_score"],
                    "full_score": result.score, "status": result.status.value,
                    "not_worse": result.score is not None and item["parent_score"] is not None
                    and result.score >= item["parent_score"]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=300, help="search wall-clock seconds per arm")
    parser.add_argument("--size", default="small", help="set cover size of search and held-out instances")
    parser.add_argument("--instances", type=int, default=10, help="search instances per evaluation")
    parser.add_argument("--heldout", type=int, default=6, help="held-out instances")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--min-instances", type=int, default=4)
    parser.add_argument("--rerun", type=int, default=4, help="raced programs rerun in full")
    parser.add_argument("--wall", type=float, default=240, help="sandbox wall-clock limit per evaluation")
    parser.add_argument("--seed", type=int, default=11, help="run.replay_seed of both arms (the same data)")
    parser.add_argument("--work", default=None, help="keep the run directories here (default: a temp dir)")
    parser.add_argument("--summarize", action="store_true", help="print the figures of the runs already in --work")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="racing-milp-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir {work}; budget {args.budget:g} s per arm; setcover {args.size} x {args.instances} search "
          f"instances, {args.heldout} held out; racing alpha {args.alpha}, min_instances {args.min_instances}")
    print(f"load before: {os.getloadavg()}", flush=True)
    if not args.summarize:
        run_arms(args, work)
    report(args, work)


def run_arms(args, work: Path) -> None:
    start_time = time.monotonic()
    procs = {False: start(args, False, work)}
    wait_for_ray(work / "full.log", procs[False])  # two Ray heads started at the same instant can pick one port
    procs[True] = start(args, True, work)
    for racing, proc in procs.items():
        proc.wait()
        if proc.returncode != 0:
            sys.exit(f"arm racing={racing} exited {proc.returncode}; see {work}")
    print(f"both arms done in {time.monotonic() - start_time:.0f} s; load after: {os.getloadavg()}")


def report(args, work: Path) -> None:
    for racing in (False, True):
        log = (work / f"{'racing' if racing else 'full'}.log").read_text()
        print(f"racing {'on ' if racing else 'off'}: {json.dumps(summary(work / ('on' if racing else 'off'), log))}")
    print(f"racing replayed on the full evaluations of the arm without it: "
          f"{json.dumps(replayed(work / 'off', args.alpha, args.min_instances))}")
    picked, stored, run_id = raced_sample(work / "on", args.rerun)
    if not picked:
        print("racing stopped nothing: no wrong stops to count")
        return
    os.environ["ATOLL_CACHE_DIR"] = str(work / "cache")
    checked = rerun(picked, stored)
    for row in checked:
        print(f"rerun in full: {json.dumps(row)}")
    wrong = sum(row["not_worse"] for row in checked)
    print(f"wrong stops: {wrong} of {len(checked)} raced programs rerun in full were not worse than their parent; "
          f"load at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
