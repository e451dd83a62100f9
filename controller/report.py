"""The held-out table: the evolved best against every baseline, on data the search never saw."""
from __future__ import annotations

import json
import time

import ray
from ray.exceptions import RayActorError, RayTaskError
from rich.table import Table

from controller import faults
from controller.actors import evaluator_count, new_evaluator
from controller.crowning import crowned
from controller.memory import library_note
from evaluators.secrets import replay_note
from store.columns import to_json
from store.records import Candidate, EvalResult, Status

REPORT_RETRIES = 1  # a held-out job whose evaluator died is run once more on a fresh one
EVOLVED = "evolved best"  # the label of the run's best program (`controller.crowning`) in every domain's table
REFERENCE_EVENT = "heldout-reference"  # the domain's held-out reference figures, as first measured for the run


def _evaluate_all(actors, programs: dict[str, tuple[str, str]], console, new_actor,
                  on_done=None, reference: bool = True, on_reference=None) -> tuple[dict, dict, str]:
    """Score `programs` (label -> (program_id, code)) on the held-out split and measure the domain's
    reference figures (unless not `reference`); returns (label -> EvalResult in `programs` order,
    reference, and why the reference figures are missing, or '').

    Each actor takes the next job as soon as it is free (held-out jobs differ by minutes);
    the reference figures go first, since they are often the longest job (SCIP's own rules).
    Prints one line per finished job and hands each result to `on_done(label, result)` as it
    arrives, and the reference figures, when measured, to `on_reference(figures)`, so a crash or a
    stop later in the report loses none of the finished ones. A job whose code
    raises, or whose evaluator dies (twice: it runs again on a fresh one from `new_actor`),
    ends as a result that says so, and the rest of the table stands.
    """
    start = time.monotonic()
    figures = " and measuring the domain's reference figures" if reference else ""
    console.print(f"[atoll] held-out: scoring {len(programs)} programs{figures} on {len(actors)} evaluators"
                  if programs else "[atoll] held-out: measuring the domain's reference figures")
    pool = _Pool(actors, new_actor, programs, reference)
    results, reference = {}, ({}, "")
    while pool.jobs or pool.running:
        label, outcome = pool.next_done()
        if outcome is None:
            continue  # its evaluator died; the job went back on the queue
        elapsed = f"{time.monotonic() - start:.0f}s"
        if label is None:
            reference = outcome
            if on_reference is not None and not outcome[1]:
                on_reference(outcome[0])
            console.print(f"[atoll] held-out: reference figures {'FAILED' if outcome[1] else 'measured'} ({elapsed})")
            continue
        results[label] = outcome
        if on_done is not None:  # kept before it is said: a stop at the line loses nothing
            on_done(label, outcome)
        console.print(f"[atoll] held-out: {label} {outcome.status.value} ({len(results)}/{len(programs)}, {elapsed})")
    return {label: results[label] for label in programs}, *reference


class _Pool:
    """The report's evaluators, one job each at a time; what becomes of a lost one's job is
    decided by `controller.faults`, as in the search."""

    def __init__(self, actors, new_actor, programs: dict, reference: bool = True, split: str = "heldout"):
        self.free, self.new_actor, self.programs, self.split = list(actors), new_actor, programs, split
        self.jobs = [None, *programs] if reference else list(programs)  # labels; None is the reference figures
        self.running: dict = {}
        self.deaths = faults.Deaths(REPORT_RETRIES)

    def next_done(self):
        """(label, outcome) of the next finished job: an EvalResult, (reference, error) for the
        reference figures, or None when the job's evaluator died and the job was queued again."""
        while self.jobs and self.free:
            actor, label = self.free.pop(0), self.jobs.pop(0)
            call = actor.reference.remote("heldout") if label is None else \
                actor.evaluate.remote(*self.programs[label], self.split)
            self.running[call] = (label, actor)
        ref = ray.wait(list(self.running), num_returns=1)[0][0]
        label, actor = self.running.pop(ref)
        try:
            value = ray.get(ref)
        except RayActorError as exc:
            return label, self._lost(ref, label, actor, exc)
        except RayTaskError as exc:
            value = self._failed(label, ("the domain's reference computation raised: " if label is None else
                                         "internal evaluator error: ") + faults.task_error(exc))
        else:
            value = (value, "") if label is None else value
        self.free.append(actor)
        return label, value

    def _lost(self, ref, label, actor, exc):
        faults.retire(actor)
        self.free.append(self.new_actor())
        job = "measurement of the reference figures" if label is None else "evaluation"
        fate = faults.triage({ref: label or "reference"}, self.deaths, job)
        if fate.retry:
            self.jobs.insert(0, label)
            return None
        return self._failed(label, fate.reason)

    def _failed(self, label, reason: str):
        if label is None:
            return {}, reason
        return EvalResult(self.programs[label][0], self.split, Status.FAILED, error=reason)


def _print_table(console, title: str, columns, rows, notes) -> None:
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for note in notes:
        console.print(note)


def _table(domain, results: dict, reference: dict, reference_error: str, replay_seed: int | None):
    """The domain's table; reference figures that could not be measured become a row saying why,
    and a replayable run says so below the domain's own notes."""
    columns, rows, notes = domain.heldout_table(results, reference)
    if reference_error:
        rows = [*rows, ("reference figures", f"FAILED: {reference_error}", *[""] * (len(columns) - 2))]
    return columns, rows, _with_replay_note(notes, replay_seed)


def heldout_report(archive, run_id: str, domain, evaluators, console, new_actor, again: bool = False) -> dict:
    """Score the best program and the baselines on the held-out split, store and print them.

    Held-out results already in the archive (an earlier report of this run, stopped
    part-way or not) are reused, not re-evaluated, and so are the domain's reference figures
    as first measured for the run: a report with nothing to score calls `evaluators()` (which
    starts them, and Ray) not at all. With `again`, stored results that did not end OK (a
    timeout on a busy machine) are scored again. `new_actor()` replaces an evaluator that died.
    """
    actors: list = []

    def started() -> list:
        if not actors:
            actors.extend(evaluators())
        return actors

    validate = None if archive.read_only else lambda jobs: _validated(archive, run_id, started(), new_actor, jobs)
    best = crowned(archive, run_id, validate, lambda: len(started()), console, again)
    programs, stored = heldout_programs(archive, run_id, domain, best)
    if EVOLVED not in programs:
        why = ("every program checked failed on the validation split" if archive.best_program(run_id, "search")
               else "no program of this run scored OK on the search split")
        console.print(f"[atoll] held-out: {why}, so the table has no evolved best: the baselines alone",
                      soft_wrap=True)
    redo = {label: result for label, result in stored.items() if again and result.status != Status.OK}
    if redo:
        console.print("[atoll] held-out: scoring again what did not end OK: "
                      + ", ".join(f"{label} ({result.status.value})" for label, result in redo.items()))
        stored = {label: result for label, result in stored.items() if label not in redo}
    if stored:
        console.print(f"[atoll] held-out: {len(stored)} of {len(programs)} programs already scored, "
                      f"from the archive: {', '.join(stored)}")
    todo = {label: program for label, program in programs.items() if label not in stored}

    def evaluated(jobs: dict, figures: bool) -> tuple[dict, dict, str]:
        """`jobs` scored (each stored as it arrives) and, if `figures`, the reference figures measured
        and kept, on the evaluators started at the first need (once)."""
        return _evaluate_all(started(), jobs, console, new_actor, reference=figures,
                             on_done=lambda label, result: _store(archive, run_id, label, jobs[label], result),
                             on_reference=lambda measured: _store_reference(archive, run_id, measured))

    known = stored_reference(archive, run_id)
    if known is not None:
        console.print("[atoll] held-out: the domain's reference figures from the archive, as first measured for "
                      "this run")
    scored, reference, reference_error = {}, known, ""
    if todo or known is None:
        scored, measured, reference_error = evaluated(todo, known is None)
        reference = measured if known is None else known
    results = {**stored, **scored}
    results = {label: results[label] for label in programs}
    trials = search_trials(archive, run_id)
    run_config = (archive.get_run(run_id) or {}).get("config", {})
    replay_seed = run_config.get("run", {}).get("replay_seed")
    try:
        columns, rows, notes = _table(domain, results, dict(reference, trials=trials), reference_error, replay_seed)
    except Exception:  # figures stored by another version of the domain: measured again
        if known is None:
            raise
        console.print("[atoll] held-out: the stored reference figures do not fit this version of the domain; "
                      "measuring them again")
        _, reference, reference_error = evaluated({}, True)
        columns, rows, notes = _table(domain, results, dict(reference, trials=trials), reference_error, replay_seed)
    _print_table(console, f"held-out split ({domain.name})", columns, rows,
                 [*notes, library_note(archive, run_id)])
    return results


def not_ok(results: dict) -> list[str]:
    """One line per held-out result that did not end OK, with how to score it again."""
    return [f"held-out: {label} did not end OK ({result.status.value}"
            + (f": {result.reason()[:200]}" if result.error else "") + ")"
            for label, result in results.items() if result.status != Status.OK]


def stored_reference(archive, run_id: str) -> dict | None:
    """The domain's held-out reference figures stored for the run (the last stored), or None."""
    row = archive.con.execute("SELECT data FROM events WHERE run_id = ? AND kind = ? ORDER BY ts DESC LIMIT 1",
                              [run_id, REFERENCE_EVENT]).fetchone()
    return json.loads(row[0])["figures"] if row else None


def _json_keeps(value) -> bool:
    try:
        return bool(json.loads(to_json(value)) == value)
    except (ValueError, TypeError):  # numpy arrays compare element-wise
        return False


def _store_reference(archive, run_id: str, reference: dict) -> None:
    """Keep the reference figures for the run's later reports, where JSON holds them as they are (a
    domain's figures that it would not give back the same, say a tuple or a NaN, are measured at each
    report, as before), and where the archive may be written (a read-only copy's report writes nothing)."""
    if archive.read_only or not _json_keeps(reference):
        return
    archive.write(run_id, events=[(REFERENCE_EVENT, {"figures": reference})])


def _validated(archive, run_id: str, actors: list, new_actor, jobs: dict[str, str]) -> dict:
    """`jobs` (program_id -> code) scored on the validation split on `actors` (a lost one replaced
    there), each result stored as it arrives; program_id -> EvalResult."""
    pool = _Pool(actors, new_actor, {pid: (pid, code) for pid, code in jobs.items()}, reference=False,
                 split="validation")
    results = {}
    while pool.jobs or pool.running:
        pid, result = pool.next_done()
        if result is not None:
            archive.record_evaluations([result], run_id)
            results[pid] = result
    actors[:] = pool.free
    return results


def heldout_programs(archive, run_id: str, domain, best: dict | None) -> tuple[dict, dict]:
    """The report's programs (label -> (program_id, code)): the baselines and the evolved `best`
    (`controller.crowning`); and label -> EvalResult of those whose held-out result the archive holds already."""
    programs = {f"baseline: {name}": (f"baseline-{name}-{run_id}", code) for name, code in domain.baselines().items()}
    if best:
        programs[EVOLVED] = (best["program_id"], best["code"])
    stored = {label: _as_result(row) for label, (pid, _) in programs.items()
              if (row := archive.evaluation(pid, "heldout")) is not None}
    return programs, stored


def _with_replay_note(notes: list[str], replay_seed: int | None) -> list[str]:
    """A replayable run's table says so plainly, below the domain's own notes."""
    note = replay_note(replay_seed)
    return list(notes) + ([note] if note else [])


def search_trials(archive, run_id: str) -> dict:
    """How many programs the run evaluated on the search split, and the scores of those that scored.

    Domains use it to correct the best's figure for selection among every trial
    (for example the Deflated Sharpe Ratio); failed programs count as trials too.
    """
    return {"count": archive.count_evaluations(run_id, "search"), "search_scores": archive.search_scores(run_id)}


def _store(archive, run_id: str, label: str, program: tuple[str, str], result) -> None:
    """One held-out result: a baseline is recorded with its program row, a searched program's alone."""
    if label.startswith("baseline: "):
        pid, code = program
        name = label.removeprefix("baseline: ")
        archive.record([(Candidate(pid, run_id, -1, 0, (), code, f"baseline:{name}", time.time()), result)])
    else:
        archive.record_evaluations([result], run_id)


def _as_result(row: dict):
    from store.records import EvalResult

    return EvalResult(row["program_id"], "heldout", Status(row["status"]), score=row["score"],
                      metrics=row.get("metrics") or {}, instance_scores=tuple(row.get("instance_scores") or ()),
                      error=row.get("error"))


def baseline_report(config, console, secrets) -> dict:
    """Baselines alone on the held-out split, on `secrets` (fresh ones unless replayed): no search, no archive."""
    from evaluators.registry import get_domain

    domain = get_domain(config.domain, secrets=secrets)
    actors = [new_evaluator(config, secrets=secrets) for _ in range(evaluator_count(config))]
    programs = {f"baseline: {name}": (f"baseline-{name}", code) for name, code in domain.baselines().items()}
    results, reference, error = _evaluate_all(actors, programs, console,
                                              lambda: new_evaluator(config, secrets=secrets))
    _print_table(console, f"baselines, held-out split ({domain.name})",
                 *_table(domain, results, reference, error, config.run.replay_seed))
    return results
