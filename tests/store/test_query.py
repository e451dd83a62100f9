"""`run_query`: read-only, clear errors, no access to other files."""
import pytest

from store.duckdb_archive import DuckDBArchive
from store.query import QueryError, run_query


@pytest.fixture()
def run_dir(tmp_path):
    with DuckDBArchive(tmp_path / "archive.duckdb") as a:
        a.create_run("r1", {"run": {"name": "t"}})
    return tmp_path


def test_select_answers_without_a_note(run_dir):
    cols, rows, note = run_query(run_dir, "SELECT run_id, status FROM runs")
    assert cols == ["run_id", "status"] and rows == [("r1", "created")] and note is None


@pytest.mark.parametrize("sql", ["DELETE FROM runs", "CREATE TABLE t (a INT)", "UPDATE runs SET status = 'x'",
                                 "DROP VIEW mutator_success"])
def test_writes_are_refused(run_dir, sql):
    with pytest.raises(QueryError, match="read-only"):
        run_query(run_dir, sql)
    assert run_query(run_dir, "SELECT status FROM runs")[1] == [("created",)]


def test_other_files_are_out_of_reach(run_dir):
    with pytest.raises(QueryError, match="disabled"):
        run_query(run_dir, "SELECT * FROM read_csv('/etc/passwd')")


def test_bad_sql_and_bad_directory(run_dir, tmp_path):
    with pytest.raises(QueryError, match="syntax error"):
        run_query(run_dir, "SELEC 1")
    with pytest.raises(QueryError, match="not a run directory"):
        run_query(tmp_path / "absent", "SELECT 1")
