"""`atoll lineage`: how a program was made, step by step from its root (the seed, a library elite,
a baseline), each step with its source, its score, its gain over its parent and, with --diff, what
it changed.

A step's parent is its first parent (`programs.parent_ids[1]`, the program it was edited from); a
crossover's other parents are named beside it. Read as `store.query` serves the archive (the live
driver while a run holds it, the file, or an archive file given itself), so it works during a run,
after it and on a backup's copy. The ancestors come from the `lineage_of` macro, which walks the
lineage table by commit number, so a deep chain costs no scan per step.
"""
from __future__ import annotations

import difflib
import math
import shlex
import sys
from pathlib import Path

from controller.cli import UserError
from controller.crowning import BEST_FIRST, PASSED_OVER, SEARCH_JOIN, SEARCH_OK
from controller.read_commands import console, json_line, print_rows, query_run
from controller.terminal import visible
from store.readonly import first_line

SHOWN_MATCHES = 5  # ids named when a prefix matches several programs


def cmd_lineage(args) -> int:
    run_dir = Path(args.run_dir)
    if args.last is not None and args.last < 1:
        raise UserError("--last takes a number of steps of at least 1")
    pid, note = _program(run_dir, args.program)
    chain = _chain(run_dir, pid)
    shown = chain if args.last is None else chain[-args.last:]
    first = shown[0]["step"]  # a diff of the first step shown needs its parent's code too
    whole = args.whole
    code = (_code(run_dir, [s["program_id"] for s in chain[max(first - 1, 0):]]) if args.diff or args.json else
            _code(run_dir, [chain[max(first - 1, 0)]["program_id"], pid]) if whole else {})
    calls = _calls(run_dir, [s["program_id"] for s in shown if s["source"].startswith("llm:")]) if args.diff or args.json else {}
    if args.json:
        for step in shown:
            call = calls.get(step["program_id"])
            print(json_line({**step, "code": code.get(step["program_id"]), "llm_call": call and call[0]}))
        if note:
            print(note, file=sys.stderr)
        return 0
    top = chain[-1]
    root = chain[0]
    console.print(f"program {pid}: {_score(top['score'], 'search score')}"
                  + ("" if top["heldout"] is None else f", held-out {top['heldout']:.6g}")
                  + f"; {len(chain) - 1} step{'' if len(chain) == 2 else 's'} from {root['program_id']} "
                    f"({root['source']})" + (f", the latest {len(shown)} shown" if len(shown) < len(chain) else ""),
                  soft_wrap=True)
    from controller.backup import stamp

    cols = ["step", "program_id", "made", "island", "source", "score", "gain", "held-out", "other parents"]
    print_rows(cols, [(s["step"], s["program_id"], stamp(s["made"]), s["island"], s["source"],
                       _num(s["score"]) or s["status"] or "", _gain(s["gain"]), _num(s["heldout"]),
                       ", ".join(s["other_parents"]))
                      for s in shown], None)
    if args.diff:
        _print_diffs(shown, chain, code, calls, run_dir)
    if whole:
        _print_whole(chain[max(first - 1, 0)], chain[-1], code)
    if note:
        print(note, file=sys.stderr)
    return 0


def _program(run_dir: Path, given: str | None) -> tuple[str, str | None]:
    """The program asked for (an id, or a prefix of exactly one), else the run's best as `atoll best` and the
    report crown it (the best search score whose validation did not fail); and the read's note."""
    if given is None:
        _, rows, note = query_run(run_dir, (
            f"SELECT p.program_id FROM {SEARCH_JOIN} WHERE {SEARCH_OK} ORDER BY {PASSED_OVER}, "
            f"{BEST_FIRST.removeprefix('ORDER BY ')} LIMIT 1"))
        if not rows:
            raise UserError(f"{run_dir} has no successfully evaluated program yet; name one: atoll lineage "
                            f"{run_dir} PROGRAM_ID")
        return rows[0][0], note
    literal = given.replace("'", "''")
    _, rows, note = query_run(run_dir, (
        f"SELECT program_id FROM programs WHERE program_id = '{literal}' UNION ALL "
        f"(SELECT program_id FROM programs WHERE starts_with(program_id, '{literal}') AND program_id <> '{literal}' "
        f"ORDER BY seq LIMIT {SHOWN_MATCHES + 1})"))
    ids = [pid for (pid,) in rows]
    if given in ids:
        return given, note
    if not ids:
        raise UserError(f"{run_dir} has no program {given!r} (ids are in atoll progress {run_dir}, or: atoll query "
                        f"{run_dir} \"SELECT program_id, search_score FROM programs ORDER BY search_score DESC LIMIT 10\")")
    if len(ids) > 1:
        named = ", ".join(ids[:SHOWN_MATCHES]) + (", ..." if len(ids) > SHOWN_MATCHES else "")
        raise UserError(f"{given!r} begins {'more than ' if len(ids) > SHOWN_MATCHES else ''}"
                        f"{min(len(ids), SHOWN_MATCHES)} program ids ({named}); give more of it")
    return ids[0], note


def _chain(run_dir: Path, pid: str) -> list[dict]:
    """The program and its first parents back to a program with none, oldest first, as dicts."""
    literal = pid.replace("'", "''")
    cols, rows, _ = query_run(run_dir, (
        f"WITH a AS (SELECT program_id FROM lineage_of('{literal}')) "
        "SELECT p.program_id, p.parent_ids, p.island, p.mutator AS source, p.created_at AS made, "
        "s.status, s.score, s.error, h.score AS heldout FROM programs p "
        "JOIN a ON a.program_id = p.program_id "
        "LEFT JOIN evaluations s ON s.program_id = p.program_id AND s.split = 'search' "
        "LEFT JOIN evaluations h ON h.program_id = p.program_id AND h.split = 'heldout' AND h.status = 'OK'"))
    known = {row[0]: dict(zip(cols, row)) for row in rows}
    if pid not in known:
        raise UserError(f"{run_dir}: program {pid} has no lineage in this archive")
    chain, seen, at = [], set(), pid
    while at in known and at not in seen:  # a cycle cannot be written; stop at one all the same
        seen.add(at)
        row = known[at]
        chain.append(row)
        parents = list(row["parent_ids"] or [])
        at = parents[0] if parents else None
    chain.reverse()
    for i, row in enumerate(chain):
        parents = list(row.pop("parent_ids") or [])
        score = row["score"] if row["status"] == "OK" else None
        parent = chain[i - 1]["score"] if i else None
        row.update(step=i, score=score, parent_id=parents[0] if parents else None, other_parents=parents[1:],
                   gain=None if score is None or parent is None else score - parent)
    if chain[0]["parent_id"] is not None:  # the first parent is not in the archive (a foreign id)
        chain[0]["source"] += f" (from {chain[0]['parent_id']}, not in this archive)"
    elif chain[0]["source"] == "warm-start":  # an elite of an earlier run, from the library
        chain[0]["source"] += _elite_of(run_dir, chain[0]["program_id"])
    return [{key: row[key] for key in ("step", "program_id", "parent_id", "other_parents", "made", "island",
                                       "source", "status", "score", "gain", "heldout", "error")} for row in chain]


def _elite_of(run_dir: Path, pid: str) -> str:
    """Where a warm start's elite came from: the run and program its lineage goes on in."""
    try:
        _, rows, _ = query_run(run_dir, "SELECT source_run, source_program_id FROM warm_starts "
                                        f"WHERE program_id IN ({_listed([pid])}) LIMIT 1")
    except UserError:  # an archive from before the library
        return ""
    if not rows or not rows[0][1]:
        return ""
    run, program = rows[0]
    return (f" (run {run}'s {program}; its lineage goes on there: atoll lineage ITS_RUN_DIR {program}, "
            "the directory as atoll runs lists it)")


def _listed(ids: list[str]) -> str:
    """Program ids as an SQL list of literals."""
    return ", ".join("'" + pid.replace("'", "''") + "'" for pid in ids)


def _code(run_dir: Path, ids: list[str]) -> dict[str, str]:
    _, rows, _ = query_run(run_dir, f"SELECT program_id, code FROM programs WHERE program_id IN ({_listed(ids)})")
    return dict(rows)


def _calls(run_dir: Path, ids: list[str]) -> dict[str, tuple]:
    """The LLM call that made each program of `ids` (its last, after any diagnosis): (call id, model,
    tokens in, tokens out, seconds). Empty where the archive has no such record."""
    if not ids:
        return {}
    try:
        _, rows, _ = query_run(run_dir, (
            "SELECT program_id, arg_max(call_id, created_at), arg_max(model, created_at), arg_max(tokens_in, created_at), "
            "arg_max(tokens_out, created_at), arg_max(latency_s, created_at) FROM llm_calls "
            f"WHERE program_id IN ({_listed(ids)}) GROUP BY program_id"))
    except UserError:
        return {}
    return {row[0]: row[1:] for row in rows}


def _made_by(call: tuple | None, run_dir: Path) -> str:
    if call is None:
        return ""
    call_id, model, tokens_in, tokens_out, latency = call
    return (f"made by {model} in {latency or 0:.1f} s ({tokens_in or 0:,} tokens in, {tokens_out or 0:,} out); "
            f"its prompt and reply: atoll query {shlex.quote(str(run_dir))} \"SELECT p.prompt, c.completion FROM "
            f"llm_calls c JOIN llm_prompts p USING (call_id) WHERE call_id = '{call_id}'\"\n")


def _print_diffs(shown: list[dict], chain: list[dict], code: dict[str, str], calls: dict[str, tuple],
                 run_dir: Path) -> None:
    """Each shown step's unified diff from its parent (the first step shown with no parent: its whole
    code), one print a step; an LLM's step names its call. A Text is not a string, so the control
    characters are written out here."""
    from rich.text import Text

    for step in shown:
        i = step["step"]
        head = f"step {i}: {step['program_id']} ({step['source']}, " + (
            _score(step["score"], "score") if step["score"] is not None or not step["status"]
            else f"{step['status']}: {first_line(step['error'] or '')[:300]}")
        text = Text("\n" + visible(head + (")" if step["gain"] is None else f", gain {_gain(step['gain'])})")) + "\n",
                    style="bold")
        text.append(visible(_made_by(calls.get(step["program_id"]), run_dir)))
        if i == 0:
            lines = ["  " + line for line in _lines(code.get(step["program_id"], ""))]
        else:
            before, after = _lines(code.get(chain[i - 1]["program_id"], "")), _lines(code.get(step["program_id"], ""))
            lines = list(difflib.unified_diff(before, after, chain[i - 1]["program_id"], step["program_id"],
                                              n=2, lineterm="")) or ["  (the same code as its parent)"]
        _append_diff(text, lines)
        console.print(text, soft_wrap=True, end="")


def _print_whole(start: dict, end: dict, code: dict[str, str]) -> None:
    """What all the steps from `start` to `end` changed together, as one unified diff."""
    from rich.text import Text

    steps = end["step"] - start["step"]
    text = Text(f"\nfrom {start['program_id']} ({start['source']}) to {end['program_id']}, "
                + ("1 step:\n" if steps == 1 else f"{steps} steps together:\n"), style="bold")
    lines = list(difflib.unified_diff(_lines(code.get(start["program_id"], "")), _lines(code.get(end["program_id"], "")),
                                      start["program_id"], end["program_id"], n=2, lineterm=""))
    _append_diff(text, lines or ["  (the same code)"])
    console.print(text, soft_wrap=True, end="")


def _append_diff(text, lines: list[str]) -> None:
    """Diff lines onto a rich Text, added ones green, removed ones red, hunk heads cyan; control
    characters written out (a Text is not a string, which the console would see to)."""
    for line in lines:
        style = ("green" if line.startswith("+") and not line.startswith("+++") else
                 "red" if line.startswith("-") and not line.startswith("---") else
                 "cyan" if line.startswith("@@") else "")
        text.append(visible(line) + "\n", style=style)


def _lines(text: str) -> list[str]:
    """A program's lines, cut at newlines only (`splitlines` also cuts at a CR or a form feed that a
    program stored before replies were checked may hold, and would show lines that are not there)."""
    return text.removesuffix("\n").split("\n")


def _num(value) -> str:
    return "" if value is None else f"{value:.6g}"


def _gain(value) -> str:
    if value is None or not math.isfinite(value):
        return ""
    return f"{value:+.4g}"


def _score(value, what: str) -> str:
    return f"no OK {what}" if value is None else f"{what} {value:.6g}"
