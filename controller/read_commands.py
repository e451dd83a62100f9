"""The CLI's read-only commands (`atoll status`, `query`, `best`) and the console every command prints to.

They read a run's archive as `store.query` serves it: from the live driver while a run holds
it, else from the file; none of them writes.
"""
from __future__ import annotations

import json
import math
import os
import shlex
import sys
from pathlib import Path

from controller.cli import UserError
from controller.crowning import BEST_FIRST, PASSED_OVER, SEARCH_JOIN, SEARCH_OK
from controller.memory_commands import library_query
from controller.terminal import SafeConsole, visible

# Output to a file or a pipe (a log, a job's driver output) is not cut to 80 columns:
# the held-out tables stay one line per row there.
# Markup off: what it prints is mostly data (programs, errors, paths, query results), where rich
# read `params[i]` or `[atoll]` as a style tag and dropped it. A styled line gives a style, never markup.
# Control characters in that data (an LLM's program, a candidate's error) are written out (controller.terminal).
console = SafeConsole(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160, markup=False)


def cmd_status(args) -> int:
    from controller.rundir import STOPPED
    from store.query import is_archive_file, is_damaged, is_live

    run_dir = Path(args.run_dir)
    sql = ("SELECT r.run_id, r.status, r.started_at, r.ended_at, "
           "(SELECT count(*) FROM evaluations e WHERE e.run_id = r.run_id AND split = 'search') AS evals, "
           "(SELECT max(score) FROM evaluations e WHERE e.run_id = r.run_id AND split = 'search' "
           "AND status = 'OK') AS best, (SELECT count(*) FROM evaluations e WHERE e.run_id = r.run_id "
           "AND split = 'search' AND status = 'RACED') AS raced, array_to_string(r.protections, ', ') AS sandbox FROM runs r "
           "ORDER BY started_at")
    try:
        cols, rows, note = query_run(run_dir, sql)
    except UserError:  # an archive from before the sandbox's protections were stored
        cols, rows, note = query_run(run_dir, sql.replace(", array_to_string(r.protections, ', ') AS sandbox", ""))
    if is_archive_file(run_dir):  # a backup or its copy: the run as it stood then, never live
        print_rows(cols, [(run_id, "running then" if status == "running" else status, *rest)
                          for run_id, status, *rest in rows], note)
        if rows:
            _status_progress(run_dir, rows[-1][0])
            _status_llm(run_dir, rows[-1][0])
        from controller.backup import when

        console.print(f"{run_dir} is an archive file (a backup, or its copy off a machine) of {when(run_dir)}; "
                      f"to continue its run from it: atoll resume NEWDIR --from-backup {run_dir}", soft_wrap=True)
        return 0
    unheld = not is_live(note) and not is_damaged(note)  # the query read the file: no live driver holds it
    # `created`: its driver died before the search began (while Ray started, say), and a resume begins it
    rows = [(run_id, STOPPED if unheld and status in ("running", "created") else status, *rest)
            for run_id, status, *rest in rows]
    print_rows(cols, rows, note)
    if rows:
        if not is_damaged(note):
            _status_progress(run_dir, rows[-1][0])
        _status_llm(run_dir, rows[-1][0])
        if not is_damaged(note):
            _status_backup(run_dir)
            _status_away(run_dir, rows[-1][0])
            _status_library_away(run_dir, rows[-1][0])
    if any(row[1] == STOPPED for row in rows):
        console.print("no driver holds this run: it stopped without ending (crash, kill or lost machine); "
                      f"everything committed is kept. Continue with: atoll resume {run_dir} (a run submitted as a "
                      f"Ray job: atoll submit --resume {run_dir} --address http://HEAD:8265)", soft_wrap=True)
    return 0


def _status_progress(run_dir: Path, run_id: str) -> None:
    """When the run's best last improved (the whole story: `atoll progress`)."""
    from controller.progress_command import last_improvement

    try:
        line = last_improvement(run_dir, run_id)
    except UserError:  # an archive read as it was written long ago (no programs.seq): the rest of status stands
        return
    if line:
        console.print(line, soft_wrap=True)


def _status_backup(run_dir: Path) -> None:
    """When the archive's backup (controller.backup) was made, and what it holds."""
    import duckdb

    from controller.backup import SEARCH_COUNT, when
    from controller.rundir import BACKUP

    backup = run_dir / BACKUP
    if not backup.is_file():
        return
    try:  # the file itself (a run renames each new backup into place whole)
        con = duckdb.connect(str(backup), read_only=True)
        try:
            held = f", {con.execute(SEARCH_COUNT).fetchone()[0]} search evaluations"
        finally:
            con.close()
    except duckdb.Error as exc:
        held = f", which does not open ({str(exc).strip().splitlines()[0][:200]})"
    console.print(f"backup: {backup}, of {when(backup)}{held} (if the archive is ever damaged: atoll resume "
                  f"{run_dir} --from-backup)", soft_wrap=True)


def _status_away(run_dir: Path, run_id: str) -> None:
    """The backup's last copy in controller.backup_dir (off this machine), and a copy that failed since."""
    run = run_id.replace("'", "''")
    _, rows, _ = query_run(run_dir, (
        "SELECT ts, data->>'away', data->>'away_error', data->>'search_evaluations' FROM events "
        f"WHERE run_id = '{run}' AND kind IN ('archive-backed-up', 'backup-copied') "  # older runs: in the backup's
        "AND (data->>'away' IS NOT NULL OR data->>'away_error' IS NOT NULL) ORDER BY ts"))
    from controller.backup import stamp

    made = [row for row in rows if row[1]]
    failed = f"; a later copy: {rows[-1][2]}" if rows and rows[-1][2] else ""
    if made:
        ts, target, _, evaluations = made[-1]
        console.print(f"backup's copy off this machine: {target}, of {stamp(ts)}, {evaluations} search evaluations (if "
                      f"this machine is lost: atoll resume NEWDIR --from-backup {target}){failed}", soft_wrap=True)
    elif failed:
        console.print(f"backup's copy off this machine: none made yet ({rows[-1][2]})", soft_wrap=True)


LOOK_S = 5.0  # how long status waits for controller.backup_dir to answer (a dead network mount never does)


def _status_library_away(run_dir: Path, run_id: str) -> None:
    """The library's newest copy in controller.backup_dir that knows the run (`controller.backup.LibraryAway`).
    The folder is read in a thread of its own: a mount whose server is gone does not hold up status."""
    import threading

    from controller.backup import library_copy_for, when

    run = run_id.replace("'", "''")
    _, rows, _ = query_run(run_dir, f"SELECT config FROM runs WHERE run_id = '{run}'")
    try:
        config = json.loads(rows[0][0]) if rows and rows[0][0] else {}
    except ValueError:
        return
    folder = (config.get("controller") or {}).get("backup_dir")
    memory = config.get("memory") or {}
    if not folder or not memory.get("enabled", True):
        return
    found: list = []

    def look() -> None:
        try:
            copy = library_copy_for(Path(folder).expanduser(), run_id)
            found.append((copy, copy and when(copy)))
        except OSError as exc:  # the copy replaced as it was read, a folder this user cannot read
            found.append((None, exc.strerror or str(exc)))
    looking = threading.Thread(target=look, daemon=True)
    looking.start()
    looking.join(LOOK_S)
    if not found:
        console.print(f"library's copy off this machine: {folder} did not answer within {LOOK_S:g} s", soft_wrap=True)
    elif found[0][0] is None and found[0][1]:
        console.print(f"library's copy off this machine: {folder} cannot be read ({found[0][1]})", soft_wrap=True)
    elif found[0][0] is None:
        console.print(f"library's copy off this machine: none in {folder} knows this run yet (one is made every "
                      "memory.backup_every_s)", soft_wrap=True)
    else:
        console.print(f"library's copy off this machine: {found[0][0]}, of {found[0][1]} (if this machine is lost, "
                      "atoll resume NEWDIR --from-backup FILE restores it where the new machine has no library)",
                      soft_wrap=True)


def _status_llm(run_dir: Path, run_id: str) -> None:
    """The latest run's LLM and per-source tables (absent from archives made before schema 5)."""
    from controller.llm_report import print_summary
    from store.query import QueryError, run_query

    def fetch(sql):
        try:
            cols, rows, _ = run_query(run_dir, sql)
        except QueryError:
            return [], []
        return cols, rows
    print_summary(console, fetch, run_id)


def query_run(run_dir: Path, sql: str):
    """Run read-only SQL on a run's archive (live or not): (columns, rows, note); bad SQL is a UserError."""
    from controller.backup import offer
    from controller.rundir import ARCHIVE, backup_left
    from store.query import QueryError, is_damaged, run_query

    try:
        cols, rows, note = run_query(run_dir, sql)
    except QueryError as exc:
        more = offer(run_dir) if is_damaged(str(exc)) else "" if (run_dir / ARCHIVE).is_file() else backup_left(run_dir)
        raise UserError(f"{exc}{more}") from None
    return cols, rows, (f"{note}{offer(run_dir)}" if is_damaged(note) else note)


def print_rows(cols, rows, note, as_json=False) -> None:
    """Rows as a table, or as JSON lines; the note (a live or stale archive) on stderr. A value too wide
    for its column folds onto the next lines, whole: a run directory or an id cut to `prici…` is of
    no use to whoever has to type it."""
    from rich.table import Column, Table

    if as_json:
        names = json_names(cols)
        for row in rows:
            print(json_line(dict(zip(names, row))))
    else:
        table = Table(*(Column(col, overflow="fold") for col in cols))
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        console.print(table)
    if note:
        print(note, file=sys.stderr)


def json_line(value) -> str:
    """`value` as one line of strict JSON: a NaN or an infinity (a failed program's score, a ratio over
    nothing) becomes null, as JSON has neither and jq, JavaScript and most parsers refuse Python's
    `NaN`; what JSON cannot hold otherwise (a timestamp, a UUID, a decimal) becomes its text."""
    return json.dumps(_finite(value), default=str, allow_nan=False)


def _finite(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_names(cols: list[str]) -> list[str]:
    """The columns' names as keys of a JSON object: a name given twice (`SELECT p.*, e.*` of a join has
    program_id, run_id, created_at twice) gets `_1`, `_2`, ... after its first, as DuckDB's own data
    frames name them, so no value overwrites another's."""
    taken, names = set(cols), []
    for col in cols:
        name, n = col, 0
        while name in names or (name != col and name in taken):
            n += 1
            name = f"{col}_{n}"
        names.append(name)
    return names


def cmd_query(args) -> int:
    if args.library:
        if args.run_dir is not None:
            raise UserError("give either a run directory or --library, not both")
        return library_query(args)
    if args.run_dir is None:
        raise UserError("give a run directory and SQL, or --library and SQL to query across runs")
    from store.readonly import QueryError, each_read

    try:
        statements = each_read(args.sql)
    except QueryError as exc:
        raise UserError(str(exc)) from None
    for i, sql in enumerate(statements):  # each statement's result in turn; the note once, at the end
        cols, rows, note = query_run(Path(args.run_dir), sql)
        print_rows(cols, rows, note if i == len(statements) - 1 else None, args.json)
    return 0


def metric_lines(metrics: dict) -> list[str]:
    """A program's metrics a line each: numbers to 5 significant digits, a list as its length, a
    table of tables (per instance, say) a line per row."""
    lines = []
    for key, value in metrics.items():
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            lines.append(f"{key}:")
            lines += [f"  {name}: {_inline(row)}" for name, row in value.items()]
        else:
            lines.append(f"{key}: {_inline(value)}")
    return lines


def _heldout_text(status: str | None, score: float | None, error: str | None) -> str:
    """The best's held-out score, or why there is none (an evaluation that did not end OK is no 'not yet')."""
    if status is None:
        return "not evaluated yet"
    if status != "OK":  # the reason as the held-out table gives it, never the program's own output
        from store.records import reason_line

        return f"none: {status}" + (f" ({reason_line(error)[:200]})" if (error or "").strip() else "")
    return f"{score:.5g}"


def _inline(value) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    if isinstance(value, list):
        return f"[{len(value)} values]"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_inline(v)}" if not isinstance(v, dict) else f"{k} ({_inline(v)})"
                         for k, v in value.items())
    return json.dumps(value)


def _no_best(run_dir: Path):
    """Why `atoll best` has no program to show: none scored OK on the search split, or every one that did
    failed its check on the validation split (it said "no successfully evaluated program yet")."""
    _, rows, _ = query_run(run_dir, f"SELECT count(*) FROM {SEARCH_JOIN} WHERE {SEARCH_OK}")
    if not rows[0][0]:
        raise UserError(f"{run_dir} has no successfully evaluated program yet")
    where = shlex.quote(str(run_dir))
    raise UserError(f"{run_dir}: each of its {rows[0][0]} programs that scored OK on the search split failed on the "
                    "validation split, so none is crowned; why: atoll query " + where + " \"SELECT program_id, "
                    "status, error FROM evaluations WHERE split = 'validation' AND status <> 'OK'\"")


def cmd_best(args) -> int:
    """The best program as the held-out report crowns it (`controller.crowning`: the best search score
    whose validation result did not fail; ties go to the shorter code, then the earlier), with its
    held-out result, or what became of it."""
    run_dir = Path(args.run_dir)
    cols, rows, note = query_run(run_dir, (
        "SELECT p.program_id, p.code, s.score, h.status, h.score AS heldout_score, h.error, "
        "h.metrics AS heldout_metrics "
        f"FROM {SEARCH_JOIN} LEFT JOIN evaluations h ON h.program_id = p.program_id AND h.split = 'heldout' "
        f"WHERE {SEARCH_OK} AND NOT {PASSED_OVER} {BEST_FIRST} LIMIT 1"))
    if not rows:
        _no_best(run_dir)
    pid, code, score, status, heldout, error, metrics = rows[0]
    again = f"; to score it again: atoll report {shlex.quote(str(run_dir))} --again" if status not in (None, "OK") else ""
    console.print(f"best program {pid}: search score {score:.5g}, held-out score "
                  f"{_heldout_text(status, heldout, error)}{again}", soft_wrap=True)
    print(visible(code))
    if metrics and json.loads(metrics):
        print(f"held-out metrics (whole: atoll query {shlex.quote(str(run_dir))} \"SELECT metrics FROM evaluations "
              f"WHERE split = 'heldout' AND program_id = '{pid}'\"):")
        for line in metric_lines(json.loads(metrics)):
            print("  " + line)
    print(f"how it was made, step by step: atoll lineage {shlex.quote(str(run_dir))} --diff", file=sys.stderr)
    if note:
        print(note, file=sys.stderr)
    if args.out:
        out = Path(args.out)
        try:
            out.write_text(code if code.endswith("\n") else code + "\n")
        except OSError as exc:
            raise UserError(f"cannot write the program to {out}: {exc.strerror or exc}") from None
        print(f"program {pid} written to {out}", file=sys.stderr)
    return 0
