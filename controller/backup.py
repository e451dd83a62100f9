"""Backups of a run's archive: a whole copy now and then, to resume from if the archive is damaged.

A disk error, or a copy of the run directory that did not finish, leaves an archive that DuckDB
cannot read, and no resume can start from it (`controller.cli` says so in one line). Every
`controller.backup_every_s` the driver folds the archive's log into its file and copies the
file to `archive.backup.duckdb` beside it, between two commits, so the copy holds exactly what
was committed (`store.duckdb_archive.DuckDBArchive.backup`: copied by a child process under a
temporary name, read whole, flushed to disk, then renamed, so the backup is a whole archive
whenever the driver is killed, and a damaged archive never replaces the last good backup).
`atoll resume DIR --from-backup` puts the backup in the archive's place, keeps the file it
replaces, and the run goes on from the backup's last commit.

A backup beside the archive is lost with its machine. With `controller.backup_dir` (a folder
on another disk or machine, e.g. a network mount) each backup is also copied there as
RUN_ID.duckdb, the same way, so a run outlives the loss of its machine: on another one,
`atoll resume NEWDIR --from-backup BACKUP_DIR/RUN_ID.duckdb`. A file of that name that holds
another run is never overwritten. That copy is made in a thread of its own while the search goes
on: a slow or hung network mount delays the copy, never the run.
"""
from __future__ import annotations

import errno
import hashlib
import os
import queue
import re
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import duckdb

from controller.cli import UserError
from controller.rundir import (
    ARCHIVE,
    BACKUP,
    check_can_make,
    file_held,
    in_use,
    remove_abandoned,
)
from store.duckdb_archive import ArchiveDamaged, DuckDBArchive, copy_whole, flush_dir
from store.readonly import first_line, log_of

SEARCH_COUNT = "SELECT count(*) FROM evaluations WHERE split = 'search'"


class Backups:
    """When the loop backs the archive up, and the backing up itself."""

    def __init__(self, every_s: float, archive, run_dir, notices: list, now: float, away: Away | None = None,
                 since: float | None = None):
        self.every_s, self.archive, self.path, self.notices = every_s, archive, Path(run_dir) / BACKUP, notices
        # due every_s after the last backup (its file's time), else after `since` (when the run's first session
        # began, wall clock): across resumes, so a run whose every session is shorter than every_s (a preemptible
        # machine, a driver killed again and again) is backed up too
        last = self.path.stat().st_mtime if self.path.exists() else since
        wait = every_s if last is None else min(every_s, max(0.0, every_s - (time.time() - last)))
        self.next_at = now + wait if every_s else None
        self.failed = False
        self.away = away
        # a copy a killed driver left unfinished (this driver holds the archive: no other is making one)
        self.path.with_name(self.path.name + ".tmp").unlink(missing_ok=True)

    def due(self, now: float) -> bool:
        return self.next_at is not None and now >= self.next_at

    def make(self, evaluations: int) -> tuple[str, dict]:
        """Back the archive up now; the event to archive. A backup that fails (a full disk) is said
        once on stderr, and the run goes on: its own commits come first, and the last backup stays."""
        began = time.monotonic()
        self.next_at = began + self.every_s
        try:
            self._room()
            size = self.archive.backup(self.path)
        except (OSError, duckdb.Error) as exc:  # a week-long run is not ended by its backup
            why = _why(exc)
            return self._failed(why, f"the archive's backup could not be written ({self.path}: {why}); the run "
                                     "goes on, and the last backup stays")
        except ArchiveDamaged as exc:  # the archive's own file: the last backup is its last whole copy
            last = f"the last backup ({self.path}, of {when(self.path)})" if self.path.exists() else "no backup"
            return self._failed(str(exc), f"the archive reads as damaged ({exc}); {last} is kept as it was. "
                                          "The run goes on; to go back to that backup, stop it and resume with "
                                          "--from-backup")
        if self.failed:
            self.failed = False
            self.notices.append(f"atoll: the archive's backup is written again ({self.path})")
        data = {"bytes": size, "seconds": round(time.monotonic() - began, 3), "search_evaluations": evaluations}
        if self.away is not None:
            data.update(self.away.begin(self.path, self.every_s, evaluations, self.notices))
        return "archive-backed-up", data

    def copied(self) -> list:
        """The events of the copies in controller.backup_dir that finished since the last call."""
        return self.away.finished(self.notices) if self.away is not None else []

    def close(self) -> list:
        """At the run's end: wait a little for a copy still being made; the events of those that finished."""
        return self.away.close(self.notices) if self.away is not None else []

    def _failed(self, why: str, notice: str) -> tuple[str, dict]:
        if not self.failed:  # said once until a backup works again
            self.failed = True
            self.notices.append(f"atoll: {notice}; tries again every {self.every_s:g} s (controller.backup_every_s)")
        return "backup-failed", {"error": why}

    def _room(self) -> None:
        """Refuse a copy the disk has no room for before it is begun: filling the disk, even for the
        moment until the copy fails, could fail the archive's own next commit, or another run's."""
        source = self.archive.path
        wal = log_of(source)
        need = source.stat().st_size + (wal.stat().st_size if wal.exists() else 0) + ROOM_LEFT
        free = shutil.disk_usage(self.path.parent).free
        if free < need:
            raise OSError(errno.ENOSPC, f"{_mib(free)} free, and a copy needs about {_mib(need)} "
                                        f"({_mib(ROOM_LEFT)} of it left free for the run's own commits)")


class ResumedElsewhere(OSError):
    """The copy holds a later session of this run, started by another driver from that copy."""


class Away:
    """The copy of each backup in `controller.backup_dir`, as RUN_ID.duckdb: what survives the run's machine.

    The run is told by its id and start time (`runs.started_at`), so a file of that name that
    holds another run (another `try-231500` on another day) is left as it is, and said once. A
    copy whose last session (`started` event) began after this driver's, in another process, was
    written by a driver that resumed the run from it (`--from-backup FILE`) while this one still
    ran, e.g. after this machine was only unreachable: this driver writes it no more, and says so.

    Each copy is made in a thread of its own (`begin`), one at a time, while the loop goes on: a
    network mount that is slow, or hangs (a hard NFS mount whose server is gone), holds up the copy
    and not the search. A backup made while the last copy is still being made is not copied, and a
    copy still being made a whole backup interval after it began is said once. The loop archives each finished copy as a `backup-copied` event (`finished`).
    """

    EXIT_WAIT_S = 10.0  # how long the run's end waits for a copy still being made
    WHAT, EVERY, KIND = "the backup's copy", "controller.backup_every_s", "backup-copied"  # (LibraryAway's own)

    def __init__(self, folder: str, run_id: str, started_at, session: tuple[str, int] = ("", 0),
                 since: float = 0.0):
        self._start(away_path(folder, run_id))
        self.run_id, self.started_at = run_id, started_at
        self.session, self.since = session, since  # this driver's (host, pid), and when its session began

    def _start(self, target: Path) -> None:
        self.target = target
        self.failed = False
        self.elsewhere = False
        self._thread: threading.Thread | None = None
        self._begun = 0.0  # when the copy being made began (wall clock)
        self._stall_said = False
        self._done: queue.SimpleQueue = queue.SimpleQueue()  # (event data, notices) of each finished copy

    def begin(self, backup: Path, every_s: float, evaluations: int, notices: list) -> dict:
        """Start copying the fresh backup `backup` in a thread; what the backup's event adds ({} when begun)."""
        if self._thread is not None and self._thread.is_alive():
            since = f"still being made (begun at {stamp(self._begun)})"
            if not self._stall_said and time.time() - self._begun >= every_s:  # said once until that copy ends
                self._stall_said = True
                notices.append(f"atoll: {self.WHAT} in controller.backup_dir ({self.target}), begun at "
                               f"{stamp(self._begun)}, has not finished (a slow or hung mount?); the run goes on, "
                               "no other copy is begun until it ends, and the last whole copy there stays")
            return {"away_error": since}
        self._begun = time.time()
        self._thread = threading.Thread(target=self._make, args=(backup, every_s, evaluations),
                                        name="atoll-backup-copy", daemon=True)  # a hung mount never holds the exit
        self._thread.start()
        return {}

    def _make(self, backup: Path, every_s: float, evaluations: int) -> None:
        said: list[str] = []
        data = self.copy(backup, every_s, said)
        self._done.put(({**data, "search_evaluations": evaluations}, said, time.time()))

    def finished(self, notices: list) -> list:
        """(The loop's thread.) The `backup-copied` events of the copies that ended since the last call; their notices to `notices`."""
        events = []
        while True:
            try:
                data, said, ended = self._done.get_nowait()
            except queue.Empty:
                return events
            if self._stall_said:  # (this thread alone reads and sets it)
                self._stall_said = False
                notices.append(f"atoll: {self.WHAT} in controller.backup_dir begun at {stamp(self._begun)} "
                               f"ended after {ended - self._begun:.0f} s; the next backup is copied as before")
            notices.extend(said)
            events.append((self.KIND, data))

    def close(self, notices: list, wait_s: float | None = None) -> list:
        """Wait up to `wait_s` (EXIT_WAIT_S) for a copy still being made; the events of those that ended.
        One left unfinished keeps only its temporary file in the folder; the last whole copy stays."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            wait_s = self.EXIT_WAIT_S if wait_s is None else wait_s
            try:
                thread.join(min(1.0, wait_s))  # most copies take well under a second: nothing to say
                if thread.is_alive():
                    print(f"atoll: waiting up to {wait_s:g} s for {self.WHAT} in controller.backup_dir "
                          f"({self.target}) to end", file=sys.stderr, flush=True)
                    thread.join(max(0.0, wait_s - 1.0))
            except KeyboardInterrupt:
                pass
            if thread.is_alive():
                print(f"atoll: {self.WHAT} in controller.backup_dir begun at {stamp(self._begun)} is left "
                      f"unfinished (a slow or hung mount?); the last whole copy there ({self.target}) stays",
                      file=sys.stderr, flush=True)
                return [(self.KIND, {"away_error": f"left unfinished at the run's end (begun at "
                                                         f"{stamp(self._begun)})"})]
        return self.finished(notices)

    def copy(self, backup: Path, every_s: float, notices: list) -> dict:
        """Copy the fresh backup `backup` to the target; what the backup's event adds."""
        if self.elsewhere:
            return {"away_error": "the run was resumed elsewhere from this copy"}
        began = time.monotonic()
        try:
            if not self._check_target(backup):
                return {"away": str(self.target), "away_seconds": 0.0}  # it holds this backup already
            size = backup.stat().st_size
            free = shutil.disk_usage(self.target.parent).free
            if free < size:
                raise OSError(errno.ENOSPC, f"{_mib(free)} free, and the copy needs {_mib(size)}")
            copy_whole(backup, self.target)
        except ResumedElsewhere as exc:
            self.elsewhere = True
            notices.append(f"atoll: {exc.strerror}; this driver no longer writes {self.target}. Two drivers now "
                           "search this run apart: stop this one (atoll stop on its run directory); what it finds "
                           "from now on stays in its own archive only")
            return {"away_error": exc.strerror}
        except (OSError, duckdb.Error, ArchiveDamaged) as exc:  # the run goes on; the last copy stays
            why = _why(exc)
            if not self.failed:  # said once until a copy works again
                self.failed = True
                notices.append(f"atoll: {self.WHAT} in controller.backup_dir could not be written "
                               f"({self.target}: {why}); the run goes on, and the last copy there stays; tries "
                               f"again every {every_s:g} s ({self.EVERY})")
            return {"away_error": why}
        if self.failed:
            self.failed = False
            notices.append(f"atoll: {self.WHAT} in controller.backup_dir is written again ({self.target})")
        return {"away": str(self.target), "away_seconds": round(time.monotonic() - began, 3)}

    def _check_target(self, source: Path) -> bool:
        """Whether to copy `source`; OSError where the target is there and holds another run (or no archive)."""
        if not self.target.exists():
            return True
        try:
            con = duckdb.connect(str(self.target), read_only=True)
            try:
                runs = con.execute("SELECT run_id, started_at FROM runs").fetchall()
                last = con.execute("SELECT ts, data->>'host', data->>'pid' FROM events WHERE run_id = ? AND "
                                   "kind = 'started' ORDER BY ts DESC LIMIT 1", [self.run_id]).fetchall()
            finally:
                con.close()
        except duckdb.Error as exc:
            raise OSError(errno.EEXIST, "the file there is not this run's archive, and is left as it is "
                                        f"({first_line(exc)[:200]})") from None
        if (self.run_id, self.started_at) not in runs:
            raise OSError(errno.EEXIST, "the file there holds another run's archive, and is left as it is")
        if last and last[0][0] > self.since and (last[0][1], str(last[0][2])) != (self.session[0], str(self.session[1])):
            raise ResumedElsewhere(errno.EEXIST, f"this run was resumed from its copy in controller.backup_dir on "
                                                 f"{last[0][1]} (pid {last[0][2]}) at {stamp(last[0][0])}, after this "
                                                 "driver began")
        return True


class LibraryAway(Away):
    """The copy of the library's backup in `controller.backup_dir`, as library-HOST-KEY.duckdb (KEY from
    the library's path): memory across runs that survives the machine, as the run's own copy does.

    A library only grows (runs, elites, skills; a retired skill stays), so a copy there that knows a
    run this library does not is another library's (a new machine of the same name, say) and is
    left as it is, and said once. A copy at least as new as the backup is not made again.
    """

    WHAT, EVERY, KIND = "the library's copy", "memory.backup_every_s", "library-copied"

    def __init__(self, folder: str, library: Path):
        self._start(library_away_path(folder, library))

    def _check_target(self, source: Path) -> bool:
        if not self.target.exists():
            return True
        try:
            theirs, ours = _runs_of(self.target), _runs_of(source)
        except duckdb.Error as exc:
            raise OSError(errno.EEXIST, "the file there is not a library's copy, and is left as it is "
                                        f"({first_line(exc)[:200]})") from None
        if theirs - ours:
            raise OSError(errno.EEXIST, f"the file there holds another library (it knows {len(theirs - ours)} runs "
                                        "this one does not), and is left as it is")
        return self.target.stat().st_mtime < source.stat().st_mtime  # else that backup is there already


def _runs_of(library: Path) -> set[str]:
    con = duckdb.connect(str(library), read_only=True)
    try:
        return {run_id for (run_id,) in con.execute("SELECT run_id FROM runs").fetchall()}
    finally:
        con.close()


def library_away_path(folder: str, library: Path) -> Path:
    """Where a library's backups are copied in `controller.backup_dir`: named for this host and the
    library's path, so the libraries of several machines (or users) sharing the folder keep apart."""
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", socket.gethostname())[:40] or "host"
    key = hashlib.sha256(str(Path(library).expanduser().resolve()).encode()).hexdigest()[:8]
    return Path(folder).expanduser() / f"library-{host}-{key}.duckdb"


def library_copy_for(folder: Path, run_id: str) -> Path | None:
    """The newest library copy in `folder` (a controller.backup_dir) that knows the run `run_id`, if any."""
    found = []
    for path in folder.glob("library-*.duckdb"):
        try:
            if run_id in _runs_of(path):
                found.append((path.stat().st_mtime, path))
        except (duckdb.Error, OSError):  # another file, or one being replaced: not this run's library
            continue
    return max(found)[1] if found else None


def away_path(folder: str, run_id: str) -> Path:
    """Where the run's backups are copied in `controller.backup_dir`."""
    return Path(folder).expanduser() / f"{run_id}.duckdb"


def check_backup_dir(folder: str) -> None:
    """A `controller.backup_dir` refused before a run starts or resumes: one line naming the key."""
    if not folder:
        return
    path = Path(folder).expanduser()
    fix = "; give another with --set controller.backup_dir=PATH (or '' for none)"
    if not path.is_absolute():
        raise UserError(f"controller.backup_dir: {folder} is relative; give an absolute path (or one under ~), "
                        "the same from wherever a run or resume starts")
    if not path.is_dir():
        raise UserError(f"controller.backup_dir: {path} is not a folder here (it is not made for you: an unmounted "
                        f"network disk would leave the copies on this machine){fix}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"controller.backup_dir: {path} is not writable by this user{fix}")


ROOM_LEFT = 64 * 2**20  # what a backup leaves free on the run directory's disk


def _why(exc: Exception) -> str:
    """A failed copy's reason in one line: the OS's words for an OSError, else the error's first line."""
    return getattr(exc, "strerror", None) or first_line(exc)


def _mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"


def when(path: Path) -> str:
    return stamp(path.stat().st_mtime)


def stamp(ts: float) -> str:
    """A moment as the backup lines show it, in local time."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def offer(run_dir) -> str:
    """What a message about a damaged archive adds when the run directory holds a backup ('' if none)."""
    if not run_dir:
        return ""
    backup = Path(run_dir) / BACKUP
    if not backup.is_file():
        return ""
    return (f". Its backup of {when(backup)} can be resumed from, keeping the damaged file: "
            f"atoll resume {run_dir} --from-backup")


def _run_of(archive: Path, run_dir: Path) -> str | None:
    """The run an archive holds, or None when it does not read (damaged: what a restore is for); one a
    live driver holds is refused (its lock comes before any read of the file, damaged or not)."""
    from store.readonly import is_lock_error

    try:
        with DuckDBArchive(archive, read_only=True) as held:
            return held.latest_run_id()
    except Exception as exc:  # noqa: BLE001  any other failure to read it leaves the restore to go ahead
        if is_lock_error(exc):
            raise in_use(run_dir, str(exc)) from None
        return None


def restore(run_dir: Path, source: Path | None = None) -> str:
    """Put the run directory's backup (or the backup file `source`, e.g. a copy in
    `controller.backup_dir` after the run's machine was lost) in its archive's place, keeping the
    archive it replaces under a name of its own; the line that says what was done. Nothing is
    moved unless the backup reads whole and no live driver holds the archive. A `source` may go
    to a run directory that is not there yet: it is made."""
    backup, archive = source or run_dir / BACKUP, run_dir / ARCHIVE
    made = False  # the run directory, made here: removed again when nothing is restored into it
    if source is not None:
        if not source.is_file():
            raise UserError(f"--from-backup {source}: no such file")
        if file_held(source):  # a live run's archive: its file and log change as they are copied
            raise UserError(f"--from-backup {source}: a live process holds it (a run's driver, or atoll report); "
                            "stop it first, or give that run's backup (archive.backup.duckdb)")
        if not run_dir.is_dir():
            check_can_make(run_dir)
            run_dir.mkdir(parents=True)
            made = True
    elif not backup.is_file():
        raise UserError(f"{run_dir} holds no backup ({BACKUP}): a run makes one every controller.backup_every_s "
                        "(1800 s by default) once it has run that long; a backup kept elsewhere (its copy in "
                        "controller.backup_dir) is given as --from-backup FILE")
    current = _run_of(archive, run_dir) if archive.exists() else None  # the run the archive holds, where it reads
    remove_abandoned(run_dir, "restoring")  # what a restore killed mid-way was staging
    staged = run_dir / f".{ARCHIVE}.{os.getpid()}.restoring"
    kept = None
    try:
        try:  # the copy read whole (every block checked) before anything is moved
            copy_whole(backup, staged, with_log=True)  # a copied run's archive.duckdb: its log's commits too
            with DuckDBArchive(staged, read_only=True) as copy:
                done = copy.con.execute(SEARCH_COUNT).fetchone()[0]
                asked = copy.con.execute("SELECT count(*) FROM llm_calls").fetchone()[0]
                backed = copy.latest_run_id()
        except (ArchiveDamaged, duckdb.Error) as exc:
            either = "" if source is not None else " either"
            if made:
                staged.unlink(missing_ok=True)
                run_dir.rmdir()
            why = first_line(exc)  # naming the file the user gave, not the copy read
            for copied in (f"{staged}.tmp", str(staged)):
                why = why.replace(copied, str(backup))
            raise UserError(f"{backup} cannot be read{either}: {why}; nothing was changed") from None
        if current is not None and backed != current:  # a readable run is never swapped for another one
            raise UserError(f"--from-backup {backup}: it holds run {backed}, and {run_dir} holds run {current}, whose "
                            f"archive reads; nothing was changed. To continue {backed}, resume into a new folder: "
                            f"atoll resume NEWDIR --from-backup {backup}")
        if archive.exists():
            kept = run_dir / f"archive.replaced-{time.strftime('%Y%m%d-%H%M%S')}.duckdb"
        _swap(archive, staged, kept)
    finally:
        staged.unlink(missing_ok=True)
    flush_dir(run_dir)
    after = ", and LLM calls made after it are not counted in the budget" if asked else ""  # a run that asks models
    which = f"the backup {source}" if source is not None else "its backup"
    return (f"atoll: the archive is now {which} of {when(backup)} ({done} search evaluations committed then; what "
            f"was committed after it is not in it{after})" + (f"; the archive it replaced is kept as {kept}" if kept else ""))


def _swap(archive: Path, staged: Path, kept: Path | None) -> None:
    """Put `staged` in `archive`'s place, the archive there first kept as `kept` with its log, such that
    the run directory holds an archive at every moment: the kept name is a second link to the file, and
    the backup takes the archive's name in one rename. Ctrl-C and a stop signal wait until it is done; a
    kill between the rename and the removal of the replaced file's log leaves a log DuckDB refuses as
    another file's (a damaged archive, which the same restore mends), never one replayed onto the
    backup. Where the file system makes no links, the archive is renamed aside first."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        wal = log_of(archive)
        if kept is not None:
            kept_wal = log_of(kept)
            try:
                os.link(archive, kept)
                if wal.exists():
                    os.link(wal, kept_wal)
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                    raise
                os.replace(archive, kept)
                if wal.exists():
                    os.replace(wal, kept_wal)
        os.replace(staged, archive)
        wal.unlink(missing_ok=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
