"""Lost actors during a search and its held-out report: real Ray, DuckDB and sandboxes, the driver in-process.

A mutator killed with `ray.kill` is replaced and its requests requeued; one whose process
dies is restarted by Ray itself. A program whose evaluation kills its evaluator is run
again once on a fresh evaluator, then stored FAILED with the reason, and the programs
queued behind it are not charged. The report turns the same loss into a row.
"""
import json
import os
import signal
import time

import pytest
import ray
from rich.console import Console

from controller.cli import UserError
from controller.config import validate
from controller.faults import CLOCKS_S, Deaths, death_time
from controller.loop import Search, new_id
from controller.report import heldout_report
from evaluators.registry import get_domain
from evaluators.secrets import RunSecrets
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status
from tests.controller.killers import (
    KILL_MARK,
    UnbuildableEvaluatorActor,
    killing_evaluator,
)
from tests.tiny import TINY_INVENTORY


def _config(budget: int):
    return validate({"run": {"max_evals": budget, "max_wall_s": 240, "seed": 3},
                     "domain": {"name": "inventory", "options": TINY_INVENTORY},
                     "islands": {"count": 2}, "evaluator": {"actors": 2, "sandbox": {"wall_s": 60}},
                     "controller": {"commit_every_s": 0.2, "snapshot_every_s": 2}})


@pytest.fixture()
def archive(tmp_path):
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        yield archive


def _events(archive, kind: str) -> list[dict]:
    rows = archive.con.execute("SELECT data FROM events WHERE kind = ? ORDER BY ts", [kind]).fetchall()
    return [json.loads(data) for (data,) in rows]


def _run(search) -> str:
    """Run the search, then end its actors (a CLI driver's exit would; this test session's Ray lives on)."""
    try:
        return search.run()
    finally:
        for actor in getattr(search, "evaluators", []) + getattr(search, "mutators", []):
            ray.kill(actor)


SECRETS = RunSecrets.fixed(5)  # the run's secrets: every evaluator of a run gets the same


def _search_rows(archive) -> list[tuple]:
    return archive.con.execute("SELECT program_id, status, error FROM evaluations WHERE split = 'search'").fetchall()


class MutatorKiller(Search):
    """Kills its only mutator after the third result, with `ray.kill` or by killing its process."""

    how = "ray.kill"

    def _on_eval(self, candidate, result):
        super()._on_eval(candidate, result)
        self.seen = getattr(self, "seen", 0) + 1
        if self.seen == 3:
            self.victim = self.mutators[0]
            if self.how == "ray.kill":
                ray.kill(self.victim)  # gone for good: Ray will not restart it
            else:
                os.kill(ray.get(self.victim.__ray_call__.remote(lambda actor: os.getpid())), signal.SIGKILL)


@pytest.mark.parametrize("how", ["ray.kill", "process killed"])
def test_a_lost_mutator_is_replaced_and_the_budget_completes(ray_cluster, archive, tmp_path, how):
    config = _config(8)
    archive.create_run("r1", config.model_dump(mode="json"))
    search = MutatorKiller(config, archive, "r1", tmp_path, secrets=SECRETS)
    search.how = how
    assert _run(search) == "completed"
    rows = _search_rows(archive)
    assert len(rows) == len({pid for pid, _, _ in rows}) == 8
    lost = [e for e in _events(archive, "actor-lost") if e["role"] == "mutator"]
    if how == "ray.kill":  # the driver replaced it: the requests lost with it were sent again
        assert lost and search.mutators[0] is not search.victim
    else:  # Ray restarted the process and retried its requests; the driver saw nothing
        assert not lost and search.mutators[0] is search.victim


class KillerInjector(Search):
    """Evaluators that die on a marked program, and one such program submitted after the seed."""

    def _new_evaluator(self):
        return killing_evaluator(self.config, self.hide, self.secrets)

    def _on_eval(self, candidate, result):
        super()._on_eval(candidate, result)
        if candidate.mutator == "seed":
            self.killer = Candidate(new_id(), self.run_id, 0, 1, (candidate.program_id,),
                                    candidate.code + "\n" + KILL_MARK + "\n", "test:killer", time.time())
            self.known.add(self.killer.code_hash)
            self._submit_eval(self.killer)


def test_an_evaluation_that_kills_its_evaluator_is_retried_once_then_stored_failed(ray_cluster, archive, tmp_path):
    config = _config(7)
    archive.create_run("r1", config.model_dump(mode="json"))
    search = KillerInjector(config, archive, "r1", tmp_path, secrets=SECRETS)
    assert _run(search) == "completed"
    killer = archive.evaluation(search.killer.program_id, "search")
    assert killer["status"] == "FAILED" and killer["error"] == "its evaluation killed the evaluator process twice"
    rows = _search_rows(archive)
    assert len(rows) == len({pid for pid, _, _ in rows}) == 7
    assert [pid for pid, _, error in rows if error and "killed the evaluator" in error] == [search.killer.program_id]
    lost = _events(archive, "actor-lost")
    assert [e["running"] for e in lost] == [f"search:{search.killer.program_id}"] * 2
    assert [e["given_up"] for e in lost] == [False, True]


class IdleDeaths(Search):
    """Both evaluators die while idle, right after the seed's result (as on a node lost between two
    jobs), and Ray has them as dead before the next job is sent to them."""

    def _on_eval(self, candidate, result):
        super()._on_eval(candidate, result)
        if candidate.mutator == "seed":
            for actor in self.evaluators:
                os.kill(ray.get(actor.__ray_call__.remote(lambda actor: os.getpid())), signal.SIGKILL)
            for actor in self.evaluators:
                _until_dead(actor)


def _until_dead(actor, limit: float = 60) -> None:
    """Until Ray's GCS has the actor as dead, and long enough since for any clock (`faults.CLOCKS_S`)."""
    deadline = time.monotonic() + limit
    while (died := death_time(actor)) is None or time.time() <= died + CLOCKS_S:
        assert time.monotonic() < deadline, "Ray did not see the actor's death"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_job_sent_to_an_evaluator_already_dead_is_not_charged_with_its_death(ray_cluster, archive, tmp_path):
    """The job never ran there: it is sent again uncharged. It was charged as if it had killed the
    evaluator, and with `actor_death_retries = 0` (or after two such idle actors) stored FAILED."""
    config = _config(6).model_copy(update={"controller": _config(6).controller.model_copy(
        update={"actor_death_retries": 0})})
    archive.create_run("r1", config.model_dump(mode="json"))
    search = IdleDeaths(config, archive, "r1", tmp_path, secrets=SECRETS)
    assert _run(search) == "completed"
    rows = _search_rows(archive)
    assert len(rows) == len({pid for pid, _, _ in rows}) == 6
    assert [status for _, status, _ in rows] == ["OK"] * 6, rows
    lost = _events(archive, "actor-lost")
    assert lost and all(e["running"] is None and e["requeued"] for e in lost), lost


class NodesLacking(Search):
    """Every evaluator lands where the domain's package is missing: none ever becomes ready."""

    def _new_evaluator(self):
        return UnbuildableEvaluatorActor.remote(self.config.domain, {}, self.config.evaluator.sandbox, self.hide,
                                                self.secrets)


def test_evaluators_that_keep_dying_before_they_are_ready_end_the_run_in_one_line(ray_cluster, archive, tmp_path):
    """It was a RuntimeError, so a traceback, that ended in the last 500 characters of Ray's (begun mid-line)."""
    config = _config(4).model_copy(update={"evaluator": _config(4).evaluator.model_copy(update={"actors": 1})})
    archive.create_run("r1", config.model_dump(mode="json"))
    with pytest.raises(UserError) as refused:
        _run(NodesLacking(config, archive, "r1", tmp_path, secrets=SECRETS))
    said = str(refused.value)
    assert "\n" not in said and said.startswith("evaluator actors keep dying before they are ready (6 so far; the "
                                                "last: ImportError: No module named 'pyscipopt' (killers.py, line")
    assert said.endswith(f"once they have it, continue with: atoll resume {tmp_path}")


def test_deaths_charge_each_job_and_give_up_past_the_retries():
    deaths = Deaths(retries=2)
    assert deaths.charge("a") and deaths.charge("a") and not deaths.charge("a")
    assert deaths.charge("b")
    assert deaths.reason("a") == "its evaluation killed the evaluator process 3 times"
    assert deaths.reason("b", "mutation request", "mutator") == "its mutation request killed the mutator process once"
    assert not Deaths(retries=0).charge("c")


def test_the_report_turns_an_evaluator_killed_by_the_best_program_into_a_row(ray_cluster, archive):
    config = _config(4)
    archive.create_run("r1", config.model_dump(mode="json"))
    domain = get_domain("inventory", secrets=SECRETS, **TINY_INVENTORY)
    best = Candidate("best1", "r1", 0, 1, (), domain.seed_program + "\n" + KILL_MARK + "\n", "embedded:x", time.time())
    archive.record([(best, EvalResult("best1", "search", Status.OK, score=1.0))])
    archive.record_evaluations([EvalResult("best1", "validation", Status.OK, score=1.0)], "r1")  # crowned as checked
    console = Console(record=True, width=200)
    actors = [killing_evaluator(config, secrets=SECRETS) for _ in range(2)]
    made = []
    try:
        results = heldout_report(archive, "r1", domain, lambda: actors, console,
                                 lambda: made.append(killing_evaluator(config, secrets=SECRETS)) or made[-1])
    finally:
        for actor in actors + made:
            ray.kill(actor)
    assert results["evolved best"].status == Status.FAILED
    assert results["evolved best"].error == "its evaluation killed the evaluator process twice"
    baselines = {label: r for label, r in results.items() if label.startswith("baseline: ")}
    assert set(baselines) == {f"baseline: {name}" for name in domain.baselines()}, list(results)
    assert all(r.status == Status.OK for r in baselines.values()), baselines
    assert archive.evaluation("best1", "heldout")["status"] == "FAILED"  # stored: `atoll report` will not rerun it
    table = console.export_text()
    assert "FAILED: its evaluation killed the evaluator process twice" in table and "DP optimum" in table
