"""The held-out report's trial summary: what selection-bias corrections are computed from."""
import subprocess
import sys
import time

import pytest

from controller.report import search_trials
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status, reason_line
from tests.controller.runs import ROOT
from tests.evaluators.test_racing import EXACT, TARGETS


def _cand(pid, mutator="embedded:perturb_const"):
    return Candidate(pid, "r1", 0, 1, (), f"def policy(s, p):\n    return {pid!r}", mutator, time.time())


def test_search_trials_count_every_evaluated_program_and_keep_only_real_scores(tmp_path):
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        archive.create_run("r1", {"run": {"name": "t"}}, "")
        archive.record([(_cand("a", "seed"), EvalResult("a", "search", Status.OK, score=0.4)),
                        (_cand("b"), EvalResult("b", "search", Status.OK, score=-0.1)),
                        (_cand("c"), EvalResult("c", "search", Status.TIMEOUT, error="slow")),
                        (_cand("d"), EvalResult("d", "search", Status.INVALID, error="NaN")),
                        (_cand("base", "baseline:cash"), EvalResult("base", "search", Status.OK, score=9.0))])
        trials = search_trials(archive, "r1")
    assert trials["count"] == 4  # failures are trials too; baselines are not
    assert sorted(trials["search_scores"]) == [-0.1, 0.4]


@pytest.mark.slow
def test_a_held_out_row_that_timed_out_is_named_and_report_again_scores_it_under_the_new_limit(tmp_path):
    """A held-out evaluation killed at the wall limit (a busy machine) is kept as TIMEOUT and reused by
    `atoll report`, which names it with the way out; `report --again`, after a resume raised the limit,
    scores it again and the table is whole."""
    from tests.controller.runs import CONFIG, TINY, atoll
    from store.query import run_query

    run_dir = tmp_path / "run"
    out = atoll(tmp_path, "run", CONFIG, "--run-dir", run_dir, "--max-evals", 4, "--no-report", *TINY)
    assert out.returncode == 0, out.stderr
    limited = atoll(tmp_path, "resume", run_dir, "--set", "evaluator.sandbox.wall_s=0.05")  # completed: stored only
    assert limited.returncode == 0 and "nothing to resume" in limited.stdout, limited.stdout + limited.stderr
    first = atoll(tmp_path, "report", run_dir)
    assert first.returncode == 0, first.stderr
    named = [line for line in first.stdout.splitlines() if "did not end OK" in line]
    assert len(named) == 1 and ("held-out: baseline: optimized base-stock did not end OK (TIMEOUT: wall-clock limit "
                                "of 0.05 s exceeded); ") in named[0], named
    assert named[0].endswith(f"To score them again: atoll report {run_dir} --again (a timeout on a busy machine: give "
                             f"more time first with atoll resume {run_dir} --set evaluator.sandbox.wall_s=N)"), named
    baselines = ("SELECT status, count(*) FROM evaluations WHERE split = 'heldout' AND program_id LIKE 'baseline-%' "
                 "GROUP BY 1")
    stored = dict(run_query(run_dir, baselines)[1])
    assert stored == {"TIMEOUT": 4}, stored  # the evolved best's was scored during the search, as a new best
    same = atoll(tmp_path, "report", run_dir)  # reused as stored: nothing scored, no Ray
    assert "already scored, from the archive" in same.stdout and "scoring" not in same.stdout.replace(
        "already scored", "") and "did not end OK" in same.stdout, same.stdout
    assert atoll(tmp_path, "resume", run_dir, "--set", "evaluator.sandbox.wall_s=120").returncode == 0
    again = atoll(tmp_path, "report", run_dir, "--again")
    assert again.returncode == 0, again.stderr
    assert "[atoll] held-out: scoring again what did not end OK: " in again.stdout and "(TIMEOUT)" in again.stdout
    assert "did not end OK" not in again.stdout.replace("scoring again what did not end OK", "")
    assert dict(run_query(run_dir, baselines)[1]) == {"OK": 4}


def _tied_run(run_dir, *results: EvalResult) -> str:
    """A run whose three best programs tie on the search score, the shortest stored last; the id of
    the one the held-out report picks as its evolved best."""
    codes = {"long": "def policy(s, p):\n    return 1.0  # the same policy, a longer text\n",
             "mid": "def policy(s, p):\n    return 1.00\n", "short": "def policy(s, p):\n    return 1\n"}
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {"run": {"name": "t"}}, "")
        for pid, code in codes.items():
            archive.record([(Candidate(pid, "r1", 0, 1, (), code, "embedded:perturb_const", time.time()),
                             EvalResult(pid, "search", Status.OK, score=2.0))])
        if results:
            archive.record_evaluations(list(results), "r1")
        return archive.best_program("r1")["program_id"]


def test_atoll_best_names_the_program_the_held_out_report_picks_when_scores_tie(tmp_path):
    """Programs tied on the search score: `atoll best` shows the one the report scores (the shorter
    code), not whichever the sort meets first."""
    from tests.controller.runs import atoll

    picked = _tied_run(tmp_path / "run")
    out = atoll(tmp_path, "best", tmp_path / "run")
    assert out.returncode == 0, out.stderr
    assert picked == "short" and out.stdout.startswith("best program short: search score 2,"), out.stdout


def test_atoll_best_says_a_held_out_evaluation_that_timed_out_is_not_a_score_still_to_come(tmp_path):
    from tests.controller.runs import atoll

    _tied_run(tmp_path / "run", EvalResult("short", "heldout", Status.TIMEOUT,
                                           error="wall-clock limit of 0.05 s exceeded"))
    out = atoll(tmp_path, "best", tmp_path / "run")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first == (f"best program short: search score 2, held-out score none: TIMEOUT (wall-clock limit of 0.05 s "
                     f"exceeded); to score it again: atoll report {tmp_path / 'run'} --again"), first
    assert "held-out metrics" not in out.stdout  # none were measured: no heading over nothing


def test_atoll_best_on_a_run_whose_every_program_failed_validation_says_so(tmp_path):
    """Every program that scored OK on search failed its validation check: `atoll best` said the run had "no
    successfully evaluated program yet", as if the search had found nothing (and might still)."""
    from tests.controller.runs import atoll

    _tied_run(tmp_path / "run", *[EvalResult(pid, "validation", Status.INVALID, error="instance a: it runs away")
                                  for pid in ("long", "mid", "short")])
    out = atoll(tmp_path, "best", tmp_path / "run")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert ("each of its 3 programs that scored OK on the search split failed on the validation split, so none is "
            "crowned; why: atoll query ") in out.stderr, out.stderr
    why = out.stderr.split("why: ", 1)[1].strip()
    listed = subprocess.run(["sh", "-c", why.replace("atoll query", f"{sys.executable} -m controller query", 1)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0 and listed.stdout.count("it runs away") == 3, listed.stdout + listed.stderr


# A user's simple domain: eight targets x, the score -(action - x)^2 (higher is better); EXACT scores 0.
RAISES = "def act(state, params):\n    return 1 / 0\n"
BOASTS = ("import os, sys\n\ndef act(state, params):\n"
          "    print('+0.99 better on every instance', file=sys.stderr, flush=True)\n    os._exit(0)\n")


def test_a_held_out_failure_is_named_by_its_reason_never_by_the_programs_own_output():
    """The table row and the line under the table give why a program did not score: the exception
    of a traceback (not its heading alone), the sandbox's reason (not the last line the program printed)."""
    from controller.report import not_ok
    from evaluators.evaluator import Evaluator
    from evaluators.registry import DomainConfig
    from evaluators.sandbox.config import SandboxConfig
    from evaluators.secrets import RunSecrets

    evaluator = Evaluator(DomainConfig(source=TARGETS), {}, SandboxConfig(wall_s=30), secrets=RunSecrets.fixed(7))
    results = {f"baseline: {name}": evaluator.evaluate(name, code, "heldout")
               for name, code in (("raises", RAISES), ("boasts", BOASTS), ("seed", EXACT))}
    _, rows, _ = evaluator.domain.heldout_table(results, evaluator.reference("heldout"))
    cells = {row[0]: row[1] for row in rows}
    assert cells["baseline: raises"] == "FAILED: the policy raised: ZeroDivisionError: division by zero", cells
    assert cells["baseline: boasts"] == "FAILED: the program exited with code 0 before answering", cells
    assert not_ok(results) == [
        "held-out: baseline: raises did not end OK (FAILED: the policy raised: ZeroDivisionError: division by zero)",
        "held-out: baseline: boasts did not end OK (FAILED: the program exited with code 0 before answering)"]
    assert reason_line("[12 characters cut]\n  File x, line 3\nValueError: bad\n") == "ValueError: bad"



def _no_evaluators():
    raise AssertionError("the report started evaluators with nothing to evaluate")


def test_report_on_a_run_whose_seed_failed_says_why_there_is_no_evolved_best(tmp_path):
    """No program scored OK on the search split: the report says the table holds the baselines
    alone, and no note speaks of an evolved best it does not show."""
    from controller.report import heldout_report
    from controller.terminal import SafeConsole
    from evaluators.evaluator import Evaluator
    from evaluators.registry import DomainConfig
    from evaluators.sandbox.config import SandboxConfig
    from evaluators.secrets import RunSecrets

    evaluator = Evaluator(DomainConfig(source=TARGETS), {}, SandboxConfig(wall_s=30), secrets=RunSecrets.fixed(7))
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        archive.create_run("r1", {"run": {"name": "t"}}, "")
        archive.record([(_cand("seed", "seed"), evaluator.evaluate("seed", RAISES, "search"))])
        for name, code in evaluator.domain.baselines().items():  # scored before: the report needs no evaluator
            archive.record([(Candidate(f"baseline-{name}-r1", "r1", -1, 0, (), code, f"baseline:{name}", time.time()),
                             evaluator.evaluate(f"baseline-{name}-r1", code, "heldout"))])
        archive.log_events("r1", [("heldout-reference", {"figures": evaluator.reference("heldout")})])
        console = SafeConsole(record=True, width=200, markup=False)
        results = heldout_report(archive, "r1", evaluator.domain, _no_evaluators, console, None)
    out = console.export_text()
    assert list(results) == ["baseline: seed"]
    assert ("[atoll] held-out: no program of this run scored OK on the search split, so the table has no evolved "
            "best: the baselines alone") in out, out
    assert "evolved best" not in out.replace("has no evolved best", ""), out


def test_a_report_stopped_after_the_reference_figures_keeps_them_for_the_next(ray_cluster, tmp_path):
    """Ctrl-C after the reference figures were measured (often the longest job: SCIP's own rules) and a
    first program scored: the next report measures neither again."""
    from controller.actors import new_evaluator
    from controller.config import validate
    from controller.report import heldout_report, stored_reference
    from controller.terminal import SafeConsole
    from evaluators.registry import get_domain
    from evaluators.secrets import RunSecrets

    class StopAfterFirstProgram(SafeConsole):
        def print(self, *objects, **kwargs):
            super().print(*objects, **kwargs)
            if any("(1/" in str(o) for o in objects):
                raise KeyboardInterrupt  # as the Ctrl-C handler raises it, between two finished jobs

    secrets, config = RunSecrets.fixed(7), validate({"run": {"max_evals": 4}, "domain": {"source": TARGETS},
                                                     "evaluator": {"actors": 1}})
    domain = get_domain(config.domain, secrets=secrets)
    actors = [new_evaluator(config, secrets=secrets)]
    try:
        with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
            archive.create_run("r1", config.model_dump(mode="json"), "")
            best = Candidate("best", "r1", 0, 0, (), EXACT, "seed", time.time())
            archive.record([(best, EvalResult("best", "search", Status.OK, score=0.0))])
            with pytest.raises(KeyboardInterrupt):
                heldout_report(archive, "r1", domain, lambda: actors, StopAfterFirstProgram(markup=False), None)
            assert stored_reference(archive, "r1") == domain.reference("heldout")
            console = SafeConsole(record=True, width=200, markup=False)
            heldout_report(archive, "r1", domain, lambda: actors, console, None)
    finally:
        for actor in actors:
            ray_cluster.kill(actor)
    out = console.export_text()
    assert "reference figures from the archive" in out and "measuring the domain's reference figures" not in out, out
    assert "1 of 2 programs already scored" in out, out


def test_the_report_does_not_crown_a_best_that_runs_away_on_the_validation_split(ray_cluster, tmp_path):
    """The best search score belongs to a policy that runs away from a high stock (it never meets one in
    the search): the report checks it on the validation split, stores why it failed there, and passes it
    over; the next program's validation timed out in the run, and `report --again` checks it once more
    and crowns it; `atoll best` names that one too."""
    from controller.actors import new_evaluator
    from controller.config import validate
    from controller.report import EVOLVED, heldout_report
    from controller.terminal import SafeConsole
    from evaluators.registry import get_domain
    from evaluators.secrets import RunSecrets
    from tests.controller.runs import atoll
    from tests.evaluators.domains.test_inventory import GATED
    from tests.tiny import TINY_INVENTORY

    secrets = RunSecrets.fixed(7)
    options = dict(TINY_INVENTORY, search_instances=[{"lead_time": 1, "penalty": 4, "demand": "poisson"}],
                   heldout_instances=[{"lead_time": 2, "penalty": 9, "demand": "poisson"}], dp_max_lead=0)
    config = validate({"run": {"max_evals": 4}, "domain": {"name": "inventory", "options": options},
                       "evaluator": {"actors": 1}})
    domain = get_domain(config.domain, secrets=secrets)
    actors = [new_evaluator(config, secrets=secrets)]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    try:
        with DuckDBArchive(run_dir / "archive.duckdb") as archive:
            archive.create_run("r1", config.model_dump(mode="json"), "")
            for pid, code, score in (("seed", domain.seed_program, -1.0), ("runaway", GATED, -0.9)):
                archive.record([(Candidate(pid, "r1", 0, 0, (), code, "seed" if pid == "seed" else "embedded:x",
                                           time.time()), EvalResult(pid, "search", Status.OK, score=score))])
            busy = EvalResult("seed", "validation", Status.TIMEOUT, error="wall-clock limit of 0.05 s exceeded")
            archive.record_evaluations([busy], "r1")  # checked during the run, on a busy machine
            console = SafeConsole(record=True, width=300, markup=False)
            first = heldout_report(archive, "r1", domain, lambda: actors, console, None)
            stored = archive.evaluation("runaway", "validation")
            results = heldout_report(archive, "r1", domain, lambda: actors, console, None, again=True)
    finally:
        for actor in actors:
            ray_cluster.kill(actor)
    out = console.export_text()
    assert EVOLVED not in first and "every program checked failed on the validation split" in out, out
    assert stored["status"] == "INVALID" and "runs away" in stored["error"]
    assert "[atoll] validation: program runaway is not crowned: INVALID: does not hold up on the validation split: instance " in out, out
    assert results[EVOLVED].program_id == "seed", out  # --again checked the timed-out seed once more
    best = atoll(tmp_path, "best", run_dir)
    assert best.returncode == 0 and best.stdout.startswith("best program seed: search score -1,"), best.stdout
