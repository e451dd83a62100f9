"""A run this user may not write (another user's, a read-only copy), or a temp folder where Ray
cannot make its session, is one line saying what to do.

Root opens any file, so the unprivileged pass (tests/evaluators/sandbox/test_unprivileged.py)
runs these as uid 65534.
"""
import os
import subprocess
import sys

import pytest

from controller import rundir
from controller.cli import UserError
from store.duckdb_archive import DuckDBArchive
from tests.conftest import ROOT


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
        with rundir.open_archive(run_dir, read_only=True) as archive:  # status and query still read it
            assert archive is not None
        with pytest.raises(UserError, match=r"cannot create the run directory .*run/new: Permission denied"):
            rundir.check_can_make(run_dir / "new")  # `atoll run --run-dir` there, refused before Ray starts
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
