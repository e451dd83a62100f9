"""`atoll query --library`: every known run's archive attached read-only, with the library's tables."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from store import library_records as records
from store.duckdb_archive import DuckDBArchive
from store.library import Library, LibraryError
from store.library_query import run_library_query
from store.query import QueryError
from store.records import Candidate, EvalResult, Status

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, name, scores, library):
    """A real archive with a seed and children scoring `scores`, registered in the library."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run(name, {"run": {"name": name}})
        pairs = []
        for i, score in enumerate(scores):
            parents = () if i == 0 else (f"{name}-0",)
            pairs.append((Candidate(f"{name}-{i}", name, 0, i, parents, f"def policy(s, p):\n    return {i}\n",
                                    "seed" if i == 0 else "embedded:wrap_clip", float(i)),
                          EvalResult(f"{name}-{i}", "search", Status.OK, score=score)))
        archive.record(pairs)
        archive.record_evaluations([EvalResult(f"{name}-{len(scores) - 1}", "heldout", Status.OK, score=-1.5)], name)
        archive.log_events(name, [("skill-use", {"program_id": f"{name}-1", "skill_id": "sk-1", "success": True})])
    library.transaction(lambda con: records.upsert_run(con, {
        "run_id": name, "run_dir": str(run_dir), "domain": "inventory", "fingerprint": "fp", "config": {},
        "status": "completed", "evaluations": len(scores), "best_search_score": max(scores)}))
    return run_dir


@pytest.fixture()
def library(tmp_path):
    return Library(tmp_path / "library.duckdb")


def test_views_answer_across_every_known_run(tmp_path, library):
    _run(tmp_path, "a", [-1.0, -0.9, -0.95], library)
    _run(tmp_path, "b", [-1.0, -0.8], library)
    cols, rows, note = run_library_query(library, "SELECT run_id, program_id, search_score, heldout_score, "
                                                  "evaluations FROM best_per_run ORDER BY run_id")
    assert rows == [("a", "a-1", -0.9, None, 3), ("b", "b-1", -0.8, -1.5, 2)] and note is None
    assert run_library_query(library, "SELECT run_dir IS NOT NULL, count(*) FROM all_programs GROUP BY 1")[1] == [
        (True, 5)]
    assert run_library_query(library, "SELECT count(*) FROM all_events WHERE kind = 'skill-use'")[1] == [(2,)]
    assert run_library_query(library, "SELECT run_id, status FROM runs ORDER BY 1")[1] == [
        ("a", "completed"), ("b", "completed")]


def test_best_per_run_is_the_program_atoll_best_names_passing_over_a_failed_validation(tmp_path, library):
    """best_per_run gave the top search score, whose validation was INVALID, where `atoll best` and the
    report crown the next one; it now passes it over the same way."""
    run_dir = _run(tmp_path, "a", [-1.0, -0.9, -0.95], library)
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.record_evaluations([EvalResult("a-1", "validation", Status.INVALID, error="runs away"),
                                    EvalResult("a-2", "validation", Status.OK, score=-1.0)], "a")
    assert run_library_query(library, "SELECT program_id, search_score FROM best_per_run")[1] == [("a-2", -0.95)]


def test_an_empty_library_still_has_every_view(library):
    for view in ("all_programs", "all_evaluations", "all_lineage", "all_events", "best_per_run", "skills",
                 "skill_efficacy", "elites", "prompt_variant_success"):
        assert run_library_query(library, f"SELECT count(*) FROM {view}")[1] == [(0,)]


@pytest.mark.parametrize("sql", ["DELETE FROM runs", "DROP VIEW best_per_run", "CREATE TABLE t AS SELECT 1",
                                 "ATTACH 'x.duckdb' AS x", "COPY runs TO 'out.csv'", "SELECT 1; DELETE FROM runs"])
def test_writes_are_refused(tmp_path, library, sql):
    _run(tmp_path, "a", [-1.0, -0.9], library)
    with pytest.raises(QueryError, match="read-only"):
        run_library_query(library, sql)


def test_no_other_file_is_reachable(tmp_path, library):
    with pytest.raises(QueryError, match="reach no other file"):
        run_library_query(library, "SELECT * FROM read_csv('/etc/passwd')")


def test_a_live_run_is_asked_for_its_rows_and_a_vanished_one_skipped(tmp_path, library):
    live = _run(tmp_path, "live", [-1.0, -0.7], library)
    gone = _run(tmp_path, "gone", [-1.0], library)
    (gone / "archive.duckdb").unlink()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from store.duckdb_archive import DuckDBArchive; "
         "from store.live import LiveReads; a = DuckDBArchive(sys.argv[1] + '/archive.duckdb'); "
         "r = LiveReads(a, sys.argv[1]).__enter__(); print('held', flush=True); time.sleep(30)", str(live)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        _, rows, note = run_library_query(library, "SELECT run_id, search_score FROM best_per_run")
    finally:
        holder.kill()
        holder.wait()
    assert rows == [("live", -0.7)]
    assert f"{live}: live run, its tables as the process holding it answered" in note
    assert f"skipped 1 run(s) whose archive.duckdb is no longer there: {gone}" in note


def test_runs_whose_directories_are_gone_are_one_short_note_however_many(tmp_path, library):
    kept = _run(tmp_path, "kept", [-1.0], library)
    gone = [_run(tmp_path, f"gone{i}", [-1.0], library) for i in range(5)]
    for run_dir in gone:
        (run_dir / "archive.duckdb").unlink()
    _, rows, note = run_library_query(library, "SELECT run_dir FROM best_per_run")
    assert rows == [(str(kept),)]
    assert note == (f"skipped 5 run(s) whose archive.duckdb is no longer there: {gone[0]}, {gone[1]}, {gone[2]} "
                    "and 2 more")


def test_atoll_runs_says_how_many_of_its_runs_are_gone(tmp_path, temporary_library, atoll_cli):
    library = Library(temporary_library)  # the one the CLI reads (ATOLL_LIBRARY)
    _run(tmp_path, "kept", [-1.0], library)
    gone = _run(tmp_path, "gone", [-1.0], library)
    (gone / "archive.duckdb").unlink()
    out = atoll_cli("runs")
    assert "gone" in out.stdout and "kept" in out.stdout  # both listed, as the library knows them
    assert ("1 of these 2 runs' directories no longer hold their archive.duckdb (moved or deleted); "
            "`atoll query --library` leaves them out") in out.stderr


def test_reading_commands_create_no_library_and_read_one_this_user_may_only_read(
        tmp_path, temporary_library, atoll_cli):
    for args in (["runs"], ["skills"], ["skills", "--retire", "sk-1"],
                 ["query", "--library", "SELECT count(*) AS n FROM runs; SELECT count(*) AS n FROM skill_efficacy"]):
        atoll_cli(*args, check=args[1:2] != ["--retire"])
    assert not temporary_library.parent.exists()  # a typo in ATOLL_LIBRARY left no file (and no folder) behind
    assert "there is no such file: a run creates it" in atoll_cli("runs").stderr
    _run(tmp_path, "kept", [-1.0], Library(temporary_library))
    folder = temporary_library.parent
    if os.geteuid() == 0:  # root writes whatever the modes say: a read-only mount (the suite runs in `unshare`)
        subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
    else:
        temporary_library.chmod(0o444)
        folder.chmod(0o555)
    try:
        assert "kept" in atoll_cli("runs").stdout
        assert atoll_cli("query", "--library", "SELECT run_id FROM runs", "--json").stdout.strip() == (
            '{"run_id": "kept"}')
        with pytest.raises(LibraryError) as err:
            Library(temporary_library).ensure()
        assert f"cannot write the library {temporary_library}" in str(err.value) and "delete" not in str(err.value)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(folder)], check=True)
        else:
            folder.chmod(0o755)
