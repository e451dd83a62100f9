"""Read-only SQL over a run's archive, also while the run is live.

When no process holds the archive, the query opens it read-only. While a driver
(or `atoll report`) holds it, DuckDB lets no other process open it, so the query
is sent to that process, which answers from the archive as committed at that
moment (`store/live.py`). Writes are refused three times over either way:
statements are parsed and only reads are run (`store/readonly.py`), the connection
or transaction is read-only, and it cannot reach other files or change settings.
"""
from __future__ import annotations

from pathlib import Path

import duckdb

from store import live
from store.readonly import (
    QueryError,
    cut_short,
    explained,
    first_line,
    is_damage_error,
    is_lock_error,
    is_log_damage,
    log_aside,
    reads,
)

ARCHIVE = "archive.duckdb"
_READ_ONLY = {"enable_external_access": False, "autoinstall_known_extensions": False,
              "autoload_known_extensions": False, "lock_configuration": True}

__all__ = ["QueryError", "is_damaged", "is_live", "run_query"]


DAMAGED_NOTE = "damaged archive: "


def is_damaged(note: str | None) -> bool:
    """Whether `run_query`'s note, or its QueryError, says the archive's file is damaged: cut short
    (`cut_short`), or a block whose checksum does not match (a disk error)."""
    return bool(note) and note.startswith(DAMAGED_NOTE)


def _damaged(why: str, readable: bool = True) -> str:
    return (f"{DAMAGED_NOTE}{why}; {'what lies in its undamaged blocks can be read, ' if readable else ''}a resume "
            "cannot start from it. If the run directory exists elsewhere (the node it ran on, a backup), use that copy")


def is_live(note: str | None) -> bool:
    """Whether `run_query`'s note says a live process holds the archive (and answered)."""
    return bool(note) and note.startswith(live.LIVE_NOTE)


def _archive_of(run_dir: Path) -> Path:
    """The archive a run directory holds, or the archive file given itself (a backup, or its copy in
    `controller.backup_dir`, read where it lies)."""
    if is_archive_file(run_dir):
        return run_dir
    archive = run_dir / ARCHIVE
    if not archive.is_file():
        raise QueryError(f"{run_dir} is not a run directory (no {ARCHIVE} in it)")
    return archive


def is_archive_file(path: Path) -> bool:
    """A file given where a run directory goes: an archive read as it lies (not a run's own archive.duckdb,
    which is read as its run directory's, from its live driver while one holds it)."""
    return path.name != ARCHIVE and path.is_file()


def run_query(run_dir: str | Path, sql: str) -> tuple[list[str], list[tuple], str | None]:
    """Run read-only `sql` (one or more statements) on a run directory's archive, or on an archive file;
    returns the last one's columns and rows, and a note."""
    run_dir = Path(run_dir)
    if run_dir.name == ARCHIVE and run_dir.is_file():  # a run's archive.duckdb: its run directory
        run_dir = run_dir.parent
    archive = _archive_of(run_dir)
    statements = reads(sql)
    try:
        con = duckdb.connect(str(archive), read_only=True, config=_READ_ONLY)
    except duckdb.Error as exc:  # another process's lock, or this process's own writer
        if is_log_damage(exc):
            raise QueryError(f"{DAMAGED_NOTE}{archive} does not open: {first_line(exc)}; {log_aside(archive)}") from None
        if is_damage_error(exc):
            raise QueryError(_damaged(f"{archive} does not open: {first_line(exc)}", readable=False)) from None
        if not is_lock_error(exc) and "same database file" not in str(exc):
            raise QueryError(f"cannot open {archive}: {first_line(exc)}") from None
        if archive == run_dir:  # a file outside any run directory: no driver answers for it
            raise QueryError(f"{archive} is held by another process ({first_line(exc)}); retry once it is done") from None
        return _ask_holder(run_dir, sql, first_line(exc))
    note = None
    try:
        missing = cut_short(con, archive)
        note = _damaged(missing) if missing else None
        for statement in statements:
            cursor = con.execute(statement)
        if cursor.description is None:
            return [], [], note
        return [d[0] for d in cursor.description], cursor.fetchall(), note
    except duckdb.Error as exc:
        if note or is_damage_error(exc):  # a checksum that does not match, met by this query
            raise QueryError(f"{note or _damaged(first_line(exc))} (this query needs a damaged part)") from None
        raise QueryError(explained(exc)) from None
    finally:
        con.close()


def _ask_holder(run_dir: Path, sql: str, lock_error: str):
    try:
        return live.ask_waiting(run_dir, sql)
    except live.NotServed:
        raise QueryError(f"{run_dir} is held by a process that answers no live queries yet ({lock_error}); "
                         "retry in a few seconds") from None
