"""Live reads: the process holding an archive answers `atoll query`, read-only, and a killed
holder's socket does not stop anyone (real DuckDB files, real processes, real sockets)."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest

from store.duckdb_archive import DuckDBArchive
from store.live import SOCKET, LiveReads, run_read_only
from store.query import QueryError, is_live, run_query
from store.records import Candidate, EvalResult, Status

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
COUNT = [sys.executable, "-c", "import sys; from store.query import run_query; "
         "cols, rows, note = run_query(sys.argv[1], 'SELECT count(*) FROM programs'); print(rows[0][0], note)"]


def pair(pid, parents=()):
    return (Candidate(pid, "r1", 0, len(parents), tuple(parents), f"x = {pid!r}", "seed" if not parents else "m", 0.0),
            EvalResult(pid, "search", Status.OK, score=-1.0))


@pytest.fixture()
def held(tmp_path):
    """An archive held read-write by this process, serving live reads."""
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive, LiveReads(archive, tmp_path):
        archive.create_run("r1", {})
        yield archive, tmp_path


def _ask_from_another_process(run_dir) -> str:
    out = subprocess.run(COUNT + [str(run_dir)], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_another_process_sees_each_commit_at_once_while_the_writer_keeps_its_lock(held):
    archive, run_dir = held
    archive.record([pair("a")])
    assert _ask_from_another_process(run_dir).startswith("1 live run: answered by the process holding it")
    archive.record([pair("b", ["a"])])
    assert _ask_from_another_process(run_dir).startswith("2 live")
    probe = subprocess.run([sys.executable, "-c", "import duckdb, sys; duckdb.connect(sys.argv[1], read_only=True)",
                            str(archive.path)], capture_output=True, text=True)
    assert probe.returncode != 0 and "lock" in probe.stderr
    archive.record([pair("c", ["b"])])  # still the writer
    assert sorted(p.name for p in run_dir.iterdir() if not p.name.endswith(".wal")) == ["archive.duckdb", SOCKET]


def test_the_transaction_and_the_database_refuse_what_the_parser_would(held):
    """Even a statement the parser let through could neither write, reach a file, nor change a setting."""
    archive, _ = held
    cursor = archive.cursor()
    for sql, error in [("DELETE FROM runs", "read-only mode"), ("CREATE TABLE t (a INT)", "read-only mode"),
                       ("SELECT * FROM read_csv('/etc/passwd')", "disabled by configuration"),
                       ("SET threads = 1", "configuration has been locked"),
                       ("ATTACH '/tmp/other.duckdb' AS other", "disabled by configuration")]:
        with pytest.raises(duckdb.Error, match=error):
            run_read_only(cursor, duckdb.extract_statements(sql))
        cursor.execute("ROLLBACK")
    assert archive.con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def test_a_query_past_its_time_is_interrupted(tmp_path):
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive, LiveReads(archive, tmp_path, timeout_s=0.3):
        with pytest.raises(QueryError, match=r"^interrupted: the query ran past 0\.3 s, the longest a live run answers "
                                             r"one; narrow it \(WHERE, LIMIT\), or ask once the run has ended"):
            run_query(tmp_path, "SELECT count(*) FROM range(1000000000000) a(x) WHERE x % 7 = 3")
        assert run_query(tmp_path, "SELECT 42")[1] == [(42,)]  # and the next one answers


def test_a_query_running_when_the_run_ends_is_told_so(tmp_path):
    """The driver ends (or is stopped) during a live query: its asker read `INTERRUPT Error: Interrupted!`,
    with no word of why or what to do."""
    slow = "SELECT count(*) FROM range(1000000000000) a(x) WHERE x % 7 = 3"
    ask = ("import sys\nfrom store.query import QueryError, run_query\ntry:\n    run_query(sys.argv[1], sys.argv[2])\n"
           "except QueryError as exc:\n    print(exc)\n")
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        with LiveReads(archive, tmp_path, timeout_s=600) as reads:
            asker = subprocess.Popen([sys.executable, "-c", ask, str(tmp_path), slow], cwd=ROOT, env=ENV,
                                     stdout=subprocess.PIPE, text=True)
            deadline = time.monotonic() + 60
            while not reads._running and time.monotonic() < deadline:
                time.sleep(0.05)
        said = asker.communicate(timeout=60)[0].strip()
    assert said == ("interrupted: the process holding the archive closed it (the run ended or stopped) while this "
                    "query ran; ask again"), said


def test_a_query_whose_asker_hung_up_is_interrupted_and_the_next_asker_is_answered(tmp_path):
    """Ctrl-C on a slow `atoll query` (its process killed) stops the query in the holder: the next asker
    (`atoll status` at 3 a.m.) does not wait out the abandoned query's time limit."""
    slow = "SELECT count(*) FROM range(1000000000000) a(x) WHERE x % 7 = 3"
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive, LiveReads(archive, tmp_path, timeout_s=600) as reads:
        ask = "import sys; from store.query import run_query; run_query(sys.argv[1], sys.argv[2])"
        asker = subprocess.Popen([sys.executable, "-c", ask, str(tmp_path), slow], cwd=ROOT, env=ENV)
        deadline = time.monotonic() + 60
        while not reads._running and time.monotonic() < deadline:
            time.sleep(0.05)
        asker.kill()
        asker.wait()
        deadline = time.monotonic() + 10
        while reads._running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not reads._running, "the abandoned query still runs"
        assert run_query(tmp_path, "SELECT 42")[1] == [(42,)]


def test_a_slow_query_does_not_hold_up_the_next_askers(tmp_path):
    """One asker's long analysis of a live run: `atoll status` (another asker) is answered meanwhile,
    not after the slow query's end or its time limit."""
    slow = "SELECT count(*) FROM range(1000000000000) a(x) WHERE x % 7 = 3"
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive, LiveReads(archive, tmp_path, timeout_s=600) as reads:
        ask = "import sys; from store.query import run_query; run_query(sys.argv[1], sys.argv[2])"
        asker = subprocess.Popen([sys.executable, "-c", ask, str(tmp_path), slow], cwd=ROOT, env=ENV)
        try:
            deadline = time.monotonic() + 60
            while not reads._running and time.monotonic() < deadline:
                time.sleep(0.05)
            answered = []
            quick = threading.Thread(target=lambda: answered.append(run_query(tmp_path, "SELECT 42")[1]), daemon=True)
            quick.start()
            quick.join(20)
            assert answered == [[(42,)]], "the second asker waited on the first's slow query"
            assert asker.poll() is None  # the slow one still runs
        finally:
            asker.kill()
            asker.wait()


def test_a_deep_run_directory_is_served(tmp_path):
    deep = tmp_path.joinpath(*["d" * 30] * 4)
    deep.mkdir(parents=True)
    assert len(str(deep / SOCKET)) > 108
    with DuckDBArchive(deep / "archive.duckdb") as archive, LiveReads(archive, deep):
        archive.create_run("r1", {})
        cols, rows, note = run_query(deep, "SELECT run_id FROM runs")
    assert rows == [("r1",)] and is_live(note)


HOLDER = """
import sys, time
from store.duckdb_archive import DuckDBArchive
from store.live import LiveReads
with DuckDBArchive(sys.argv[1] + "/archive.duckdb") as archive, LiveReads(archive, sys.argv[1]):
    if sys.argv[2] == "new":
        archive.create_run("r1", {})
        archive.set_run_status("r1", "running")
    print("serving", flush=True)
    time.sleep(600)
"""


def _holder(run_dir, mode):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), mode], cwd=ROOT, env=ENV, text=True,
                            stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline().strip() == "serving"
    return proc


def test_a_stale_socket_after_kill_9_neither_blocks_queries_nor_the_next_holder(tmp_path, atoll_cli):
    first = _holder(tmp_path, "new")
    assert is_live(run_query(tmp_path, "SELECT 1")[2])
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert (tmp_path / SOCKET).exists()  # left behind: connecting to it is refused
    cols, rows, note = run_query(tmp_path, "SELECT status FROM runs")
    assert rows == [("running",)] and note is None  # answered by the archive itself
    status = atoll_cli("status", str(tmp_path))
    assert "no driver holds this run" in status.stdout and f"atoll resume {tmp_path} " in status.stdout
    assert f"atoll submit --resume {tmp_path} --address" in status.stdout  # for a run that was a Ray job
    second = _holder(tmp_path, "again")
    try:
        cols, rows, note = run_query(tmp_path, "SELECT status FROM runs")
        assert rows == [("running",)] and is_live(note) and f"pid {second.pid}" in note
        assert "no driver holds" not in atoll_cli("status", str(tmp_path)).stdout
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(timeout=30)
    started = time.monotonic()
    assert run_query(tmp_path, "SELECT count(*) FROM runs")[1] == [(1,)]
    assert time.monotonic() - started < 5


def test_a_run_directory_where_no_socket_can_be_made_still_records(tmp_path, capsys):
    (tmp_path / SOCKET).mkdir()  # something that is no socket stands in the way
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive, LiveReads(archive, tmp_path):
        archive.record([pair("a")])
    assert "no live queries for this run" in capsys.readouterr().err
    assert (tmp_path / SOCKET).is_dir() and run_query(tmp_path, "SELECT count(*) FROM programs")[1] == [(1,)]


def test_a_close_that_comes_before_a_query_begins_executing_still_stops_it(tmp_path, monkeypatch):
    """A stop between a query's cursor being made and DuckDB starting its work: the interrupt reached a
    cursor with nothing running and was lost, and the driver's close waited for the query (here, for ever)."""
    from store import live

    real = live.run_read_only

    def late(cursor, statements):
        time.sleep(0.5)  # the cursor is registered; the query has not begun
        return real(cursor, statements)

    monkeypatch.setattr(live, "run_read_only", late)
    slow = "SELECT count(*) FROM range(1000000000000) a(x) WHERE x % 7 = 3"
    ask = ("import sys\nfrom store.query import QueryError, run_query\ntry:\n    run_query(sys.argv[1], sys.argv[2])\n"
           "except QueryError as exc:\n    print(exc)\n")
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        reads = LiveReads(archive, tmp_path, timeout_s=600).__enter__()
        asker = subprocess.Popen([sys.executable, "-c", ask, str(tmp_path), slow], cwd=ROOT, env=ENV,
                                 stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not reads._running and time.monotonic() < deadline:
            time.sleep(0.01)
        closer = threading.Thread(target=reads.close, daemon=True)
        closer.start()
        closer.join(timeout=30)
        assert not closer.is_alive(), "close waited for a query its interrupt never reached"
        said = asker.communicate(timeout=60)[0].strip()
    assert said.startswith("interrupted: the process holding the archive closed it"), said
