"""Store contract: real DuckDB files, one transaction per batch, migrations, views."""
import time

import duckdb
import pytest

from store.duckdb_archive import DuckDBArchive, migrations
from store.query import QueryError, run_query
from store.records import Candidate, EvalResult, Status


def cand(pid, parents=(), island=0, gen=1, mutator="embedded:perturb_const", run="r1", code=None):
    return Candidate(pid, run, island, gen, tuple(parents), code or f"def policy(s, p):\n    return {pid!r}",
                     mutator, time.time())


def ok(pid, score, split="search"):
    return EvalResult(pid, split, Status.OK, score=score, metrics={"cost": -score, "bad": float("nan")},
                      instance_scores=(score, score), descriptors=(0.5, 1.0), duration_s=0.1)


@pytest.fixture()
def archive(tmp_path):
    with DuckDBArchive(tmp_path / "archive.duckdb") as a:
        a.create_run("r1", {"run": {"name": "t"}, "seed": 3}, "[run]\nname='t'\n")
        yield a


def test_runs_round_trip(archive):
    assert archive.latest_run_id() == "r1"
    assert archive.get_run("r1")["config"] == {"run": {"name": "t"}, "seed": 3}
    archive.set_run_status("r1", "completed", ended=True)
    run = archive.get_run("r1")
    assert run["status"] == "completed" and run["ended_at"] is not None
    assert archive.get_run("nope") is None


def test_record_keeps_order_scores_and_lineage(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.record([(cand("b", ["a"]), ok("b", -0.9)),
                    (cand("c", ["a"], island=1), EvalResult("c", "search", Status.TIMEOUT, error="too slow"))])
    archive.record([(cand("d", ["b", "c"], mutator="embedded:crossover"), ok("d", -0.95))])
    rows = archive.programs_with_scores("r1")
    assert [r["program_id"] for r in rows] == ["a", "b", "c", "d"]
    assert rows[2]["status"] == "TIMEOUT" and rows[2]["score"] is None
    assert rows[1]["instance_scores"] == (-0.9, -0.9) and rows[1]["descriptors"] == (0.5, 1.0)
    assert archive.count_evaluations("r1", "search") == 4
    assert archive.best_program("r1", "search")["program_id"] == "b"
    assert archive.evaluation("b", "search")["metrics"] == {"cost": 0.9, "bad": None}
    assert archive.evaluation("b", "heldout") is None
    assert len(archive.known_hashes("r1")) == 4
    assert archive.operator_stats("r1") == {"embedded:perturb_const": (2, 1), "embedded:crossover": (1, 0)}
    depth = archive.con.execute("SELECT program_id, depth FROM lineage_of('d') ORDER BY depth, program_id").fetchall()
    assert depth == [("d", 0), ("b", 1), ("c", 1), ("a", 2)]


def test_a_failing_batch_leaves_nothing(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    bad = EvalResult("x", "search", "not a status", score=-1.0)  # fails after the programs are inserted
    with pytest.raises(Exception):
        archive.record([(cand("y", ["a"]), ok("y", -0.5)), (cand("x", ["a"]), bad)])
    assert [r["program_id"] for r in archive.programs_with_scores("r1")] == ["a"]
    assert archive.con.execute("SELECT count(*) FROM lineage").fetchone()[0] == 0


def test_heldout_scores_and_baselines_stay_apart(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.record_evaluations([ok("a", -1.1, "heldout")], "r1")
    archive.record([(cand("base", island=-1, gen=0, mutator="baseline:optimized"), ok("base", 5.0, "heldout"))])
    assert archive.evaluation("a", "heldout")["score"] == -1.1
    assert archive.best_program("r1", "heldout")["program_id"] == "a"
    assert [r["program_id"] for r in archive.programs_with_scores("r1", "heldout")] == ["a"]
    assert archive.count_evaluations("r1", "heldout") == 1


def test_best_per_island_is_running_best(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.record([(cand("b", ["a"]), ok("b", -0.5)), (cand("c", ["b"]), ok("c", -0.7))])
    rows = archive.con.execute("SELECT program_id, best_so_far FROM best_per_island ORDER BY seq").fetchall()
    assert rows == [("a", -1.0), ("b", -0.5), ("c", -0.5)]


def test_migrations_are_recorded_and_idempotent(tmp_path):
    path = tmp_path / "archive.duckdb"
    with DuckDBArchive(path) as a:
        assert a.schema_versions() == [v for v, _, _ in migrations()]
        assert a.migrate() == []
    with DuckDBArchive(path) as a:
        assert a.schema_versions() == [v for v, _, _ in migrations()]
    with DuckDBArchive(path, read_only=True) as a:
        with pytest.raises(duckdb.Error):
            a.con.execute("DELETE FROM runs")


def test_snapshot_blob_and_live_copy(archive, tmp_path):
    archive.save_snapshot("r1", b"one")
    archive.save_snapshot("r1", b"two")
    assert archive.load_snapshot("r1") == b"two" and archive.load_snapshot("r2") is None
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.publish_snapshot(tmp_path / "archive.snapshot.duckdb")
    cols, rows, note = run_query(tmp_path, "SELECT count(*) AS n FROM programs")
    assert rows == [(1,)] and "live" in note
    with pytest.raises(QueryError, match="read-only"):
        run_query(tmp_path, "DELETE FROM programs")


def test_publishing_keeps_the_writers_lock(archive, tmp_path):
    import subprocess
    import sys

    archive.publish_snapshot(tmp_path / "archive.snapshot.duckdb")
    probe = subprocess.run([sys.executable, "-c", "import duckdb, sys; duckdb.connect(sys.argv[1], read_only=True)",
                            str(archive.path)], capture_output=True, text=True)
    assert probe.returncode != 0 and "lock" in probe.stderr


def test_recording_a_stored_program_again_keeps_it_once(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.record([(cand("b", ["a", "a"]), ok("b", -0.9))])
    archive.record([(cand("b", ["a"], code="other code"), ok("b", -0.8)), (cand("c", ["b"]), ok("c", -0.7))])
    rows = archive.programs_with_scores("r1")
    assert [(r["program_id"], r["score"]) for r in rows] == [("a", -1.0), ("b", -0.8), ("c", -0.7)]
    assert "other code" not in {r["code"] for r in rows}
    seqs = archive.con.execute("SELECT program_id, seq FROM programs ORDER BY seq").fetchall()
    assert [pid for pid, _ in seqs] == ["a", "b", "c"] and len({s for _, s in seqs}) == 3
    assert archive.con.execute("SELECT count(*) FROM lineage WHERE child_id = 'b'").fetchone()[0] == 1


def test_views_on_a_small_lineage(archive):
    # a (seed) -> b -> c; d has parents c and a (a short cut); e failed; base is a baseline
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.record([(cand("b", ["a"]), ok("b", -0.8)), (cand("c", ["b"], island=1), ok("c", -0.9))])
    archive.record([(cand("d", ["c", "a"], mutator="embedded:crossover"), ok("d", -0.85)),
                    (cand("e", ["b"]), EvalResult("e", "search", Status.FAILED, error="boom"))])
    archive.record([(cand("base", island=-1, gen=0, mutator="baseline:optimized"), ok("base", 0.0, "heldout"))])
    archive.record_evaluations([ok("b", -0.75, "heldout")], "r1")
    sql = lambda q: archive.con.execute(q).fetchall()  # noqa: E731
    assert sql("SELECT depth, program_id FROM lineage_of('d')") == [(0, "d"), (1, "a"), (1, "c"), (2, "b")]
    assert sql("SELECT program_id, depth FROM lineage_of('a')") == [("a", 0)]
    assert sql("SELECT mutator, attempts, ok, improvements, success_rate FROM mutator_success ORDER BY mutator") == [
        ("embedded:crossover", 1, 1, 1, 1.0), ("embedded:perturb_const", 3, 2, 1, 0.3333)]
    assert archive.operator_stats("r1") == {"embedded:crossover": (1, 1), "embedded:perturb_const": (3, 1)}
    assert sql("SELECT island, program_id, best_so_far FROM best_per_island ORDER BY island, seq") == [
        (0, "a", -1.0), (0, "b", -0.8), (0, "d", -0.8), (1, "c", -0.9)]
    assert sql("SELECT program_id, search_status, search_score, heldout_score FROM program_scores "
               "WHERE program_id IN ('b', 'e', 'base') ORDER BY seq") == [
        ("b", "OK", -0.8, -0.75), ("e", "FAILED", None, None), ("base", None, None, 0.0)]


def test_read_only_opens_apply_no_migration(tmp_path):
    path = tmp_path / "archive.duckdb"
    with DuckDBArchive(path) as a:  # make it look like an archive from before migration 2
        a.con.execute("DELETE FROM schema_version WHERE version = 2")
        a.con.execute("DROP VIEW mutator_success")
    every = [v for v, _, _ in migrations()]
    with DuckDBArchive(path, read_only=True) as a:
        assert a.schema_versions() == [v for v in every if v != 2]
        with pytest.raises(duckdb.CatalogException):
            a.operator_stats("r1")
    with DuckDBArchive(path) as a:
        assert a.schema_versions() == every and a.operator_stats("r1") == {}


def test_another_process_reads_the_snapshot_while_the_writer_holds_the_archive(archive, tmp_path):
    import subprocess
    import sys

    snapshot = tmp_path / "archive.snapshot.duckdb"
    count = [sys.executable, "-c", "import duckdb, sys; "
             "print(duckdb.connect(sys.argv[1], read_only=True).execute('SELECT count(*) FROM programs').fetchone()[0])"]
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.publish_snapshot(snapshot)
    assert subprocess.run(count + [str(snapshot)], capture_output=True, text=True).stdout.strip() == "1"
    archive.record([(cand("b", ["a"]), ok("b", -0.9))])
    archive.publish_snapshot(snapshot)
    assert subprocess.run(count + [str(snapshot)], capture_output=True, text=True).stdout.strip() == "2"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    archive.record([(cand("c", ["b"]), ok("c", -0.8))])  # still the writer
    assert len(archive.programs_with_scores("r1")) == 3


def test_known_hashes_include_the_text_proposed_before_tuning(archive):
    tuned = EvalResult("t", "search", Status.OK, score=-0.9, metrics={"proposed_hash": "feedfacefeedface"})
    archive.record([(cand("t"), tuned)])
    assert {"feedfacefeedface", cand("t").code_hash} <= archive.known_hashes("r1")
