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
"""
from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

import duckdb

from controller.cli import UserError
from controller.rundir import ARCHIVE, BACKUP, in_use
from store.duckdb_archive import ArchiveDamaged, DuckDBArchive, copy_whole, flush_dir

SEARCH_COUNT = "SELECT count(*) FROM evaluations WHERE split = 'search'"


class Backups:
    """When the loop backs the archive up, and the backing up itself."""

    def __init__(self, every_s: float, archive, run_dir, notices: list, now: float):
        self.every_s, self.archive, self.path, self.notices = every_s, archive, Path(run_dir) / BACKUP, notices
        self.next_at = now + every_s if every_s else None
        self.failed = False
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
            why = getattr(exc, "strerror", None) or str(exc).strip().splitlines()[0]
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
        return "archive-backed-up", {"bytes": size, "seconds": round(time.monotonic() - began, 3),
                                     "search_evaluations": evaluations}

    def _failed(self, why: str, notice: str) -> tuple[str, dict]:
        if not self.failed:  # said once until a backup works again
            self.failed = True
            self.notices.append(f"atoll: {notice}; tries again every {self.every_s:g} s (controller.backup_every_s)")
        return "backup-failed", {"error": why}

    def _room(self) -> None:
        """Refuse a copy the disk has no room for before it is begun: filling the disk, even for the
        moment until the copy fails, could fail the archive's own next commit, or another run's."""
        source = self.archive.path
        wal = source.with_name(source.name + ".wal")
        need = source.stat().st_size + (wal.stat().st_size if wal.exists() else 0) + ROOM_LEFT
        free = shutil.disk_usage(self.path.parent).free
        if free < need:
            raise OSError(errno.ENOSPC, f"{_mib(free)} free, and a copy needs about {_mib(need)} "
                                        f"({_mib(ROOM_LEFT)} of it left free for the run's own commits)")


ROOM_LEFT = 64 * 2**20  # what a backup leaves free on the run directory's disk


def _mib(size: int) -> str:
    return f"{size / 2**20:,.0f} MiB"


def when(path: Path) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime))


def offer(run_dir) -> str:
    """What a message about a damaged archive adds when the run directory holds a backup ('' if none)."""
    if not run_dir:
        return ""
    backup = Path(run_dir) / BACKUP
    if not backup.is_file():
        return ""
    return (f". Its backup of {when(backup)} can be resumed from, keeping the damaged file: "
            f"atoll resume {run_dir} --from-backup")


def restore(run_dir: Path) -> str:
    """Put the run directory's backup in its archive's place, keeping the archive it replaces
    under a name of its own; the line that says what was done. Nothing is moved unless the
    backup reads whole and no live driver holds the archive."""
    from store.readonly import first_line, is_lock_error

    backup, archive = run_dir / BACKUP, run_dir / ARCHIVE
    if not backup.is_file():
        raise UserError(f"{run_dir} holds no backup ({BACKUP}): a run makes one every controller.backup_every_s "
                        "(1800 s by default) once it has run that long")
    if archive.exists():
        try:  # a live driver's lock comes before any read of the file, damaged or not
            duckdb.connect(str(archive), read_only=True).close()
        except Exception as exc:  # noqa: BLE001  only the lock matters here: the archive may well be damaged
            if is_lock_error(exc):
                raise in_use(run_dir, str(exc)) from None
    staged = run_dir / f".{ARCHIVE}.{os.getpid()}.restoring"
    kept = None
    try:
        try:  # the copy read whole (every block checked) before anything is moved
            copy_whole(backup, staged)
            with DuckDBArchive(staged, read_only=True) as copy:
                done = copy.con.execute(SEARCH_COUNT).fetchone()[0]
                asked = copy.con.execute("SELECT count(*) FROM llm_calls").fetchone()[0]
        except (ArchiveDamaged, duckdb.Error) as exc:
            raise UserError(f"{backup} cannot be read either: {first_line(exc)}; nothing was changed") from None
        if archive.exists():
            kept = run_dir / f"archive.replaced-{time.strftime('%Y%m%d-%H%M%S')}.duckdb"
            os.replace(archive, kept)
            wal = archive.with_name(archive.name + ".wal")
            if wal.exists():
                os.replace(wal, kept.with_name(kept.name + ".wal"))
        os.replace(staged, archive)
    finally:
        staged.unlink(missing_ok=True)
    flush_dir(run_dir)
    after = ", and LLM calls made after it are not counted in the budget" if asked else ""  # a run that asks models
    return (f"atoll: the archive is now its backup of {when(backup)} ({done} search evaluations committed then; what "
            f"was committed after it is not in it{after})" + (f"; the archive it replaced is kept as {kept}" if kept else ""))
