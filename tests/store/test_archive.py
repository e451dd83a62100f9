"""Store contract: real DuckDB files, one transaction per batch, migrations, views."""
import errno
import os
import re
import shutil
import subprocess
import sys
import time

import duckdb
import pytest

from controller.backup import Away, Backups, stamp
from store.duckdb_archive import ArchiveDamaged, DuckDBArchive, migrations
from store.records import Candidate, EvalResult, Status
from tests.disks import small_disk


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


def test_a_batch_failing_inside_the_database_leaves_nothing_and_nothing_remembered(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    no_split = EvalResult("x", None, Status.OK, score=-0.5)  # NOT NULL fails after programs and lineage went in
    with pytest.raises(duckdb.ConstraintException):
        archive.write("r1", pairs=[(cand("y", ["a"]), ok("y", -0.5)), (cand("x", ["y"]), no_split)],
                      events=[("note", {"n": 1})], snapshot=b"islands")
    count = lambda table: archive.con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: E731
    assert (count("programs"), count("lineage"), count("evaluations"), count("events"), count("snapshots")) == \
        (1, 0, 1, 0, 0)
    archive.record([(cand("y", ["a"]), ok("y", -0.5)), (cand("x", ["y"]), ok("x", -0.6))])  # not "already stored"
    rows = archive.con.execute("SELECT program_id, seq, parent_score, best_so_far FROM programs ORDER BY seq").fetchall()
    assert rows == [("a", 1, None, -1.0), ("y", 2, -1.0, -0.5), ("x", 3, -0.5, -0.5)]
    assert archive.operator_stats("r1") == {"embedded:perturb_const": (2, 1)}
    assert archive.con.execute("SELECT child_seq, parent_seq FROM lineage ORDER BY child_seq").fetchall() == \
        [(2, 1), (3, 2)]


def test_evaluations_of_unknown_programs_are_refused(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    with pytest.raises(ValueError, match="not in the archive: ghost"):
        archive.record_evaluations([ok("ghost", -1.0, "heldout")], "r1")
    assert archive.con.execute("SELECT count(*) FROM evaluations").fetchone()[0] == 1


def test_a_new_search_score_for_a_stored_program_updates_what_depends_on_it(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.record([(cand("b", ["a"]), ok("b", -0.5)), (cand("c", ["b"]), ok("c", -0.7))])
    archive.record_evaluations([EvalResult("b", "search", Status.FAILED, error="rerun failed")], "r1")
    assert archive.evaluation("b", "search")["status"] == "FAILED"
    assert archive.con.execute("SELECT count(*) FROM evaluations WHERE program_id = 'b'").fetchone()[0] == 1
    running = archive.con.execute("SELECT program_id, search_status, best_so_far FROM programs ORDER BY seq").fetchall()
    assert running == [("a", "OK", -1.0), ("b", "FAILED", None), ("c", "OK", -0.7)]
    # b's attempt failed now; c is still judged against the -0.5 its parent had when c was recorded
    assert archive.operator_stats("r1") == {"embedded:perturb_const": (2, 0)}
    assert archive.best_program("r1")["program_id"] == "c"
    archive.record([(cand("d", ["b"]), ok("d", -0.9))])  # b is no OK parent any more: d improves on nothing
    assert archive.operator_stats("r1") == {"embedded:perturb_const": (3, 1)}


def test_heldout_scores_and_baselines_stay_apart(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.record_evaluations([ok("a", -1.1, "heldout")], "r1")
    archive.record([(cand("base", island=-1, gen=0, mutator="baseline:optimized"), ok("base", 5.0, "heldout"))])
    assert archive.evaluation("a", "heldout")["score"] == -1.1
    assert archive.best_program("r1", "heldout")["program_id"] == "a"
    assert [r["program_id"] for r in archive.programs_with_scores("r1", "heldout")] == ["a"]
    assert archive.count_evaluations("r1", "heldout") == 1


def test_best_per_island_steps_and_every_programs_running_best(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.record([(cand("b", ["a"]), ok("b", -0.5)), (cand("c", ["b"]), ok("c", -0.7))])
    archive.record([(cand("d", ["b"]), ok("d", -0.5)), (cand("e", ["d"], island=1), ok("e", -2.0))])
    rows = archive.con.execute("SELECT program_id, best_so_far FROM best_per_island ORDER BY seq").fetchall()
    assert rows == [("a", -1.0), ("b", -0.5), ("d", -0.5), ("e", -2.0)]  # c is no best; d ties b
    running = archive.con.execute("SELECT program_id, best_so_far FROM programs ORDER BY seq").fetchall()
    assert running == [("a", -1.0), ("b", -0.5), ("c", -0.5), ("d", -0.5), ("e", -2.0)]


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


def test_snapshot_blob(archive):
    archive.save_snapshot("r1", b"one")
    archive.save_snapshot("r1", b"two")
    assert archive.load_snapshot("r1") == b"two" and archive.load_snapshot("r2") is None


def test_a_snapshot_made_inside_the_commit_sees_the_batchs_last_program(archive):
    archive.record([(cand("a", mutator="seed", gen=0), ok("a", -1.0))])
    archive.write("r1", pairs=[(cand("b", ["a"]), ok("b", -0.5)), (cand("c", ["b"]), ok("c", -0.7))],
                  snapshot=lambda seq: f"islands up to {seq}".encode())
    assert archive.load_snapshot("r1") == b"islands up to 3"
    archive.write("r1", events=[("note", {"n": 1})], snapshot=lambda seq: f"islands up to {seq}".encode())
    assert archive.load_snapshot("r1") == b"islands up to 3" and archive.last_seq() == 3


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
        (0, "a", -1.0), (0, "b", -0.8), (1, "c", -0.9)]
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


def test_known_hashes_include_the_text_proposed_before_tuning(archive):
    tuned = EvalResult("t", "search", Status.OK, score=-0.9, metrics={"proposed_hash": "feedfacefeedface"})
    archive.record([(cand("t"), tuned)])
    assert {"feedfacefeedface", cand("t").code_hash} <= archive.known_hashes("r1")


def test_views_agree_with_their_definitions_on_a_random_archive(archive, monkeypatch):
    """Totals folded every few programs, running bests and ancestry, against a recount in Python."""
    import random

    import store.writer

    monkeypatch.setattr(store.writer, "FOLD_EVERY", 7)
    rng = random.Random(5)
    archive.record([(cand("p0", mutator="seed", gen=0), ok("p0", -1.0))])
    ids, ok_score, batch = ["p0"], {"p0": -1.0}, []
    expected, best, parents_of = {}, {"p0": -1.0, 0: -1.0}, {"p0": []}
    for i in range(1, 120):
        pid, parents = f"p{i}", rng.sample(ids[-12:], k=min(len(ids), rng.choice([1, 1, 2])))
        island, mutator = rng.randrange(3), rng.choice(["embedded:a", "embedded:b"])
        score = round(rng.gauss(-1, 0.3), 3)
        result = ok(pid, score) if rng.random() < 0.8 else EvalResult(pid, "search", Status.FAILED, error="x")
        batch.append((cand(pid, parents, island=island, mutator=mutator), result))
        known = [ok_score[p] for p in parents if p in ok_score]
        parent = max(known) if known else None
        tally = expected.setdefault(mutator, [0, 0])
        tally[0] += 1
        if result.status == Status.OK:
            tally[1] += parent is None or score > parent
            ok_score[pid] = score
            best[pid] = max(score, best.get(island, score))
            best[island] = best[pid]
        ids.append(pid)
        parents_of[pid] = parents
        if len(batch) == rng.randrange(1, 6) or i == 119:
            archive.record(batch)
            batch = []
    assert archive.operator_stats("r1") == {m: tuple(v) for m, v in expected.items()}
    assert archive.con.execute("SELECT seq FROM mutator_counts_seq").fetchone()[0] >= 100  # folded on the way
    running = dict(archive.con.execute("SELECT program_id, best_so_far FROM programs").fetchall())
    assert running == {pid: best.get(pid) for pid in ids}
    for pid in rng.sample(ids, 10):
        rows = archive.con.execute(f"SELECT program_id, depth FROM lineage_of('{pid}')").fetchall()
        assert dict(rows) == _shortest(pid, parents_of)


def _shortest(pid, parents_of):
    depth, frontier, d = {pid: 0}, [pid], 0
    while frontier:
        d += 1
        frontier = [p for child in frontier for p in parents_of[child] if p not in depth]
        for p in frontier:
            depth.setdefault(p, d)
    return depth


def test_an_archive_from_before_version_8_is_migrated_with_its_rows(tmp_path):
    path = tmp_path / "archive.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
    for version, name, sql in migrations()[:2]:
        con.execute(sql)
        con.execute("INSERT INTO schema_version VALUES (?, ?, now())", [version, name])
    con.execute("INSERT INTO runs VALUES ('r1', 't', 'completed', now(), now(), '{}', '')")
    old = [("a", 0, [], "seed", 1, "OK", -1.0), ("b", 0, ["a"], "embedded:x", 2, "OK", -0.5),
           ("c", 1, ["b"], "embedded:x", 3, "FAILED", None), ("d", 0, ["b", "a"], "embedded:y", 4, "OK", -0.7)]
    for pid, island, parents, mutator, seq, status, score in old:
        con.execute("INSERT INTO programs VALUES (?, 'r1', ?, 1, ?, ?, ?, ?, 0.0, ?)",
                    [pid, island, parents, f"code {pid}", cand(pid).code_hash, mutator, seq])
        for parent in parents:
            con.execute("INSERT INTO lineage VALUES (?, ?, 'r1')", [pid, parent])
        con.execute("INSERT INTO evaluations VALUES (?, 'r1', 'search', ?, ?, ?, [], [], NULL, 0.1, 0.0)",
                    [pid, status, score, '{"proposed_hash": "00000000000000aa"}' if pid == "d" else "{}"])
    con.close()
    with DuckDBArchive(path) as archive:
        sql = lambda q: archive.con.execute(q).fetchall()  # noqa: E731
        assert sql("SELECT program_id, search_status, parent_score, best_so_far FROM programs ORDER BY seq") == [
            ("a", "OK", None, -1.0), ("b", "OK", -1.0, -0.5), ("c", "FAILED", -0.5, None), ("d", "OK", -0.5, -0.5)]
        assert sql("SELECT child_id, child_seq, parent_seq FROM lineage ORDER BY child_seq, parent_seq") == [
            ("b", 2, 1), ("c", 3, 2), ("d", 4, 1), ("d", 4, 2)]
        assert sql("SELECT program_id, depth FROM lineage_of('d')") == [("d", 0), ("a", 1), ("b", 1)]
        assert archive.operator_stats("r1") == {"embedded:x": (2, 1), "embedded:y": (1, 0)}
        assert sql("SELECT program_id FROM best_per_island ORDER BY seq") == [("a",), ("b",)]
        assert "00000000000000aa" in archive.known_hashes("r1")
        archive.record([(cand("e", ["d"]), ok("e", -0.2)), (cand("a", code="again"), ok("a", -3.0))])
        assert sql("SELECT program_id, seq, parent_score, best_so_far FROM programs WHERE program_id IN ('a', 'e') "
                   "ORDER BY seq") == [("a", 1, None, -3.0), ("e", 5, -0.7, -0.2)]  # a's running best follows its new score
        assert archive.evaluation("a", "search")["score"] == -3.0  # the later measurement replaced the first


def test_cut_short_finds_a_truncated_file_and_never_one_duckdb_shortened_itself(tmp_path):
    """DuckDB shortens its file when the last blocks fall free, yet still counts them in total_blocks:
    a healthy archive must never read as cut short (its resume would be refused)."""
    import duckdb

    from store.readonly import cut_short

    path = tmp_path / "a.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE keep AS SELECT range AS i, random()::VARCHAR || repeat('x', 20) AS s "
                    "FROM range(100000)")
        con.execute("CHECKPOINT")
        con.execute("CREATE TABLE later AS SELECT range AS i, random()::VARCHAR AS s FROM range(300000)")
        con.execute("CHECKPOINT")
        con.execute("DROP TABLE later")
        con.execute("CHECKPOINT")
    with duckdb.connect(str(path), read_only=True) as con:
        total, used, block = con.execute("SELECT total_blocks, used_blocks, block_size "
                                         "FROM pragma_database_size()").fetchone()
        size = path.stat().st_size
        assert total * block > size >= used * block  # the blocks past the end are counted, and free
        assert cut_short(con, path) is None
    path.write_bytes(path.read_bytes()[:size // 2])
    with duckdb.connect(str(path), read_only=True) as con:
        assert "it was cut short" in cut_short(con, path)


def _search_ids(path) -> set[str]:
    with DuckDBArchive(path, read_only=True) as copy:
        return {pid for (pid,) in copy.con.execute("SELECT program_id FROM evaluations WHERE split = 'search'").fetchall()}


def _made(backups: Backups, evaluations: int) -> tuple[str, dict]:
    """A backup, its copy in controller.backup_dir awaited: the backup's event, the copy's data in it."""
    kind, data = backups.make(evaluations)
    copied = backups.close()  # the copy is made in a thread of its own
    assert [k for k, _ in copied] == ([] if "away_error" in data else ["backup-copied"]), (data, copied)
    return kind, {**data, **(copied[0][1] if copied else {})}


def test_a_backup_flushes_its_file_then_the_rename_into_place(archive, tmp_path, monkeypatch):
    """A power loss after the copy keeps one whole backup: the copy's bytes reach the disk before
    the rename, and the folder's rename reaches it before the copy counts as made."""
    archive.record([(cand(f"a{i}"), ok(f"a{i}", -1.0)) for i in range(3)])
    (tmp_path / "bk").mkdir()
    target = tmp_path / "bk" / "archive.backup.duckdb"
    flushed, real_fsync, real_replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (flushed.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))
    monkeypatch.setattr(os, "replace", lambda a, b: (flushed.append(("rename", str(b))), real_replace(a, b)))
    archive.backup(target)
    assert flushed[-3:] == [str(target) + ".tmp", ("rename", str(target)), str(target.parent)], flushed
    with DuckDBArchive(target, read_only=True) as copy:
        assert copy.con.execute("SELECT count(*) FROM programs").fetchone() == (3,)


def test_the_backups_copy_in_backup_dir_never_overwrites_another_runs_file(tmp_path):
    """controller.backup_dir gets each backup as RUN_ID.duckdb. A file of that name from another run
    (same id, another start) or no archive at all is left as it is, said once; this run's own copy is
    replaced by each newer backup."""
    away, run_dir = tmp_path / "away", tmp_path / "run"
    away.mkdir()
    run_dir.mkdir()
    with DuckDBArchive(tmp_path / "other.duckdb") as other:  # a run of the same id, started another day
        other.create_run("try-231500", {})
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("try-231500", {})
        archive.record([(cand(f"a{i}"), ok(f"a{i}", -1.0)) for i in range(3)])
        started = archive.get_run("try-231500")["started_at"]
        notices: list[str] = []
        backups = Backups(60.0, archive, run_dir, notices, now=0.0, away=Away(str(away), "try-231500", started))
        target = away / "try-231500.duckdb"
        for foreign in (tmp_path / "other.duckdb", None):
            if foreign is None:
                target.write_bytes(b"not an archive")
            else:
                shutil.copyfile(foreign, target)
            kept = target.read_bytes()
            for _ in range(2):
                kind, data = _made(backups, 3)
                assert kind == "archive-backed-up" and "away" not in data and target.read_bytes() == kept
            assert "is left as it is" in data["away_error"], data
            assert len(notices) == 1 and "could not be written" in notices[0] and str(target) in notices[0], notices
            notices.clear()
            backups.away.failed = False
        target.unlink()
        kind, data = _made(backups, 3)
        assert data["away"] == str(target) and _search_ids(target) == {"a0", "a1", "a2"}
        archive.record([(cand("b"), ok("b", -2.0))])
        kind, data = _made(backups, 4)  # its own copy is replaced by the newer backup
        assert data["away"] == str(target) and _search_ids(target) == {"a0", "a1", "a2", "b"} and not notices
        assert not list(away.glob("*.tmp"))


def test_a_copy_in_backup_dir_that_another_driver_resumed_from_is_left_to_it_and_said(tmp_path):
    """This machine was only unreachable: meanwhile the run was resumed elsewhere from its copy, whose
    newest session (`started` event) is another driver's, begun after this one. This driver stops
    writing the copy (the other's progress would be overwritten) and says what to do, once."""
    away, run_dir = tmp_path / "away", tmp_path / "run"
    away.mkdir()
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        archive.write("r1", events=[("started", {"host": "here", "pid": 11})])
        archive.record([(cand("a"), ok("a", -1.0))])
        started = archive.get_run("r1")["started_at"]
        notices: list[str] = []
        since = time.time()
        mine = Backups(60.0, archive, run_dir, notices, now=0.0, away=Away(str(away), "r1", started, ("here", 11), since))
        assert "away" in _made(mine, 1)[1] and not notices  # its own copy, the latest session its own
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        shutil.copyfile(away / "r1.duckdb", elsewhere / "archive.duckdb")  # resumed from the copy ...
        with DuckDBArchive(elsewhere / "archive.duckdb") as other:  # ... by another driver, which wrote its own
            other.write("r1", events=[("started", {"host": "there", "pid": 22})])
            other.record([(cand("z"), ok("z", -0.5))])
        shutil.copyfile(elsewhere / "archive.duckdb", away / "r1.duckdb")
        kept = (away / "r1.duckdb").read_bytes()
        for _ in range(2):
            kind, data = _made(mine, 1)
            assert kind == "archive-backed-up" and "away" not in data and (away / "r1.duckdb").read_bytes() == kept
        assert data["away_error"] == "the run was resumed elsewhere from this copy"
        assert len(notices) == 1 and notices[0].startswith(
            "atoll: this run was resumed from its copy in controller.backup_dir on there (pid 22) at "), notices
        assert "after this driver began; this driver no longer writes " in notices[0] and "stop this one" in notices[0]
        # a driver of this run that began after that session (a resume here, later) writes it again
        later = Away(str(away), "r1", started, ("here", 33), time.time())
        assert later.copy(run_dir / "archive.backup.duckdb", 60.0, notices)["away"] == str(away / "r1.duckdb")
        assert _search_ids(away / "r1.duckdb") == {"a"}


def test_a_hung_backup_dir_holds_up_its_copy_and_never_the_backups_or_the_runs_end(tmp_path, capsys):
    """A network mount whose server is gone blocks whatever opens a file on it. Here the copy's
    target is a FIFO, whose open blocks the same way: the backup itself is made at once, no second
    copy is begun while the first hangs (said once), the run's end waits EXIT_WAIT_S at most and
    says so; when the mount answers again, the copy ends with its reason and copies resume."""
    away, run_dir = tmp_path / "away", tmp_path / "run"
    away.mkdir()
    run_dir.mkdir()
    hung = away / "r1.duckdb"
    os.mkfifo(hung)
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        archive.record([(cand("a"), ok("a", -1.0))])
        notices: list[str] = []
        # a 5 s interval, and the copy made that old by hand: with 0.5 s and a sleep, the second backup
        # itself now and then took longer than the interval on a busy machine, and the stall was said early
        backups = Backups(5.0, archive, run_dir, notices, now=0.0,
                          away=Away(str(away), "r1", archive.get_run("r1")["started_at"]))
        began = time.monotonic()
        kind, data = backups.make(1)  # the copy is begun, and hangs
        assert kind == "archive-backed-up" and set(data) == {"bytes", "seconds", "search_evaluations"}, data
        assert _search_ids(run_dir / "archive.backup.duckdb") == {"a"}
        archive.record([(cand("b"), ok("b", -1.0))])
        kind, data = backups.make(2)  # at once: a copy that has not had its interval yet is not said
        assert data["away_error"].startswith("still being made (begun at ") and not notices, (data, notices)
        backups.away._begun -= 5.0  # the copy has hung for the interval
        for _ in range(2):
            kind, data = backups.make(2)
            assert data["away_error"].startswith("still being made (begun at "), data
        assert _search_ids(run_dir / "archive.backup.duckdb") == {"a", "b"}  # the backups go on
        assert time.monotonic() - began < 10
        assert len(notices) == 1 and "has not finished (a slow or hung mount?); the run goes on" in notices[0], notices
        assert backups.copied() == [] and backups.away.close(notices, wait_s=0.2) == [("backup-copied", {
            "away_error": f"left unfinished at the run's end (begun at {stamp(backups.away._begun)})"})]
        err = capsys.readouterr().err
        assert "atoll: waiting up to 0.2 s for the backup's copy in controller.backup_dir" in err, err
        assert "is left unfinished (a slow or hung mount?); the last whole copy there " in err, err
        notices.clear()
        answer = os.open(hung, os.O_WRONLY | os.O_NONBLOCK)  # the mount answers: the open returns ...
        os.unlink(hung)  # ... on what is no archive of this run
        os.close(answer)
        copied = backups.close()
        assert [kind for kind, _ in copied] == ["backup-copied"], copied
        assert "is not this run's archive" in copied[0][1]["away_error"] and copied[0][1]["search_evaluations"] == 1
        assert len(notices) == 2 and " ended after " in notices[0] and "could not be written" in notices[1], notices
        kind, data = _made(backups, 2)  # the next backup is copied as before
        assert data["away"] == str(away / "r1.duckdb") and _search_ids(away / "r1.duckdb") == {"a", "b"}


def test_backups_are_due_every_interval_across_resumes_not_from_each_drivers_start(archive, tmp_path):
    """A run whose every session is shorter than controller.backup_every_s (a preemptible machine, a
    driver killed again and again) is backed up too: the interval counts from the last backup, or from
    the run's first session when it has none (it counted from each driver's start: no backup, ever)."""
    archive.record([(cand("a"), ok("a", -1.0))])
    hour, now = 3600.0, time.time()
    fresh = Backups(hour, archive, tmp_path, [], now=0.0)  # a new run
    assert not fresh.due(hour - 1) and fresh.due(hour)
    began_earlier = Backups(hour, archive, tmp_path, [], now=0.0, since=now - 600)  # its first session, 10 min ago
    assert not began_earlier.due(hour - 610) and began_earlier.due(hour - 590)
    assert Backups(hour, archive, tmp_path, [], now=0.0, since=now - 2 * hour).due(0.0)  # never backed up in 2 h
    backup = tmp_path / "archive.backup.duckdb"
    assert Backups(hour, archive, tmp_path, [], now=0.0, since=now - 2 * hour).make(1)[0] == "archive-backed-up"
    os.utime(backup, (now - 600, now - 600))  # the last backup, 10 min ago: it counts, not the run's start
    last = Backups(hour, archive, tmp_path, [], now=0.0, since=now - 2 * hour)
    assert not last.due(hour - 610) and last.due(hour - 590)
    os.utime(backup, (now - 2 * hour, now - 2 * hour))
    assert Backups(hour, archive, tmp_path, [], now=0.0).due(0.0)
    assert Backups(0.0, archive, tmp_path, [], now=0.0, since=now - 2 * hour).due(1e9) is False  # off


def test_a_backup_holds_what_was_committed_while_a_live_read_is_open_and_a_full_disk_keeps_the_last(tmp_path):
    """The backup (controller.backup) is a whole archive of the commits so far, the log folded in;
    a copy that cannot be written (a real full tmpfs) leaves the last backup as it was, and no part file."""
    with small_disk(tmp_path / "disk", "3m") as disk:
        target = disk / "archive.backup.duckdb"
        with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
            archive.create_run("r1", {})
            archive.record([(cand(f"a{i}"), ok(f"a{i}", -1.0)) for i in range(20)])
            reader = archive.cursor()  # a live query in another connection, its transaction open
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM programs").fetchone() == (20,)
            size = archive.backup(target)
            reader.execute("COMMIT")
            # the writer still holds its archive alone: a copy made in its own process would have
            # dropped DuckDB's lock (closing any descriptor of a file drops the process's locks on it)
            opener = "import duckdb, sys; duckdb.connect(sys.argv[1], read_only=True)"
            other = subprocess.run([sys.executable, "-c", opener, str(tmp_path / "archive.duckdb")],
                                   capture_output=True, text=True, check=False)
            assert other.returncode != 0 and "Could not set lock on file" in other.stderr, other.stderr
            assert size == target.stat().st_size
            # programs that do not compress: the archive outgrows the disk's 3 MiB
            archive.record([(cand(f"b{i}", code=f"x = {os.urandom(2000).hex()!r}\n"), ok(f"b{i}", -2.0))
                            for i in range(2000)])
            with pytest.raises(OSError) as failed:
                archive.backup(target)
            assert failed.value.errno == errno.ENOSPC
            archive.record([(cand("c"), ok("c", -3.0))])  # the archive goes on as before
            assert len(_search_ids(target)) == 20 and not list(disk.glob("*.tmp"))
            # the run loop's side: said once while it fails, the run goes on, and said when it works again
            notices: list[str] = []
            (disk / "archive.backup.duckdb.tmp").write_bytes(b"\0" * 1000)  # a killed driver's unfinished copy
            backups = Backups(60.0, archive, disk, notices, now=0.0)
            assert not (disk / "archive.backup.duckdb.tmp").exists()
            assert backups.due(60.0)  # 60 s after the backup there was made (seconds ago)
            assert [backups.make(5)[0], backups.make(5)[0]] == ["backup-failed", "backup-failed"]
            assert len(notices) == 1 and "the archive's backup could not be written" in notices[0]
            # refused before the copy begins, leaving the disk room for the run's own commits
            assert re.search(r"\(.*/archive.backup.duckdb: \d+ MiB free, and a copy needs about \d+ MiB \(64 MiB "
                             r"of it left free for the run's own commits\)\)", notices[0]), notices[0]
            assert "the last backup stays" in notices[0] and not list(disk.glob("*.tmp")), notices[0]
            subprocess.run(["mount", "-o", "remount,size=128m", str(disk)], check=True)
            kind, data = backups.make(2021)
            assert kind == "archive-backed-up" and data["search_evaluations"] == 2021
            assert data["bytes"] == target.stat().st_size and len(_search_ids(target)) == 2021
            assert notices[1] == f"atoll: the archive's backup is written again ({target})"
        assert _search_ids(tmp_path / "archive.duckdb") == {f"a{i}" for i in range(20)} | {
            f"b{i}" for i in range(2000)} | {"c"}
        # a disk error in the archive's file: the copy does not read whole, and the last backup stays
        damaged = tmp_path / "damaged" / "archive.duckdb"
        damaged.parent.mkdir()
        shutil.copyfile(tmp_path / "archive.duckdb", damaged)
        with open(damaged, "r+b") as f:  # the middle of each block of 256 KiB in the file's second half
            for block in range(3 * 4096, damaged.stat().st_size - 2**18, 2**18):
                if block > damaged.stat().st_size // 2:
                    f.seek(block + 2**17)
                    f.write(os.urandom(4096))
        before = target.read_bytes()
        with DuckDBArchive(damaged) as archive:
            with pytest.raises(ArchiveDamaged, match=re.escape(f"{damaged}, copied, does not read whole: Corrupt "
                                                                  "database file")):
                archive.backup(target)
            assert target.read_bytes() == before and not list(disk.glob("*.tmp"))
            backups = Backups(60.0, archive, disk, notices, now=0.0)
            assert backups.make(2021)[0] == "backup-failed"
        assert "atoll: the archive reads as damaged (" in notices[2], notices[2]
        assert f"the last backup ({target}, of " in notices[2] and "resume with --from-backup" in notices[2]
