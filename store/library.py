"""The library: one DuckDB file that every run of a domain reads and adds to.

It holds a catalog of runs, each run's elites, the skills runs learned with their uses,
and prompt variants with their measured success (`store/library_schema/`, versioned
apart from the run archive's schema). Each run's archive stays its own file with one
writer; the library is shared, so nobody holds it open:

- Every operation opens the file, runs one transaction and closes it. DuckDB lets one
  process hold a file at a time, so a file held by another run is retried with jittered
  exponential backoff for up to `busy_timeout_s`, then `LibraryBusy` is raised and the
  caller keeps what it meant to write for its next commit point.
- A missing library is created. A file that is not a readable library, or one of a newer
  schema than this Atoll knows, raises `LibraryError` with one line naming the file and
  the way out; it is never reset or overwritten.

Where it lives: `memory.library` in the config, else the ATOLL_LIBRARY environment
variable, else `library.duckdb` in the user's data directory (platformdirs).
"""
from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Callable, TypeVar

import duckdb
import platformdirs
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from store import signals
from store.duckdb_archive import ArchiveDamaged, copy_whole
from store.readonly import first_line, is_lock_error, log_of

ENV = "ATOLL_LIBRARY"
SCHEMA_DIR = Path(__file__).with_name("library_schema")
T = TypeVar("T")
_DAMAGE_RETRIES = 3
BACKUP_EVERY_S = 3600.0  # runs back the library up when its backup is older than this (memory.backup_every_s)
_FULL = ("No space left on device", "Disk quota exceeded")
_FRESH = "move it aside (or delete it) to start a fresh library, or point ATOLL_LIBRARY elsewhere"
_ELSEWHERE = (f"set memory.library (or {ENV}) to a file in a folder you can write, or memory.enabled = false "
              "to run without the library")


class LibraryError(Exception):
    """The library cannot be used: a one-line message for the user."""


class LibraryBusy(LibraryError):
    """Other processes held the library longer than the busy timeout."""


def default_path(configured: str = "") -> Path:
    """`configured` (memory.library), else $ATOLL_LIBRARY, else the user data directory's file."""
    chosen = configured or os.environ.get(ENV, "")
    if chosen:
        return Path(chosen).expanduser()
    return Path(platformdirs.user_data_dir("atoll", appauthor=False)) / "library.duckdb"


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every library schema file, in order."""
    return [(int(p.name[:3]), p.name, p.read_text()) for p in sorted(SCHEMA_DIR.glob("[0-9][0-9][0-9]_*.sql"))]


def latest_version() -> int:
    return max(version for version, _, _ in migrations())


def _is_damage(exc: BaseException) -> bool:
    text = str(exc).lower()
    return not _no_room(exc) and (isinstance(exc, duckdb.IOException) or "corrupt" in text or "checksum" in text)


def _no_room(exc: BaseException) -> bool:
    """A write the disk (or the user's quota) had no room for: the library is whole, only not updated."""
    return any(text in str(exc) for text in _FULL)


def _rolled_back(con) -> None:
    """Roll back a failed transaction; one whose COMMIT failed is already gone, and that failure is
    the one to report, not ROLLBACK's 'no transaction is active'."""
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass


class Library:
    """The shared library file; see the module docstring for the rules every call keeps."""

    def __init__(self, path: str | Path, busy_timeout_s: float = 60.0):
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s

    def transaction(self, work: Callable[[duckdb.DuckDBPyConnection], T], busy_timeout_s: float | None = None) -> T:
        """Open, migrate if needed, run `work(con)` in one transaction, close; retried while busy
        (for `busy_timeout_s`, default the library's)."""
        return self._retried(lambda: self._once(work), busy_timeout_s)

    @property
    def backup_path(self) -> Path:
        """Where the library's backup goes: beside it, `library.backup.duckdb` for `library.duckdb`."""
        return self.path.with_name(f"{self.path.stem}.backup{self.path.suffix}")

    def back_up(self, older_than_s: float = BACKUP_EVERY_S, busy_timeout_s: float | None = None) -> bool:
        """Copy the library whole to `backup_path` unless a backup younger than `older_than_s` is
        there; True if it copied. The file is held as for a transaction (no other run writes
        meanwhile; waiting `busy_timeout_s` for one that does, default the library's), its log
        folded in, the copy read whole (a damaged library raises LibraryError and never replaces
        the last good backup), flushed and renamed into place."""
        target = self.backup_path
        if target.exists() and time.time() - target.stat().st_mtime < older_than_s:
            return False
        if not self.path.exists():
            return False

        def once() -> bool:
            con = self._connect()
            try:
                if not self._version(con):  # nothing stored yet
                    return False
                con.execute("CHECKPOINT")
                copy_whole(self.path, target)
            finally:
                con.close()
            return True
        try:
            return self._retried(once, busy_timeout_s)
        except ArchiveDamaged as exc:
            raise LibraryError(f"the library {self.path} reads as damaged ({exc}); its backup was not replaced"
                               f"{self._backup_hint()}") from None

    def _backup_hint(self) -> str:
        """How to go back to the backup, when there is one ('' if none)."""
        target = self.backup_path
        if not target.is_file():
            return ""
        made = time.strftime("%Y-%m-%d %H:%M", time.localtime(target.stat().st_mtime))
        here, aside, there = (shlex.quote(str(p)) for p in (self.path, f"{self.path}.damaged", target))
        log = log_of(self.path)  # a write-ahead log the damaged file left: DuckDB would replay it onto the backup
        logs = (f" and its log ({log.name})", f" && mv {shlex.quote(str(log))} {shlex.quote(f'{self.path}.damaged.wal')}"
                ) if log.exists() else ("", "")
        return (f". Its backup of {made} is {target}: to go back to it, move the damaged file{logs[0]} aside and copy "
                f"the backup in its place (mv {here} {aside}{logs[1]} && cp {there} {here})")

    def _retried(self, once: Callable[[], T], busy_timeout_s: float | None = None) -> T:
        """`once()`, retried while another process holds the file (for `busy_timeout_s`, default the
        library's) and a few times on what looks like damage; then one line for the user."""
        patience = self.busy_timeout_s if busy_timeout_s is None else busy_timeout_s
        damage_seen = []

        def worth_retrying(exc: BaseException) -> bool:
            """Another process's lock; or, a few times, what looks like damage: a file read in the
            instant another process's close rewrote it reads as damaged, a damaged one stays so."""
            if _is_damage(exc) and not is_lock_error(exc) and len(damage_seen) < _DAMAGE_RETRIES:
                damage_seen.append(exc)
                return True
            return is_lock_error(exc)
        retrying = Retrying(retry=retry_if_exception(worth_retrying), reraise=True,
                            wait=wait_random_exponential(multiplier=0.05, max=2.0),
                            stop=stop_after_delay(patience))
        try:
            for attempt in retrying:
                with attempt:
                    return once()
        except duckdb.Error as exc:
            if is_lock_error(exc):
                raise LibraryBusy(f"the library {self.path} stayed busy for {patience:g} s: "
                                  f"{first_line(exc)}") from None
            if _no_room(exc):
                raise LibraryError(f"cannot write the library {self.path}: {first_line(exc)}; it is kept as it "
                                   "was: free some space on its disk, or point ATOLL_LIBRARY elsewhere") from None
            if _is_damage(exc):
                raise LibraryError(f"cannot read the library {self.path}: {first_line(exc)}; {_FRESH}"
                                   f"{self._backup_hint()}") from None
            raise

    def ensure(self) -> int:
        """Create or check the library; returns its schema version."""
        return self.transaction(lambda con: self._version(con))

    def read(self, work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """`work(con)` for a command that only reads: the library opened read-only, so one this user may
        only read is read too, and a missing one is not created (`work` sees empty tables). A library of
        an older schema is upgraded first, as a write would."""
        if not self.path.exists():
            return self._blank(work)
        return self._retried(lambda: self._read_once(work))

    def _read_once(self, work):
        con = self._connect(read_only=True)
        try:
            version = self._version(con)
            self._refuse_newer(version)
            if version == latest_version():
                return work(con)
        finally:
            con.close()
        return self._blank(work) if version == 0 else self._once(work)

    def _blank(self, work):
        """`work(con)` over an empty library in memory: nothing is written anywhere."""
        con = duckdb.connect(":memory:")
        try:
            self._migrate(con)
            return work(con)
        finally:
            con.close()

    def _once(self, work):
        con = self._connect()
        try:
            self._migrate(con)
            with signals.held():  # a Ctrl-C waits for the COMMIT (store.signals)
                con.execute("BEGIN")
                try:
                    result = work(con)
                    con.execute("COMMIT")
                except BaseException:
                    _rolled_back(con)
                    raise
            return result
        finally:
            con.close()

    def _connect(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        if self.path.is_dir():
            raise LibraryError(f"the library path {self.path} is a directory; give a file name, e.g. "
                               f"{self.path / 'library.duckdb'}")
        if not read_only:
            self._check_writable()
        try:
            return duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as exc:
            if is_lock_error(exc) or _is_damage(exc):
                raise  # retried, then reported by `transaction`
            raise LibraryError(f"cannot read the library {self.path}: {first_line(exc)}; {_FRESH}"
                               f"{self._backup_hint()}") from None

    def _check_writable(self) -> None:
        """The library's folder made, and the file and its folder (DuckDB writes its log beside it) ones
        this user may write: else one line that says so, not that the library is damaged."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            file = next((p for p in (self.path.parent, *self.path.parent.parents) if p.is_file()), None)
            why = f"{file} is a file, not a folder" if file is not None else exc.strerror  # else 'File exists'
            raise LibraryError(f"cannot create the library's folder {self.path.parent}: {why}; "
                               f"{_ELSEWHERE}") from None
        denied = [str(p) for p in (self.path, self.path.parent) if p.exists() and not os.access(p, os.W_OK)]
        if denied:
            reads = ("; `atoll runs`, `atoll skills` and `atoll query --library` still read it"
                     if self.path.exists() else "")
            raise LibraryError(f"cannot write the library {self.path}: this user may not write {denied[0]}{reads}; "
                               f"{_ELSEWHERE}")

    def _refuse_newer(self, version: int) -> None:
        if version > latest_version():
            raise LibraryError(f"the library {self.path} has schema version {version}, newer than this Atoll "
                               f"knows ({latest_version()}); upgrade Atoll, or point ATOLL_LIBRARY elsewhere")

    def _version(self, con) -> int:
        tables = {name for (name,) in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
        if "library_version" not in tables:
            if tables:
                raise LibraryError(f"{self.path} is a DuckDB file but not an Atoll library (it has tables "
                                   f"{', '.join(sorted(tables)[:4])}); {_FRESH}")
            return 0
        return int(con.execute("SELECT coalesce(max(version), 0) FROM library_version").fetchall()[0][0])

    def _migrate(self, con) -> None:
        """Apply the missing schema files, each in its own transaction; refuse a newer schema."""
        version = self._version(con)
        self._refuse_newer(version)
        for number, name, sql in migrations():
            if number <= version:
                continue
            con.execute("BEGIN")  # no store.signals.held: an upgrade stopped by Ctrl-C is rolled back
            try:
                con.execute("CREATE TABLE IF NOT EXISTS library_version "
                            "(version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
                con.execute(sql)
                con.execute("INSERT INTO library_version VALUES (?, ?, now())", [number, name])
                con.execute("COMMIT")
            except BaseException:
                _rolled_back(con)
                raise
