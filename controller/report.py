"""The held-out table: the evolved best against every baseline, on data the search never saw."""
from __future__ import annotations

import time

import ray
from rich.table import Table

from controller.actors import evaluator_count, new_evaluator
from controller.memory import library_note
from evaluators.secrets import replay_note
from store.records import Candidate, Status


def _evaluate_all(actors, programs: dict[str, tuple[str, str]], console, on_done=None) -> tuple[dict, dict]:
    """Score `programs` (label -> (program_id, code)) on the held-out split and measure the domain's
    reference figures; returns (label -> EvalResult in `programs` order, reference).

    Each actor takes the next job as soon as it is free (held-out jobs differ by minutes);
    the reference figures go first, since they are often the longest job (SCIP's own rules).
    Prints one line per finished job and hands each result to `on_done(label, result)` as it
    arrives, so a crash later in the report loses none of the finished ones.
    """
    start = time.monotonic()
    jobs = [(None, None)] + list(programs.items())
    console.print(f"[atoll] held-out: scoring {len(programs)} programs and measuring the domain's reference "
                  f"figures on {len(actors)} evaluators" if programs else
                  "[atoll] held-out: measuring the domain's reference figures")
    results, reference, running, free = {}, None, {}, list(actors)
    while jobs or running:
        while jobs and free:
            actor = free.pop(0)
            label, program = jobs.pop(0)
            ref = actor.reference.remote("heldout") if label is None else actor.evaluate.remote(*program, "heldout")
            running[ref] = (label, actor)
        ready, _ = ray.wait(list(running), num_returns=1)
        label, actor = running.pop(ready[0])
        free.append(actor)
        elapsed = f"{time.monotonic() - start:.0f}s"
        if label is None:
            reference = ray.get(ready[0])
            console.print(f"[atoll] held-out: reference figures measured ({elapsed})")
            continue
        results[label] = ray.get(ready[0])
        console.print(f"[atoll] held-out: {label} {results[label].status.value} "
                      f"({len(results)}/{len(programs)}, {elapsed})")
        if on_done is not None:
            on_done(label, results[label])
    return {label: results[label] for label in programs}, reference


def _print_table(console, title: str, columns, rows, notes) -> None:
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for note in notes:
        console.print(note)


def heldout_report(archive, run_id: str, domain, evaluators, console) -> dict:
    """Score the best program and the baselines on the held-out split, store and print them.

    Held-out results already in the archive (an earlier report of this run, stopped
    part-way or not) are reused, not re-evaluated.
    """
    best = archive.best_program(run_id, "search")
    programs = {f"baseline: {name}": (f"baseline-{name}-{run_id}", code) for name, code in domain.baselines().items()}
    if best:
        programs["evolved best"] = (best["program_id"], best["code"])
    stored = {label: _as_result(row) for label, (pid, _) in programs.items()
              if (row := archive.evaluation(pid, "heldout")) is not None}
    if stored:
        console.print(f"[atoll] held-out: {len(stored)} of {len(programs)} programs already scored, "
                      f"from the archive: {', '.join(stored)}")
    todo = {label: program for label, program in programs.items() if label not in stored}
    scored, reference = _evaluate_all(evaluators, todo, console,
                                      on_done=lambda label, result: _store(archive, run_id, label, todo[label], result))
    results = {**stored, **scored}
    results = {label: results[label] for label in programs}
    reference = dict(reference, trials=search_trials(archive, run_id))
    columns, rows, notes = domain.heldout_table(results, reference)
    run_config = (archive.get_run(run_id) or {}).get("config", {})
    notes = _with_replay_note(notes, run_config.get("run", {}).get("replay_seed"))
    _print_table(console, f"held-out split ({domain.name})", columns, rows, [*notes, library_note(archive, run_id)])
    return results


def _with_replay_note(notes: list[str], replay_seed: int | None) -> list[str]:
    """A replayable run's table says so plainly, below the domain's own notes."""
    note = replay_note(replay_seed)
    return list(notes) + ([note] if note else [])


def search_trials(archive, run_id: str) -> dict:
    """How many programs the run evaluated on the search split, and the scores of those that scored.

    Domains use it to correct the best's figure for selection among every trial
    (for example the Deflated Sharpe Ratio); failed programs count as trials too.
    """
    scores = [row["score"] for row in archive.programs_with_scores(run_id, "search")
              if row["status"] == Status.OK.value and row["score"] is not None]
    return {"count": archive.count_evaluations(run_id, "search"), "search_scores": scores}


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
    results, reference = _evaluate_all(actors, programs, console)
    columns, rows, notes = domain.heldout_table(results, reference)
    notes = _with_replay_note(notes, config.run.replay_seed)
    _print_table(console, f"baselines, held-out split ({domain.name})", columns, rows, notes)
    return results
