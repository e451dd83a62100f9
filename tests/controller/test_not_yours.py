"""A run this user may not write (another user's, a read-only copy) is one line saying what to do.

Root opens any file, so the unprivileged pass (tests/evaluators/sandbox/test_unprivileged.py)
runs these as uid 65534.
"""
import os

import pytest

from controller import rundir
from controller.cli import UserError
from store.duckdb_archive import DuckDBArchive


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
