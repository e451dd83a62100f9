"""The run loop's side of steering: it answers control-plane commands at the loop's tick.

Everything here runs on the loop's thread, the only one that touches the search and
the archive. Pause stops new submissions (work in flight finishes and is committed);
paused time does not count against `run.max_wall_s`. Stop takes Ctrl-C's own path
(the loop sees a KeyboardInterrupt), so what finished is committed and `atoll
resume` continues the run. A budget change is validated by the config tree's own
models, applied to the live search and written into the run's stored config, so a
resume keeps it. Events are published as they are committed.
"""
from __future__ import annotations

import json
from collections import Counter, deque

from pydantic import ValidationError

from controller.steering import Refused, Steering
from controller.submit import resume_command
from store.records import Status

LIVE_BUDGETS = ("run.max_evals", "run.max_wall_s", "mutator.llm.budget.calls", "mutator.llm.budget.tokens",
                "mutator.llm.budget.cost")
RATE_WINDOW_S = 60.0


class Helm:
    """Pause, resume, stop, budget changes and status for one search; owned by the search."""

    def __init__(self, archive, run_id: str):
        self.steering = Steering()
        self.paused, self.stopping = False, False
        self.proposals = 0  # mutations and LLM replies received by this driver
        self._started = self._paused_at = None
        self._paused_s = 0.0
        self._samples: deque = deque()  # (monotonic time, evaluations, proposals), one a second
        self.failure_kinds = Counter(dict(archive.con.execute(
            "SELECT status, count(*) FROM evaluations WHERE run_id = ? AND split = 'search' AND status NOT IN (?, ?) "
            "GROUP BY status", [run_id, Status.OK.value, Status.RACED.value]).fetchall()))
        row = archive.con.execute("SELECT protections FROM runs WHERE run_id = ?", [run_id]).fetchall()
        self.protections = list(row[0][0] or []) if row else []

    def begin(self, now: float) -> None:
        self._started = now

    def searched_s(self, now: float) -> float:
        """Seconds of searching so far in this driver, paused time excluded."""
        paused = self._paused_s + (now - self._paused_at if self._paused_at is not None else 0.0)
        return now - self._started - paused

    # --- the tick ----------------------------------------------------------------------
    def tick(self, search, now: float) -> None:
        """Answer every command asked since the last tick; a stop raises KeyboardInterrupt, as Ctrl-C does."""
        self._sample(search, now)
        for command, future in self.steering.take():
            try:
                future.set_result(getattr(self, f"_{command.kind}")(search, command, now))
            except Refused as exc:
                future.set_exception(exc)
        if self.stopping:
            raise KeyboardInterrupt

    def _sample(self, search, now: float) -> None:
        if not self._samples or now - self._samples[-1][0] >= 1.0:
            self._samples.append((now, _evaluations(search), self.proposals))
        while len(self._samples) > 2 and now - self._samples[1][0] > RATE_WINDOW_S:
            self._samples.popleft()

    # --- commands ----------------------------------------------------------------------
    def _pause(self, search, command, now: float) -> str:
        if self.paused:
            return "already paused"
        self.paused, self._paused_at = True, now
        search.events.append(("paused", {"in_flight": search.in_flight()}))  # archived, then to the watchers
        return (f"paused: nothing new is submitted; the {search.in_flight()} job(s) in flight finish and are "
                f"committed (continue with: atoll continue {search.run_dir})")

    def _resume(self, search, command, now: float) -> str:
        if not self.paused:
            return "not paused; the run goes on"
        paused_s = now - self._paused_at
        self._paused_s += paused_s
        self.paused, self._paused_at = False, None
        search.events.append(("resumed", {"paused_s": round(paused_s, 1)}))
        return "resumed"

    def _stop(self, search, command, now: float) -> str:
        self.stopping = True
        search.events.append(("stopping", {"by": "atoll stop", "in_flight": search.in_flight()}))
        return ("stopping as on Ctrl-C: everything finished is committed, work in flight is dropped and redone by "
                f"a resume ({resume_command(search.run_dir)})")

    def _set(self, search, command, now: float) -> str:
        key, value = command.key, command.value
        new = budget_change(search.config, key, value, search.config.run.max_evals - search._budget_left())
        search.config = new
        search.progress.max_evals, search.progress.max_wall_s = new.run.max_evals, new.run.max_wall_s
        if new.mutator.llm is not None:
            search.proposals.config, search.proposals.llm = new, new.mutator.llm
            search.proposals.budget.limits = new.mutator.llm.budget
        search.archive.con.execute("UPDATE runs SET config = ? WHERE run_id = ?",
                                   [json.dumps(new.model_dump(mode="json")), search.run_id])
        search.events.append(("budget-set", {"key": key, "value": _get(new, key)}))
        return f"{key} = {_get(new, key)} (kept in the run's config, so a resume keeps it too)"

    def _status(self, search, command, now: float) -> dict:
        evals, elapsed = _evaluations(search), self.searched_s(now)
        config = search.config.run
        budgets = [("evaluations", evals, config.max_evals), ("wall_s", elapsed, config.max_wall_s)]
        if search.config.mutator.llm is not None:
            spent, limits = search.proposals.budget, search.config.mutator.llm.budget
            budgets += [(f"llm_{k}", getattr(spent, k), getattr(limits, k)) for k in ("calls", "tokens", "cost")]
        first = self._samples[0] if self._samples else (now, evals, self.proposals)
        span = max(now - first[0], 1e-9)
        return {"run_id": search.run_id, "paused": self.paused, "evaluations": evals, "elapsed_s": elapsed,
                "evals_per_s": (evals - first[1]) / span, "proposals_per_s": (self.proposals - first[2]) / span,
                "in_flight": search.in_flight(), "best": search.best_score,
                "islands": search.islands.island_bests(), "failures": dict(self.failure_kinds),
                "protections": self.protections, "budgets": budgets}

    # --- events ------------------------------------------------------------------------
    def on_commit(self, search) -> None:
        """Publish what this batch committed: its events, its failed and raced evaluations and the LLM budget.

        A raced evaluation (stopped early as worse than its parent) is a "raced" event, never a failure,
        as `atoll status` counts it; the failure counts are of search evaluations, as a resume counts them."""
        for kind, detail in search.events:
            self.steering.publish(kind, detail)
        for candidate, result in search.results:
            if result.status == Status.OK:
                continue
            detail = {"program_id": candidate.program_id, "island": candidate.island, "split": result.split,
                      "status": result.status.value, "error": (result.error or "")[:300]}
            if result.status == Status.RACED:
                self.steering.publish("raced", detail)
                continue
            if result.split == "search":
                self.failure_kinds[result.status.value] += 1
            self.steering.publish("failure", detail)
        if search.proposals.rows:
            budget = search.proposals.budget
            self.steering.publish("llm-budget", {"calls": budget.calls, "tokens": budget.tokens,
                                                 "cost": round(budget.cost, 6), "left": budget.left()})


def budget_change(config, key: str, value: str, floor_evals: int):
    """The config with `key` set to `value`; a key that cannot change live or a bad value is Refused."""
    from controller.config import AtollConfig, ConfigError, _first_error, _no_bool_as_number, apply_overrides

    if key not in LIVE_BUDGETS:
        raise Refused(f"{key}: not a budget that can change during a run; one of {', '.join(LIVE_BUDGETS)}")
    if key.startswith("mutator.llm.") and config.mutator.llm is None:
        raise Refused(f"{key}: this run has no LLM models ([mutator.llm]), so it has no LLM budget")
    try:
        tree = apply_overrides(config.model_dump(mode="json"), [f"{key}={value}"])
        new = AtollConfig.model_validate(tree)
        _no_bool_as_number(new, tree)  # pydantic takes true as 1: run.max_wall_s=true ended the run in a second
    except ValidationError as exc:
        raise Refused(_first_error(exc)) from None
    except ConfigError as exc:
        raise Refused(str(exc)) from None
    if key == "run.max_evals":
        evals_floor_checked(new, floor_evals)
    return new


def evals_floor_checked(config, floor_evals: int) -> None:
    """Refused when `run.max_evals` is below the evaluations finished or under way: the run would end at
    once, past its budget (a live `atoll set` and a resume's `--set` alike)."""
    if config.run.max_evals < floor_evals:
        raise Refused(f"run.max_evals: {config.run.max_evals} is below the {floor_evals} evaluations finished or "
                      f"under way; give at least {floor_evals}")


def _get(config, key: str):
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _evaluations(search) -> int:
    return search.done + len(search.results)
