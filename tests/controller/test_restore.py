"""`atoll resume DIR --from-backup` at the moments a stop can reach it (controller.backup.restore):
the run directory holds an archive at every moment, and what a killed restore left is cleared."""
import os
import signal
import subprocess
import sys
import time

import pytest

from controller import backup
from controller.cli import UserError
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status


def _archive(path, run: str, programs: int) -> None:
    with DuckDBArchive(path) as archive:
        archive.create_run(run, {})
        archive.record([(Candidate(f"p{i}", run, 0, 1, (), f"def policy(s, p):\n    return {i}", "seed", time.time()),
                         EvalResult(f"p{i}", "search", Status.OK, score=-float(i))) for i in range(programs)])


def _programs(path) -> int:
    with DuckDBArchive(path, read_only=True) as archive:
        return archive.con.execute("SELECT count(*) FROM programs").fetchone()[0]


def test_a_ctrl_c_between_the_restores_renames_waits_until_the_backup_is_the_archive(tmp_path, monkeypatch):
    """The backup takes the archive's place in one rename; a Ctrl-C that lands on the rename is heard
    once it is done. The archive it replaced is kept whole, and the directory never lacks an archive."""
    _archive(tmp_path / "archive.duckdb", "r1", 3)
    _archive(tmp_path / "archive.backup.duckdb", "r1", 2)
    real, seen = os.replace, []

    def interrupted(src, dst):
        real(src, dst)
        if not os.path.basename(dst).startswith("archive."):  # the backup's copy, staged: nothing changed yet
            return
        seen.append(((tmp_path / "archive.duckdb").exists(), os.path.basename(dst)))
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(backup.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        backup.restore(tmp_path)
    assert seen == [(True, "archive.duckdb")], seen
    assert _programs(tmp_path / "archive.duckdb") == 2  # the backup
    kept = list(tmp_path.glob("archive.replaced-*.duckdb"))
    assert len(kept) == 1 and _programs(kept[0]) == 3 and not list(tmp_path.glob(".archive.duckdb.*"))


def _killed_writer(path, commits: str) -> None:
    """A driver of `path` (as `a`) that checkpoints a run r1, makes `commits` (Python), and dies with
    them in its log only (os._exit: no close, no fold)."""
    writer = ("import os, sys\nfrom store.duckdb_archive import DuckDBArchive\n"
              "a = DuckDBArchive(sys.argv[1])\n"
              f"a.create_run('r1', {{}}); a.con.execute('CHECKPOINT')\n{commits}\nos._exit(0)\n")
    subprocess.run([sys.executable, "-c", writer, str(path)], check=True,
                   cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def test_a_killed_writers_log_goes_with_the_archive_it_replaces_and_never_onto_the_backup(tmp_path):
    """A driver killed with commits in its log (archive.duckdb.wal): the restored archive opens with none
    of them, and the replaced file, with its log beside it, still holds them."""
    _archive(tmp_path / "archive.backup.duckdb", "r1", 2)
    _killed_writer(tmp_path / "archive.duckdb", "a.con.execute(\"INSERT INTO events VALUES ('r1', 0, 'x', '{}')\")")
    assert (tmp_path / "archive.duckdb.wal").exists()
    backup.restore(tmp_path)
    assert _programs(tmp_path / "archive.duckdb") == 2 and not (tmp_path / "archive.duckdb.wal").exists()
    kept = next(tmp_path.glob("archive.replaced-*.duckdb"))
    assert kept.with_name(kept.name + ".wal").exists()
    with DuckDBArchive(kept, read_only=True) as old:
        assert old.con.execute("SELECT count(*) FROM events WHERE kind = 'x'").fetchone() == (1,)


def test_what_a_killed_restore_was_staging_is_removed_by_the_next_one(tmp_path):
    """A restore killed while it copied the backup leaves `.archive.duckdb.PID.restoring` (as large as
    the archive); the next restore removes it once PID is gone, and leaves a live restore's alone."""
    _archive(tmp_path / "archive.duckdb", "r1", 3)
    _archive(tmp_path / "archive.backup.duckdb", "r1", 2)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    left = [tmp_path / f".archive.duckdb.{gone}.restoring", tmp_path / f".archive.duckdb.{gone}.restoring.tmp"]
    for path in left:
        path.write_bytes(b"\0" * 4096)
    live = tmp_path / f".archive.duckdb.{os.getppid()}.restoring"
    live.write_bytes(b"\0")
    backup.restore(tmp_path)
    assert not any(path.exists() for path in left) and live.exists()
    assert _programs(tmp_path / "archive.duckdb") == 2


def test_a_copied_runs_archive_given_as_the_backup_brings_the_commits_of_its_log(tmp_path):
    """The machine lost, its run directory copied off it (archive.duckdb with the killed driver's
    archive.duckdb.wal): `atoll resume NEWDIR --from-backup COPY/archive.duckdb` took the file alone, and
    the resumed run lacked every commit since the last fold of the log (up to 256 MB of them)."""
    lost = tmp_path / "lost"
    lost.mkdir()
    _killed_writer(lost / "archive.duckdb", "import time\nfrom store.records import Candidate, EvalResult, Status\n"
                   "a.record([(Candidate(f'p{i}', 'r1', 0, 1, (), 'x = 1', 'seed', time.time()),\n"
                   "           EvalResult(f'p{i}', 'search', Status.OK, score=-1.0)) for i in range(5)])")
    log = lost / "archive.duckdb.wal"
    assert log.exists()
    before = (lost / "archive.duckdb").read_bytes(), log.read_bytes()
    said = backup.restore(tmp_path / "new", lost / "archive.duckdb")
    assert "(5 search evaluations committed then" in said
    assert _programs(tmp_path / "new" / "archive.duckdb") == 5
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == ["archive.duckdb"]
    assert ((lost / "archive.duckdb").read_bytes(), log.read_bytes()) == before  # the copy given is left as it was


def test_a_live_runs_archive_is_refused_as_the_backup(tmp_path):
    """A file a live driver writes changes while it is copied: refused in one line, nothing made."""
    _archive(tmp_path / "live.duckdb", "r1", 2)
    hold = "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path / "live.duckdb")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=r"live\.duckdb: a live process holds it"):
            backup.restore(tmp_path / "new", tmp_path / "live.duckdb")
    finally:
        holder.kill()
        holder.wait()
    assert not (tmp_path / "new").exists()
