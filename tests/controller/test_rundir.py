"""Run directories and cluster addresses: refusals come before anything is started or written."""
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller import rundir
from controller.address import check_address
from controller.cli import UserError
from store.duckdb_archive import DuckDBArchive, migrations

ROOT = Path(__file__).resolve().parents[2]


def test_runs_started_in_the_same_second_claim_distinct_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt: "20260101-120000")  # both in one second
    first, second = rundir.claim("inv", None), rundir.claim("inv", None)
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name == "inv-20260101-120000-2"


def test_a_run_directory_that_cannot_be_made_is_one_line_naming_it(tmp_path):
    (tmp_path / "file").write_text("")  # nothing can be made inside a file, even by root
    with pytest.raises(UserError, match="a file is there, not a folder"):
        rundir.claim("inventory", str(tmp_path / "file"))
    with pytest.raises(UserError, match=r"cannot create the run directory .*file/x: Not a directory; give --run-dir"):
        rundir.claim("inventory", str(tmp_path / "file" / "x"))
    with pytest.raises(UserError, match=r"cannot create the run directory .*file/runs/inventory-\d+-\d+"):
        rundir.claim("inventory", None, tmp_path / "file" / "runs")  # the default folder, under the cwd
    # the same found before Ray starts (`atoll run` checks first)
    with pytest.raises(UserError, match=r"--run-dir .*file/x/y: .*file is a file, not a folder"):
        rundir.check_can_make(tmp_path / "file" / "x" / "y")
    rundir.check_can_make(tmp_path / "new" / "run")  # nothing made yet, and nothing refused
    assert not (tmp_path / "new").exists()


def test_the_archive_appears_with_its_run_and_only_once(tmp_path, monkeypatch):
    abandoned = tmp_path / ".archive.duckdb.999999999.creating"  # a driver killed while creating it
    abandoned.write_text("")
    with rundir.create_archive(tmp_path, "r1", {"run": {"name": "x"}}, "") as archive:
        assert archive.get_run("r1")["status"] == "created"
    assert not abandoned.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["archive.duckdb"]
    with pytest.raises(UserError, match="already holds a run; continue it with: atoll resume"):
        rundir.create_archive(tmp_path, "r2", {"run": {"name": "x"}}, "")
    # in a Ray job (`atoll submit`) the way on is a job again, not a resume on the job's node
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    for refused in (lambda: rundir.check_free(tmp_path), lambda: rundir.create_archive(tmp_path, "r3", {}, "")):
        with pytest.raises(UserError, match=f"already holds a run; continue it with: atoll submit --resume {tmp_path} "
                                            "--address http://HEAD:8265"):
            refused()
    with DuckDBArchive(tmp_path / "archive.duckdb", read_only=True) as archive:
        assert archive.latest_run_id() == "r1"


def test_a_second_driver_is_refused_with_the_live_drivers_pid(tmp_path):
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        archive.create_run("r1", {"run": {"name": "x"}}, "")
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(60)", str(tmp_path / "archive.duckdb")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError) as refused:
            rundir.open_archive(tmp_path, patience_s=0.3)
    finally:
        holder.kill()
        holder.wait()
    assert str(refused.value).startswith(f"{tmp_path} is in use by a live run (driver pid {holder.pid})")
    with rundir.open_archive(tmp_path) as archive:  # untouched, and free again once the holder is gone
        assert archive.get_run("r1")["status"] == "created"


def test_an_address_where_nothing_answers_is_refused_and_a_listening_one_passes():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        with pytest.raises(UserError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
            check_address(f"127.0.0.1:{port}")  # bound, not listening: refused
        server.listen()
        check_address(f"127.0.0.1:{port}")
        check_address(f"ray://127.0.0.1:{port}")
    for bad in ("nonsense", "host:", "host:99999", ":6379"):
        with pytest.raises(UserError, match="not an address; expected HOST:PORT"):
            check_address(bad)


def test_an_archive_of_a_newer_atoll_is_read_but_never_resumed(tmp_path):
    """An older Atoll (a node not yet upgraded) resuming a newer one's run wrote rows without what the
    newer schema holds; it now refuses in one line before writing anything, and queries still read it."""
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        archive.create_run("r1", {"run": {"name": "x"}}, "")
        archive.con.execute("INSERT INTO schema_version VALUES (999, '999_future.sql', now())")
    before = (tmp_path / "archive.duckdb").read_bytes()
    resume = subprocess.run([sys.executable, "-m", "controller", "resume", str(tmp_path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, check=False)
    assert resume.returncode == 2, resume.stderr
    said = (f"atoll: {tmp_path / 'archive.duckdb'} was written by a newer Atoll (archive schema version 999; this "
            f"Atoll knows up to {migrations()[-1][0]}): continue it with that Atoll or a newer one (upgrade Atoll "
            "here); atoll query, status and best still read it")
    assert resume.stderr.strip().splitlines() == [said]
    assert (tmp_path / "archive.duckdb").read_bytes() == before
    query = subprocess.run([sys.executable, "-m", "controller", "query", str(tmp_path), "SELECT status FROM runs"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert query.returncode == 0 and "created" in query.stdout, query.stderr
