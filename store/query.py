"""Read-only SQL over a run's archive, also while the run is live.

A live run's driver holds the archive's write lock, so readers fall back to the
snapshot the driver publishes every few seconds and say how old it is. Writes
are refused: the connection is read-only and cannot reach other files.
"""
from __future__ import annotations

import time
from pathlib import Path

import duckdb

ARCHIVE = "archive.duckdb"
SNAPSHOT = "archive.snapshot.duckdb"
_READ_ONLY = {"enable_external_access": False, "autoinstall_known_extensions": False,
              "autoload_known_extensions": False}


class QueryError(Exception):
    """Bad query or not a run directory: a one-line message for the user."""


def _connect(path: Path):
    return duckdb.connect(str(path), read_only=True, config=_READ_ONLY)


def open_read_only(run_dir: str | Path):
    """(connection, note): the archive itself, or the live snapshot with a note."""
    run_dir = Path(run_dir)
    archive = run_dir / ARCHIVE
    if not archive.is_file():
        raise QueryError(f"{run_dir} is not a run directory (no {ARCHIVE} in it)")
    try:
        return _connect(archive), None
    except duckdb.Error as exc:
        if "lock" not in str(exc).lower() and "same database file" not in str(exc):
            raise QueryError(f"cannot open {archive}: {str(exc).splitlines()[0]}") from None
    snapshot = run_dir / SNAPSHOT
    for _ in range(20):  # the driver replaces the snapshot atomically; retry a race with its first copy
        try:
            age = time.time() - snapshot.stat().st_mtime
            return _connect(snapshot), f"live run: answered from its snapshot, {age:.1f} s old"
        except (FileNotFoundError, duckdb.Error):
            time.sleep(0.25)
    raise QueryError(f"{run_dir} is in use by a live run that has not published a snapshot yet; retry in a few seconds")


def run_query(run_dir: str | Path, sql: str) -> tuple[list[str], list[tuple], str | None]:
    con, note = open_read_only(run_dir)
    try:
        cursor = con.execute(sql)
        if cursor.description is None:
            return [], [], note
        columns = [d[0] for d in cursor.description]
        return columns, cursor.fetchall(), note
    except duckdb.Error as exc:
        message = str(exc).splitlines()[0]
        if "read-only" in message.lower() or "read only" in message.lower() or "external access" in message.lower():
            raise QueryError(f"the archive is read-only here; {message}") from None
        raise QueryError(message) from None
    finally:
        con.close()
