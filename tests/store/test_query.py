"""`run_query`: read-only, clear errors, no access to other files, a live run answered by its holder."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from store.duckdb_archive import DuckDBArchive
from store.query import QueryError, is_live, run_query

ROOT = Path(__file__).resolve().parents[2]


def _new_run_dir(path):
    with DuckDBArchive(path / "archive.duckdb") as a:
        a.create_run("r1", {"run": {"name": "t"}})
    return path


@pytest.fixture()
def run_dir(tmp_path):
    return _new_run_dir(tmp_path)


@pytest.fixture(scope="module")
def shared_run_dir(tmp_path_factory):
    """For tests that only read (or must fail to write): one archive for all of them."""
    return _new_run_dir(tmp_path_factory.mktemp("run"))


def test_select_answers_without_a_note(run_dir):
    cols, rows, note = run_query(run_dir, "SELECT run_id, status FROM runs")
    assert cols == ["run_id", "status"] and rows == [("r1", "created")] and note is None


@pytest.mark.parametrize("sql", [
    "DESCRIBE runs", "SHOW TABLES", "SUMMARIZE runs", "PRAGMA table_info('runs')", "EXPLAIN SELECT * FROM runs",
    "FROM lineage_of('x')", "SELECT * FROM mutator_success", "WITH r AS (SELECT 1 AS n) SELECT n FROM r"])
def test_reads_of_every_kind_answer(shared_run_dir, sql):
    cols, rows, note = run_query(shared_run_dir, sql)
    assert cols and note is None


def test_several_statements_answer_with_the_last(run_dir):
    assert run_query(run_dir, "SELECT 1 AS a; SELECT 2 AS b")[:2] == (["b"], [(2,)])


def test_atoll_query_prints_each_statements_result_in_turn(run_dir, atoll_cli):
    out = atoll_cli("query", str(run_dir), "SELECT 1 AS a; SELECT run_id FROM runs; SELECT 2 AS b", "--json")
    assert out.stdout.splitlines() == ['{"a": 1}', '{"run_id": "r1"}', '{"b": 2}'], out.stdout
    refused = atoll_cli("query", str(run_dir), "SELECT 1 AS a; DELETE FROM runs", check=False)
    assert refused.returncode == 2 and refused.stdout == "" and "DELETE statements are refused" in refused.stderr


def test_json_lines_keep_every_column_of_a_join_that_names_one_twice(run_dir, atoll_cli):
    """`SELECT r.*, s.*` of a join: the second run_id (or created_at) overwrote the first in the JSON line,
    and a column was lost without a word; the repeats are now named `_1`, `_2` after the first."""
    out = atoll_cli("query", str(run_dir), "SELECT 1 AS a, 2 AS a, 3 AS b, 4 AS a", "--json")
    assert out.stdout.splitlines() == ['{"a": 1, "a_1": 2, "b": 3, "a_2": 4}'], out.stdout


@pytest.mark.parametrize("sql", [
    "DELETE FROM runs", "CREATE TABLE t (a INT)", "UPDATE runs SET status = 'x'", "DROP VIEW mutator_success",
    "INSERT INTO runs SELECT * FROM runs", "CREATE TEMP TABLE t AS SELECT 1", "CREATE MACRO m() AS 1",
    "SET threads = 1", "SET VARIABLE x = 1", "RESET threads", "PRAGMA enable_profiling", "INSTALL httpfs",
    "LOAD httpfs", "ATTACH 'other.duckdb' AS other", "COPY runs TO 'out.csv'", "EXPORT DATABASE 'dump'",
    "CHECKPOINT", "CALL pragma_table_info('runs')", "EXPLAIN ANALYZE DELETE FROM runs", "VACUUM",
    "SELECT 1; DELETE FROM runs", "WITH r AS (SELECT 1) DELETE FROM runs", "BEGIN", "USE memory"])
def test_writes_are_refused(shared_run_dir, sql):
    with pytest.raises(QueryError, match="read-only"):
        run_query(shared_run_dir, sql)
    assert run_query(shared_run_dir, "SELECT status FROM runs")[1] == [("created",)]
    assert sorted(p.name for p in shared_run_dir.iterdir()) == ["archive.duckdb"]


def test_other_files_are_out_of_reach(run_dir):
    with pytest.raises(QueryError, match="read-only.*disabled"):
        run_query(run_dir, "SELECT * FROM read_csv('/etc/passwd')")


def test_bad_sql_gets_duckdbs_first_line(run_dir):
    with pytest.raises(QueryError) as parse:
        run_query(run_dir, "SELEC 1")
    assert str(parse.value) == 'Parser Error: syntax error at or near "SELEC"'
    with pytest.raises(QueryError) as bind:
        run_query(run_dir, "SELECT * FROM no_such_table")
    assert str(bind.value).startswith("Catalog Error: Table with name no_such_table does not exist")
    assert "\n" not in str(bind.value)
    with pytest.raises(QueryError, match="no SQL statement"):
        run_query(run_dir, "  ;  ")


def test_not_a_run_directory(tmp_path):
    with pytest.raises(QueryError, match="not a run directory"):
        run_query(tmp_path / "absent", "SELECT 1")
    with pytest.raises(QueryError, match="not a run directory"):
        run_query(tmp_path, "SELECT 1")


def test_an_archive_file_is_read_where_it_lies_and_a_runs_own_file_as_its_run_directory(run_dir, tmp_path):
    """A backup, or its copy in controller.backup_dir, is given as the file; a run's archive.duckdb given as
    a file is its run directory's (answered by its live driver while one holds it). A file held by a
    writer, and a file that is no archive, are one line each."""
    copy = tmp_path / "elsewhere" / "run-1.duckdb"
    copy.parent.mkdir()
    copy.write_bytes((run_dir / "archive.duckdb").read_bytes())
    assert run_query(copy, "SELECT run_id FROM runs")[1:] == ([("r1",)], None)
    assert run_query(run_dir / "archive.duckdb", "SELECT run_id FROM runs")[1:] == ([("r1",)], None)
    with pytest.raises(QueryError, match="read-only"):
        run_query(copy, "DELETE FROM runs")
    (tmp_path / "notes.txt").write_text("not an archive\n")
    with pytest.raises(QueryError, match=r"^cannot open .*notes.txt: .*not a valid DuckDB database file"):
        run_query(tmp_path / "notes.txt", "SELECT 1")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(copy), str(copy.parent)], cwd=ROOT, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert writer.stdout.readline().strip() == "ready"
        with pytest.raises(QueryError, match=r"run-1.duckdb is held by another process \(.*lock.*\); retry once"):
            run_query(copy, "SELECT count(*) FROM runs")
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
    assert run_query(copy, "SELECT count(*) FROM runs")[1] == [(2,)]


WRITER = """
import sys
from store.duckdb_archive import DuckDBArchive
from store.live import LiveReads
with DuckDBArchive(sys.argv[1]) as archive:
    archive.create_run("r2", {}, "")
    print("ready", flush=True)
    sys.stdin.readline()
    with LiveReads(archive, sys.argv[2]):
        print("serving", flush=True)
        for line in sys.stdin:
            archive.set_run_status("r2", line.strip())
            print("done", flush=True)
"""


def test_a_live_run_is_answered_by_its_holder(run_dir):
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(run_dir / "archive.duckdb"), str(run_dir)],
                              cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert writer.stdout.readline().strip() == "ready"
        with pytest.raises(QueryError, match="held by a process that answers no live queries yet.*lock"):
            run_query(run_dir, "SELECT count(*) FROM runs")
        writer.stdin.write("serve\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "serving"
        cols, rows, note = run_query(run_dir, "SELECT run_id, status FROM runs ORDER BY run_id")
        assert rows == [("r1", "created"), ("r2", "created")] and re.fullmatch(r"live run: .* \(pid \d+\)", note)
        assert is_live(note) and not is_live(None)
        writer.stdin.write("running\n")  # a commit is visible to the next query at once
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "done"
        assert run_query(run_dir, "SELECT status FROM runs WHERE run_id = 'r2'")[1] == [("running",)]
        with pytest.raises(QueryError, match="read-only"):
            run_query(run_dir, "DELETE FROM runs")
        with pytest.raises(QueryError, match="read-only.*disabled"):
            run_query(run_dir, "SELECT * FROM read_csv('/etc/passwd')")
        with pytest.raises(QueryError, match="Catalog Error"):
            run_query(run_dir, "SELECT * FROM no_such_table")
        assert run_query(run_dir, "SELECT now() AS t")[1][0][0].tzinfo is not None
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
    assert run_query(run_dir, "SELECT count(*) FROM runs")[1:] == ([(2,)], None)
    assert not (run_dir / "archive.sock").exists()


def test_timestamps_with_time_zones_answer(run_dir):
    cols, rows, _ = run_query(run_dir, "SELECT now() AS t, started_at FROM runs")
    assert rows[0][0].tzinfo is not None


def test_a_reader_that_leaves_early_ends_the_command_without_a_traceback(shared_run_dir):
    """`atoll query ... | head -1`: the reader closes the pipe after a line; the command ends at once,
    quietly, with 141 (as a process stopped by SIGPIPE), not with BrokenPipeError's traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "controller", "query", "--json", str(shared_run_dir),
                             "SELECT range AS i, repeat('x', 100) AS pad FROM range(200000)"], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert first.startswith(b'{"i": 0') and "Traceback" not in err and "BrokenPipe" not in err, err


def _damaged_log(run_dir):
    """A run directory whose driver was killed with commits in its log, and a disk error in the log."""
    writer = ("import os, sys, time\nfrom store.duckdb_archive import DuckDBArchive\n"
              "from store.records import Candidate, EvalResult, Status\n"
              "a = DuckDBArchive(sys.argv[1])\n"
              "a.create_run('r1', {}); a.con.execute('CHECKPOINT')\n"
              "for b in range(4):\n"
              "    a.record([(Candidate(f'p{b}-{i}', 'r1', 0, 1, (), 'x = 1' * 50, 'seed', time.time()),\n"
              "               EvalResult(f'p{b}-{i}', 'search', Status.OK, score=-1.0)) for i in range(50)])\n"
              "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", writer, str(run_dir / "archive.duckdb")], check=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))
    log = run_dir / "archive.duckdb.wal"
    data = bytearray(log.read_bytes())
    data[data.index(b"p2-10")] = ord("q")  # a byte of the third commit: its entry's checksum no longer matches
    log.write_bytes(bytes(data))
    return log


def test_a_damaged_log_is_named_with_how_to_open_the_archive_without_it(tmp_path, atoll_cli):
    """A disk error in archive.duckdb.wal: `atoll resume` ended in a DuckDB traceback, and query and status
    said only 'cannot open'; each now names the damaged log and how to open the archive without it."""
    log = _damaged_log(tmp_path)
    aside = f"set the log aside: mv {log} {log}.damaged"
    with pytest.raises(QueryError, match="^damaged archive: .*Corrupt WAL file") as refused:
        run_query(tmp_path, "SELECT count(*) FROM programs")
    assert str(refused.value).endswith(aside)
    resume = atoll_cli("resume", str(tmp_path), check=False)
    assert resume.returncode == 2 and "Traceback" not in resume.stderr, resume.stderr
    assert resume.stderr.strip().splitlines()[-1].endswith(aside), resume.stderr
    log.rename(f"{log}.damaged")  # as told: the archive as of the log's last fold
    assert run_query(tmp_path, "SELECT count(*) FROM runs")[1] == [(1,)]


def test_json_lines_are_strict_json_where_a_value_is_not_finite(run_dir, atoll_cli):
    """A failed program's NaN score or a ratio over nothing printed `NaN` / `Infinity`, which is not JSON:
    jq and JavaScript refused the whole line. Such a value is now null, nested ones too."""
    out = atoll_cli("query", str(run_dir), "SELECT 'nan'::DOUBLE AS a, 'inf'::DOUBLE AS b, 1.5::DOUBLE AS c, "
                                           "['-inf'::DOUBLE, 2.0] AS d, {'e': 'nan'::DOUBLE} AS f", "--json")
    assert [json.loads(line, parse_constant=_refuse) for line in out.stdout.splitlines()] == [
        {"a": None, "b": None, "c": 1.5, "d": [None, 2.0], "f": {"e": None}}], out.stdout


def _refuse(name):
    raise ValueError(f"{name} is not JSON")
