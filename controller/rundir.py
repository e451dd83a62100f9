"""Run directories: one driver at a time, and an archive that always holds its run.

DuckDB lets one process hold a file for writing and refuses every other open,
read-only ones included, so a second driver (`atoll resume` or `atoll report` on a
live run) fails before it reads or writes anything; `open_archive` turns that
refusal into one line naming the live driver. A new run's archive is built under a
temporary name and linked into place with its run row, so `archive.duckdb` exists
only once it holds a run, whenever the driver is killed.
"""
from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path

from controller.cli import UserError

ARCHIVE = "archive.duckdb"
BACKUP = "archive.backup.duckdb"  # controller.backup
STOPPED = "stopped without ending (no driver holds it)"  # what `atoll status` and `atoll runs` show for a
# run whose stored status is still `running` (its driver was killed, or its machine lost)


def open_archive(run_dir: Path, read_only: bool = False, patience_s: float = 3.0):
    """The run directory's archive; a live driver's lock is refused with one line, before anything is written.

    A reader (`atoll status`, `atoll query`) holds a stopped run's archive for a moment; the
    open waits out such a lock for `patience_s`, a live driver's lock is there for good.
    """
    from store.duckdb_archive import ArchiveNewer, DuckDBArchive
    from store.readonly import is_lock_error

    if not (run_dir / ARCHIVE).is_file():
        if run_dir.name == ARCHIVE and run_dir.is_file():
            raise UserError(f"{run_dir} is a run's archive: give its run directory, {run_dir.parent}")
        if run_dir.is_file():  # a backup or its copy: status, query and best read it where it lies
            raise UserError(f"{run_dir} is an archive file, not a run directory: to continue its run from it, "
                            f"atoll resume NEWDIR --from-backup {run_dir}")
        raise UserError(f"{run_dir} is not a run directory (no {ARCHIVE} in it){backup_left(run_dir)}")
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return DuckDBArchive(run_dir / ARCHIVE, read_only=read_only)
        except ArchiveNewer as exc:
            raise UserError(str(exc)) from None
        except Exception as exc:  # duckdb's lock error names the holder's pid; nothing was written
            error = str(exc).lower()
            if "permission denied" in error or (not read_only and "read-only file system" in error):
                raise not_yours(run_dir, read_only, str(exc)) from None
            if not is_lock_error(exc):
                raise
            if time.monotonic() > deadline:
                raise in_use(run_dir, str(exc)) from None
        time.sleep(0.1)


def driver_holds(run_dir: Path) -> bool | None:
    """Whether a live process holds the run's archive for writing (its driver, or `atoll report`);
    None when this cannot be told here (no archive, or one this user cannot read)."""
    return file_held(run_dir / ARCHIVE)


def file_held(path: Path) -> bool | None:
    """Whether a live process holds the DuckDB file `path` for writing; None when this cannot be told
    here (no file, or one this user cannot read).

    DuckDB locks the whole file while a writer has it open, and the kernel drops that lock when
    the process dies, kill -9 included. This asks by taking a shared lock for an instant, as any
    reader of the archive does (a driver that opens it meanwhile waits that out, see `open_archive`).
    """
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        return True if exc.errno in (errno.EACCES, errno.EAGAIN) else None
    finally:
        os.close(fd)  # and with it the lock taken
    return False


def backup_left(run_dir: Path) -> str:
    """What a message about a missing archive adds when the run directory still holds its backup."""
    if not (run_dir / BACKUP).is_file():
        return ""
    return f", but its backup is there ({BACKUP}): atoll resume {run_dir} --from-backup"


def not_yours(run_dir: Path, read_only: bool, error: str = "") -> UserError:
    """The refusal of an archive this user may not open (another user's run, a read-only copy)."""
    if read_only:
        return UserError(f"{run_dir / ARCHIVE}: permission denied (this command needs to read it); run it as "
                         "the run's owner, or copy the run directory to a folder of your own and give that")
    return NotWritable(run_dir, error)


class NotWritable(UserError):
    """This user may not write the run directory's archive (a read-only copy, or another user's run)."""

    def __init__(self, run_dir: Path, error: str, why: str = "this command needs to write it"):
        self.run_dir, self.error = run_dir, error
        archive, copy = run_dir / ARCHIVE, "copy the run directory to a folder of your own and give that"
        if "read-only file system" in error.lower():
            super().__init__(f"{archive}: read-only file system ({why}); {copy}")
            return
        from store.readonly import owner_of

        owner = owner_of(archive)
        fix = f"make it writable (chmod -R u+w {run_dir})" if owner is None else f"run it as the run's owner ({owner})"
        super().__init__(f"{archive}: permission denied ({why}): the run directory is not writable by this "
                         f"user; {fix}, or {copy}")

    def because(self, why: str) -> NotWritable:
        """The same refusal, saying why the command needs to write."""
        return NotWritable(self.run_dir, self.error, why)


def in_use(run_dir: Path, error: str) -> UserError:
    """The refusal of a second driver, naming the live one from DuckDB's lock error."""
    found = re.search(r"PID (\d+)", error)
    pid = found.group(1) if found else "its pid"
    return UserError(f"{run_dir} is in use by a live run (driver pid {pid}); one driver at a time: wait for it "
                     f"to end, or stop it (Ctrl-C, or kill {pid}), then retry")


def check_free(run_dir: Path) -> None:
    """Refuse a directory that already holds a run (before anything starts)."""
    if (run_dir / ARCHIVE).exists():
        raise _holds_a_run(run_dir)


def _holds_a_run(run_dir: Path) -> UserError:
    """The refusal of a run directory that holds a run: the way on is a resume, submitted again as a
    Ray job where this driver is one (`atoll resume` there would run on the job's node, not the cluster)."""
    from controller.submit import resume_command

    return UserError(f"{run_dir} already holds a run; continue it with: {resume_command(run_dir)}")


def claim(name: str, given: str | None, root: Path = Path("runs")) -> Path:
    """The given directory, or a new one under `root` that no other run claimed (two may start in one second)."""
    if given:
        run_dir = Path(given)
        _make(run_dir, exist_ok=True)
        return run_dir
    base = root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    for n in range(1, 1000):
        run_dir = base.with_name(base.name + (f"-{n}" if n > 1 else ""))
        try:
            _make(run_dir, exist_ok=False)
            return run_dir
        except FileExistsError:
            continue
    raise UserError(f"{base}: too many runs of that name started this second; give one with --run-dir")


def check_can_make(run_dir: Path) -> None:
    """Refuse, before Ray or anything else starts, a run directory this user could not make or write."""
    there = run_dir
    while not there.exists() and there.parent != there:
        there = there.parent
    if there.exists() and not there.is_dir():
        raise UserError(f"--run-dir {run_dir}: {there} is a file, not a folder; give another path")
    if not os.access(there, os.W_OK | os.X_OK):
        raise _cannot(run_dir, "Permission denied")


def _cannot(run_dir: Path, why: str) -> UserError:
    return UserError(f"cannot create the run directory {run_dir}: {why}; give --run-dir a folder you can "
                     "write (a run writes its archive there)")


def _make(run_dir: Path, exist_ok: bool) -> None:
    """mkdir -p, or one line for the user when the folder cannot be made there (FileExistsError passes)."""
    try:
        run_dir.mkdir(parents=True, exist_ok=exist_ok)
    except FileExistsError:
        if not exist_ok or not run_dir.is_file():
            raise
        raise UserError(f"--run-dir {run_dir}: a file is there, not a folder; give another path") from None
    except OSError as exc:
        raise _cannot(run_dir, exc.strerror or type(exc).__name__) from None


def create_archive(run_dir: Path, run_id: str, config: dict, text: str, setup=None):
    """The archive with its run row (and whatever `setup(archive)` adds to it: the run's secrets,
    its protections), built under a temporary name and linked into place: a run directory's
    archive.duckdb always holds a whole run, whenever the driver is killed."""
    from store.duckdb_archive import DuckDBArchive

    remove_abandoned(run_dir)
    tmp = run_dir / f".{ARCHIVE}.{os.getpid()}.creating"
    try:
        with DuckDBArchive(tmp) as archive:
            archive.create_run(run_id, config, text)
            if setup is not None:
                setup(archive)
        os.link(tmp, run_dir / ARCHIVE)  # fails if another driver got there first
    except FileExistsError:
        raise _holds_a_run(run_dir) from None
    finally:
        tmp.unlink(missing_ok=True)
    return open_archive(run_dir)


def remove_abandoned(run_dir: Path, doing: str = "creating") -> None:
    """Copies of the archive that killed processes were still making: `.archive.duckdb.PID.DOING*`
    (a driver creating it, a restore staging its backup) whose PID is gone."""
    for path in run_dir.glob(f".{ARCHIVE}.*.{doing}*"):
        pid = path.name.split(".")[3]
        if pid.isdigit() and not alive(int(pid)):
            path.unlink(missing_ok=True)


def alive(pid: int) -> bool:
    """Whether process `pid` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True
