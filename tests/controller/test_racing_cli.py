"""Racing through the real CLI: raced rows are partial evaluations, never a best, and survive kill -9 + resume."""
import json

import pytest

from controller.config import load_config
from controller.resume import load_islands
from store.duckdb_archive import DuckDBArchive
from tests.controller.runs import atoll, counts, kill_group, start, wait_for_evaluations

# Eight targets x per instance; the score is -(action - x)^2, so a perturbed constant makes a child worse
# on most instances at once (deterministic: an equal child ties exactly and is never raced).
DOMAIN = '''\
from evaluators.simple import SimpleDomain

SEED = "def act(state, params):\\n    return 0.8 * state['x'] + 0.3\\n"


class Targets(SimpleDomain):
    name = "targets"
    entry_point = "act"
    seed_program = SEED
    baseline_programs = {"seed": SEED}
    action_shape = ()

    def instances(self, split, rng):
        return [float(x) for x in rng.uniform(-1, 1, size=8)]

    def simulate(self, instances, policy):
        return [-(float(a) - x) ** 2 for a, x in zip(policy([{"x": x} for x in instances]), instances)]
'''
CONFIG = '''\
[run]
max_evals = 24
max_wall_s = 240
[domain]
path = "targets.py"
[islands]
count = 2
[mutator.embedded]
operators = ["perturb_const"]
[evaluator]
actors = 1
[evaluator.racing]
enabled = true
min_instances = 3
[controller]
commit_every_s = 0.2
snapshot_every_s = 0.5
heldout_on_new_best = false
'''


def _rows(run_dir, sql):
    with DuckDBArchive(run_dir / "archive.duckdb", read_only=True) as archive:
        return archive.con.execute(sql).fetchall()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_raced_rows_are_partial_never_best_and_stay_right_after_kill_and_resume(tmp_path):
    (tmp_path / "targets.py").write_text(DOMAIN)
    (tmp_path / "racing.toml").write_text(CONFIG)
    run_dir = tmp_path / "run"
    # the first run's budget cannot run out before the kill, however slowly the test sees its progress
    proc = start(tmp_path, "run", tmp_path / "racing.toml", "--run-dir", run_dir, "--no-report",
                 "--set", "run.max_evals=100000")
    wait_for_evaluations(run_dir, 8, proc)
    kill_group(proc)
    budget = counts(run_dir)[0] + 16  # the resume ends the run 16 evaluations after what the kill left
    before = set(_rows(run_dir, "SELECT program_id, status, error FROM evaluations WHERE status = 'RACED'"))
    done = atoll(tmp_path, "resume", run_dir, "--set", f"run.max_evals={budget}")  # then the held-out report
    assert done.returncode == 0, done.stderr
    raced = _rows(run_dir, "SELECT e.program_id, e.score, e.metrics, e.error, p.search_status, p.search_score, "
                           "p.best_so_far FROM evaluations e JOIN programs p USING (program_id) "
                           "WHERE e.split = 'search' AND e.status = 'RACED'")
    assert raced, "no child was raced: the test shows nothing"
    assert before <= {(pid, "RACED", error) for pid, _, _, error, *_ in raced}  # kept across the kill
    for pid, score, metrics, error, status, search_score, best_so_far in raced:
        metrics = json.loads(metrics)
        assert score is None and search_score is None and best_so_far is None and status == "RACED"
        assert metrics["raced"] and 3 <= metrics["instances_seen"] < 8 and error.startswith("raced: clearly worse")
    ids = {row[0] for row in raced}
    assert _rows(run_dir, "SELECT count(*), count(DISTINCT program_id) FROM evaluations WHERE split = 'search'")[0] \
        == (budget, budget)
    assert {pid for (pid,) in _rows(run_dir, "SELECT program_id FROM raced")} == ids
    assert not ids & {pid for (pid,) in _rows(run_dir, "SELECT program_id FROM evaluations WHERE split = 'heldout'")}
    best = atoll(tmp_path, "best", run_dir)
    assert best.returncode == 0 and best.stdout.split()[2].rstrip(":") not in ids
    config = load_config(tmp_path / "racing.toml")[0]
    with DuckDBArchive(run_dir / "archive.duckdb", read_only=True) as archive:
        (run_id,), = archive.con.execute("SELECT run_id FROM runs").fetchall()
        members = {m.program_id for island in load_islands(archive, run_id, config, budget).islands.islands
                   for m in island.members()}
    assert members and not members & ids  # a resume rebuilds islands without a raced program
    assert f"racing: {len(ids)} search evaluations stopped early" in done.stdout
    status = atoll(tmp_path, "status", run_dir)
    assert "raced" in status.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_resumes_progress_line_counts_the_runs_raced_evaluations_beside_the_runs_evaluations(tmp_path):
    """The line says "N/M evals ... raced R" with N the run's evaluations: R is the run's too, as atoll status says."""
    (tmp_path / "targets.py").write_text(DOMAIN)
    (tmp_path / "racing.toml").write_text(CONFIG)
    run_dir = tmp_path / "run"
    first = atoll(tmp_path, "run", tmp_path / "racing.toml", "--run-dir", run_dir, "--no-report",
                  "--set", "run.max_evals=40")
    assert first.returncode == 0, first.stderr
    (raced,), = _rows(run_dir, "SELECT count(*) FROM evaluations WHERE status = 'RACED'")
    assert raced, "no child was raced: the test shows nothing"
    done = atoll(tmp_path, "resume", run_dir, "--no-report", "--set", "run.max_evals=42")
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stderr.splitlines() if line.startswith("[atoll] 40/42 evals"))
    assert f" raced {raced} " in line, line
