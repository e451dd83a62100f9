"""The rules of a read-only query, shared by `atoll query` and the driver's live reads.

A query may only read: its statements are parsed and refused unless every one of
them is a read (SELECT, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN of a read, a few
PRAGMAs). That is the first of three guards; the others are where it runs: a
read-only connection (or read-only transaction) that reaches no other file and
cannot change settings.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import duckdb

_READ_PRAGMAS = frozenset({"table_info", "show", "show_tables", "show_tables_expanded", "show_databases",
                           "database_list", "database_size", "storage_info", "version", "platform", "functions"})
_ASK = "ask with SELECT (or DESCRIBE, SHOW, SUMMARIZE, EXPLAIN, PRAGMA table_info)"


class QueryError(Exception):
    """Bad query or not a run directory: a one-line message for the user."""


def reads(sql: str) -> list:
    """The parsed statements, if every one of them only reads; QueryError otherwise."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise QueryError(first_line(exc)) from None
    if not statements:
        raise QueryError(f"no SQL statement given; {_ASK}")
    for statement in statements:
        kind = _refused(statement)
        if kind:
            raise QueryError(f"the archive is read-only: {kind} statements are refused; {_ASK}")
    return statements


def each_read(sql: str) -> list[str]:
    """The statements of `sql` one by one, each to be answered on its own (`atoll query` prints every
    result, as DuckDB's own shell does); `sql` itself when it is one. QueryError as `reads` raises."""
    statements = reads(sql)
    return [statement.query for statement in statements] if len(statements) > 1 else [sql]


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


def explained(exc: duckdb.Error) -> str:
    message = first_line(exc)
    if isinstance(exc, duckdb.PermissionException):
        return f"the archive is read-only and queries reach no other file: {message}"
    if "read-only mode" in message or "configuration has been locked" in message:
        return f"the archive is read-only: {message}"
    return message


def first_line(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def is_lock_error(exc: BaseException) -> bool:
    """Another process holds the file (or, in this process, another attachment of it)."""
    text = str(exc)
    return isinstance(exc, duckdb.Error) and ("Could not set lock" in text or "Unique file handle conflict" in text)


def is_damage_error(exc: BaseException) -> bool:
    """Whether DuckDB found a file it cannot read as written: a block past its end, or one whose
    checksum does not match, in the database file or in its log (`is_log_damage`)."""
    text = str(exc).strip()
    return type(exc).__module__ in ("duckdb", "_duckdb") and (
        text.startswith("Corrupt database file") or "Could not read enough bytes from file" in text
        or is_log_damage(exc))


def is_log_damage(exc: BaseException) -> bool:
    """Whether DuckDB refused the database's write-ahead log (FILE.wal) as damaged: an entry whose checksum
    does not match. (A log cut short is replayed up to its cut.) The file then does not open at all."""
    return "Corrupt WAL file" in str(exc)


def log_of(path: Path) -> Path:
    """The write-ahead log DuckDB keeps beside the database file `path` (PATH.wal)."""
    return path.with_name(path.name + ".wal")


def log_aside(archive: Path) -> str:
    """How to open an archive whose log is damaged: without the log, as of its last fold into the file."""
    log = log_of(archive)
    return (f"its log {log} (the commits not yet folded into the file) is damaged: to open the archive as of the "
            f"log's last fold, without the commits after it, set the log aside: mv {log} {log}.damaged")


def cut_short(con, path: Path) -> str | None:
    """Why the file at `path`, open on `con`, cannot hold what it records; None when it can.

    DuckDB's file is a header and then blocks of `block_size` bytes, `used_blocks` of them in
    use: a file shorter than those was cut short, and reading a missing block fails at some
    later query, after a resume could have started writing. (Its `total_blocks` can count free
    blocks past the end of a file DuckDB shortened, so it is no bound.) A file cut by less than
    this shows is found by the read that fails.
    """
    row = con.execute("SELECT block_size, used_blocks FROM pragma_database_size() "
                      "WHERE database_name = current_database()").fetchone()
    size = path.stat().st_size if path.exists() else None
    if row is None or size is None or size >= row[0] * row[1]:
        return None
    return (f"Could not read enough bytes from file {str(path)!r}: it is {size:,} bytes, and the {row[1]} blocks "
            f"of {row[0]:,} bytes in use need {row[0] * row[1]:,}; it was cut short")


def owner_of(path: Path) -> str | None:
    """Who owns `path` when that is not this user ("NAME, uid N"; None: this user, or cannot be told)."""
    import pwd

    try:
        uid = path.stat().st_uid
    except OSError:
        return None
    if uid == os.geteuid():
        return None
    try:
        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except KeyError:
        return f"uid {uid}"
