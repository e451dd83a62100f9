"""Read-only SQL over a run's archive, also while the run is live.

A live run's driver holds the archive's write lock, so readers fall back to the
snapshot the driver publishes every few seconds and say how old it is. Writes
are refused three times over: statements are parsed and only reads are run, the
connection is read-only, and it cannot reach other files or change settings.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import duckdb

ARCHIVE = "archive.duckdb"
SNAPSHOT = "archive.snapshot.duckdb"
_READ_ONLY = {"enable_external_access": False, "autoinstall_known_extensions": False,
              "autoload_known_extensions": False, "lock_configuration": True}
_READ_PRAGMAS = frozenset({"table_info", "show", "show_tables", "show_tables_expanded", "show_databases",
                           "database_list", "database_size", "storage_info", "version", "platform", "functions"})
_ASK = "ask with SELECT (or DESCRIBE, SHOW, SUMMARIZE, EXPLAIN, PRAGMA table_info)"


_LIVE_NOTE = "live run: answered from its snapshot"


def from_snapshot(note: str | None) -> bool:
    """Whether `run_query`'s note says a live driver holds the archive (the answer came from its snapshot)."""
    return bool(note) and note.startswith(_LIVE_NOTE)


class QueryError(Exception):
    """Bad query or not a run directory: a one-line message for the user."""


def _connect(path: Path):
    return duckdb.connect(str(path), read_only=True, config=_READ_ONLY)


def _archive_of(run_dir: Path) -> Path:
    archive = run_dir / ARCHIVE
    if not archive.is_file():
        raise QueryError(f"{run_dir} is not a run directory (no {ARCHIVE} in it)")
    return archive


def open_read_only(run_dir: str | Path):
    """(connection, note): the archive itself, or the live snapshot with a note."""
    run_dir = Path(run_dir)
    archive = _archive_of(run_dir)
    try:
        return _connect(archive), None
    except duckdb.Error as exc:  # another process's lock, or this process's own writer
        if "lock" not in str(exc).lower() and "same database file" not in str(exc):
            raise QueryError(f"cannot open {archive}: {_first_line(exc)}") from None
    snapshot = run_dir / SNAPSHOT
    for _ in range(8):  # the first snapshot may be a moment away
        try:
            age = time.time() - snapshot.stat().st_mtime
            return _connect(snapshot), f"{_LIVE_NOTE}, {age:.1f} s old"
        except (FileNotFoundError, duckdb.Error):
            time.sleep(0.125)
    raise QueryError(f"{run_dir} is in use by a live run that has not published a snapshot yet; "
                     "retry in a few seconds")


def run_query(run_dir: str | Path, sql: str) -> tuple[list[str], list[tuple], str | None]:
    """Run read-only `sql` (one or more statements); returns the last one's columns and rows, and a note."""
    _archive_of(Path(run_dir))
    statements = _reads(sql)
    con, note = open_read_only(run_dir)
    try:
        for statement in statements:
            cursor = con.execute(statement)
        if cursor.description is None:
            return [], [], note
        return [d[0] for d in cursor.description], cursor.fetchall(), note
    except duckdb.Error as exc:
        raise QueryError(_explained(exc)) from None
    finally:
        con.close()


def _reads(sql: str) -> list:
    """The parsed statements, if every one of them only reads; QueryError otherwise."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(_first_line(exc)) from None
    if not statements:
        raise QueryError(f"no SQL statement given; {_ASK}")
    for statement in statements:
        kind = _refused(statement)
        if kind:
            raise QueryError(f"the archive is read-only: {kind} statements are refused; {_ASK}")
    return statements


def _refused(statement) -> str | None:
    """What kind of statement this is, if it might change anything; None for a read."""
    text = statement.query.strip()
    if statement.type == duckdb.StatementType.SELECT:
        return None
    if statement.type == duckdb.StatementType.PRAGMA:
        name = re.match(r"pragma\s+(\w+)", text, re.IGNORECASE)
        if name and name.group(1).lower() in _READ_PRAGMAS:
            return None
    if statement.type == duckdb.StatementType.EXPLAIN:
        inner = re.sub(r"^explain\s+(analy[sz]e\s+)?(\([^)]*\)\s*)?", "", text, flags=re.IGNORECASE)
        try:
            explained = duckdb.extract_statements(inner) if inner != text else []
        except duckdb.Error:
            explained = []
        if len(explained) != 1:
            return "EXPLAIN"
        return _refused(explained[0])
    word = text.split(None, 1)[0].upper() if text else ""
    return word if word.isalpha() else statement.type.name


def _explained(exc: duckdb.Error) -> str:
    message = _first_line(exc)
    if isinstance(exc, duckdb.PermissionException):
        return f"the archive is read-only and queries reach no other file: {message}"
    if "read-only mode" in message or "configuration has been locked" in message:
        return f"the archive is read-only: {message}"
    return message


def _first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
