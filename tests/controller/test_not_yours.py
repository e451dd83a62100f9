"""A run this user may not write (another user's, a read-only copy), or a temp folder where Ray
cannot make its session, is one line saying what to do; what only reads it still works.

Root opens any file, so the unprivileged pass (tests/evaluators/sandbox/test_unprivileged.py)
runs most of these as uid 65534; the report on a read-only copy runs as root without the
capabilities that override permission bits, so they hold for it as for any owner.
"""
import os
import shutil
import subprocess
import sys

import pytest

from controller import rundir
from controller.backup import check_backup_dir
from controller.cli import UserError
from store.duckdb_archive import DuckDBArchive
from tests.conftest import ROOT
from tests.controller.runs import CONFIG, TINY, atoll, env


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens any file; the unprivileged pass runs this")
def test_a_run_one_may_read_but_not_write_is_read_and_refused_for_writing_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    DuckDBArchive(run_dir / rundir.ARCHIVE).close()
    (run_dir / rundir.ARCHIVE).chmod(0o444)
    run_dir.chmod(0o555)
    try:
        with pytest.raises(UserError) as refused:
            rundir.open_archive(run_dir)  # what resume and report do
        line = str(refused.value)
        assert "\n" not in line and line.startswith(f"{run_dir / rundir.ARCHIVE}: permission denied (this command "
                                                     "needs to write it)")
        assert "copy the run directory to a folder of your own" in line
        assert f"not writable by this user; make it writable (chmod -R u+w {run_dir})" in line  # its owner
        with rundir.open_archive(run_dir, read_only=True) as archive:  # status and query still read it
            assert archive is not None
        with pytest.raises(UserError, match=r"cannot create the run directory .*run/new: Permission denied"):
            rundir.check_can_make(run_dir / "new")  # `atoll run --run-dir` there, refused before Ray starts
        with pytest.raises(UserError, match=r"^controller.backup_dir: .*/run is not writable by this user; give "
                                            r"another with --set controller.backup_dir=PATH \(or '' for none\)$"):
            check_backup_dir(str(run_dir))  # a folder for the backups' copies, also before Ray starts
    finally:
        run_dir.chmod(0o755)


@pytest.mark.skipif(os.geteuid() == 0, reason="root opens any folder; the unprivileged pass runs this")
def test_a_temp_folder_where_ray_cannot_make_its_session_is_one_line(tmp_path):
    locked = tmp_path / "locked"  # this user's own, but it may not search or write it: another user's /tmp
    locked.mkdir()
    locked.chmod(0)
    try:
        proc = subprocess.run([sys.executable, "-m", "controller", "run", str(ROOT / "configs" / "inventory.toml"),
                               "--max-evals", "2", "--run-dir", str(tmp_path / "run"), "--no-report",
                               "--set", "memory.enabled=false"], cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
                                   "TMPDIR": str(locked)},
                              capture_output=True, text=True, timeout=180, check=False)
    finally:
        locked.chmod(0o755)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    temp, last = locked / "ray", proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"atoll: the command's own Ray did not start: [Errno 13] Permission denied: '{temp}' "
                           f"(Ray keeps its session in {temp}, "), last
    assert last.endswith(" free there; set RAY_TMPDIR to a folder you can write)"), last


BOUND_BY_PERMISSIONS = "-dac_override,-dac_read_search,-fowner"  # root's overrides of permission bits, dropped


def _as_an_owner(tmp_path, *args) -> subprocess.CompletedProcess:
    """`atoll ARGS` as root bound by permission bits, as the owner of a file is when not root."""
    return subprocess.run(["setpriv", f"--bounding-set={BOUND_BY_PERMISSIONS}", f"--inh-caps={BOUND_BY_PERMISSIONS}",
                           sys.executable, "-m", "controller", *map(str, args)], cwd=ROOT, env=env(tmp_path),
                          capture_output=True, text=True, timeout=180, check=False)


def _heldout_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("│")][-6:]  # the table's 6 rows come last


def _read_only_copy(run_dir, to, lacking: str | None = None):
    shutil.copytree(run_dir, to)
    if lacking is not None:
        with DuckDBArchive(to / rundir.ARCHIVE) as archive:
            archive.con.execute("DELETE FROM evaluations WHERE split = 'heldout' AND program_id LIKE ?", [lacking])
    subprocess.run(["chmod", "-R", "a-w", str(to)], check=True)
    return to


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv "
                    "(util-linux) to drop the capabilities that override permission bits")
def test_a_report_on_a_read_only_copy_reads_a_complete_table_and_refuses_only_what_it_would_write(tmp_path):
    run_dir = tmp_path / "run"
    made = atoll(tmp_path, "run", CONFIG, *TINY, "--max-evals", "3", "--run-dir", run_dir)
    assert made.returncode == 0 and "held-out split" in made.stdout, made.stderr[-3000:]
    complete = _read_only_copy(run_dir, tmp_path / "complete")
    files = sorted(p.name for p in complete.iterdir())
    lacking = _read_only_copy(run_dir, tmp_path / "lacking", lacking="baseline-myopic-%")
    read = _as_an_owner(tmp_path, "report", complete)
    refused = _as_an_owner(tmp_path, "report", lacking)
    subprocess.run(["chown", "-R", "65534:65534", str(lacking)], check=True)
    theirs = _as_an_owner(tmp_path, "report", lacking)
    on_read_only_mount = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", (f"mount --bind {run_dir} {run_dir} && "
         f"mount -o remount,bind,ro {run_dir} && exec {sys.executable} -m controller resume {run_dir}")],
        cwd=ROOT, env=env(tmp_path), capture_output=True, text=True, timeout=120, check=False)

    assert read.returncode == 0, read.stderr[-3000:]
    assert (f"[atoll] {complete} is not writable here; every held-out result is in its archive, so the report "
            "reads it only") in read.stdout
    assert "5 of 5 programs already scored" in read.stdout and "scoring" not in read.stdout
    assert _heldout_rows(read.stdout) == _heldout_rows(made.stdout)  # the run's own table, DP optimum included
    assert sorted(p.name for p in complete.iterdir()) == files  # nothing written beside it (no WAL, no socket)
    archive = lacking / rundir.ARCHIVE
    why = "atoll report needs to write it: it lacks 1 of the 5 held-out results"
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert refused.stderr.strip() == (f"atoll: {archive}: permission denied ({why}): the run directory is not "
                                      f"writable by this user; make it writable (chmod -R u+w {lacking}), or copy "
                                      "the run directory to a folder of your own and give that")
    assert theirs.returncode == 2 and theirs.stderr.strip() == (
        f"atoll: {archive}: permission denied ({why}): the run directory is not writable by this user; run it as "
        "the run's owner (nobody, uid 65534), or copy the run directory to a folder of your own and give that")
    assert on_read_only_mount.returncode == 2 and on_read_only_mount.stderr.strip() == (
        f"atoll: {run_dir / rundir.ARCHIVE}: read-only file system (this command needs to write it); copy the run "
        "directory to a folder of your own and give that")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv "
                    "(util-linux) to drop the capabilities that override permission bits")
def test_steering_another_users_live_run_says_it_is_theirs_not_that_it_is_not_live(tmp_path):
    """Its control.json is its owner's only (mode 0600): `atoll pause` and `atoll watch` said the run was
    not live while it ran."""
    from controller import control

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / rundir.ARCHIVE):  # held for writing, as its driver holds it
        control.write_record(run_dir, control.Setup("127.0.0.1", 0, "t" * 24, True), 1)
        os.chown(run_dir / control.RECORD, 65534, 65534)
        refusals = [_as_an_owner(tmp_path, command, run_dir) for command in ("pause", "watch")]
    for refused in refusals:
        assert refused.returncode == 2 and refused.stdout == "", refused.stdout
        assert refused.stderr.strip() == (
            f"atoll: {run_dir}: the run is live, but its control.json (the control plane's address and token) is "
            "readable by the user who started it only, so only they can steer or watch it (run this as nobody, "
            "uid 65534)"), refused.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv "
                    "(util-linux) to drop the capabilities that override permission bits")
def test_reading_another_users_live_run_is_one_line_naming_its_owner(tmp_path):
    """The live driver answers queries on archive.sock, which only its user may connect to: `atoll status`
    and `atoll progress` on another user's live run ended in a PermissionError traceback."""
    from store.live import SOCKET, LiveReads

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / rundir.ARCHIVE) as archive, LiveReads(archive, run_dir):
        os.chown(run_dir / SOCKET, 65534, 65534)
        refusals = [_as_an_owner(tmp_path, command, run_dir) for command in ("status", "progress")]
    for refused in refusals:
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
        assert refused.stderr.strip() == (
            f"atoll: {run_dir}: the run is live, and the process holding its archive (its driver, or `atoll "
            "report`) answers the user who started it only (archive.sock: permission denied); run this as that "
            "user (nobody, uid 65534), or after the run has ended"), refused.stderr
