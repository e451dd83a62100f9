"""The islands snapshot a run writes is rewritten only when search results were committed since the
last one: a slow search (minutes an evaluation) or a paused run does not rewrite the same islands
every few seconds, a resume still finds the islands of every committed result, and the snapshot rides
on one of the loop's commits instead of a transaction of its own."""
import pytest

import controller.loop
from controller.config import validate
from controller.loop import Cadence, Search
from controller.resume import load_islands
from evaluators.secrets import RunSecrets
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

CONFIG = validate({"domain": {"name": "inventory"}, "run": {"seed": 3}, "islands": {"count": 2},
                   "memory": {"enabled": False}})


def _pair(pid: str, island: int, score: float, parent: str = "seed") -> tuple[Candidate, EvalResult]:
    return (Candidate(pid, "r1", island, 1, (parent,), f"X = {score}\n", "embedded:perturb_const", 0.0),
            EvalResult(pid, "search", Status.OK, score=score, instance_scores=(score,)))


@pytest.fixture
def search(tmp_path, monkeypatch):
    written = []
    snapshot = controller.loop.islands_snapshot
    monkeypatch.setattr(controller.loop, "islands_snapshot",
                        lambda islands, seq: written.append(seq) or snapshot(islands, seq))
    archive = DuckDBArchive(tmp_path / "archive.duckdb")
    archive.create_run("r1", {})
    archive.record([(Candidate("seed", "r1", 0, 0, (), "X = 0.0\n", "seed", 0.0),
                     EvalResult("seed", "search", Status.OK, score=-1.0, instance_scores=(-1.0,)))])
    found = Search(CONFIG, archive, "r1", tmp_path, secrets=RunSecrets.fixed(0))
    yield found, written
    archive.close()


def test_a_snapshot_is_written_again_only_after_search_results_were_committed(search):
    search, written = search
    search.publish()  # the first one is written whatever came before
    assert len(written) == 1
    for _ in range(5):  # nothing finished: a slow evaluation, or a paused run
        search.publish()
    assert len(written) == 1
    search.events.append(("note", {"text": "not a result"}))
    search.heldout.append(EvalResult("seed", "heldout", Status.OK, score=-1.0, instance_scores=(-1.0,)))
    search.publish()  # committed, but no search result: the islands are as they were
    assert len(written) == 1
    assert search.archive.con.execute("SELECT count(*) FROM evaluations WHERE split = 'heldout'").fetchone()[0] == 1

    pair = _pair("c1", 0, -0.5)
    search.islands.add_result(0, _member(pair))
    search.results.append(pair)
    search.publish()  # a result in the same commit
    assert len(written) == 2
    pair = _pair("c2", 1, -0.25)
    search.islands.add_result(1, _member(pair))
    search.results.append(pair)
    search.commit()  # committed by the loop's plain commit, then the snapshot falls due
    search.publish()
    assert len(written) == 3
    search.publish()
    assert len(written) == 3

    # a resume finds every committed result in the islands: the snapshot replays nothing after it
    restored = load_islands(search.archive, "r1", CONFIG, search.done)
    assert restored.replayed == 0
    members = {m.program_id for island in restored.islands.islands for m in island.members()}
    assert {"seed", "c1", "c2"} <= members


def _member(pair):
    from islands.population import Member

    candidate, result = pair
    return Member(candidate.program_id, result.score, candidate.code, candidate.generation, result.instance_scores, ())


def test_the_snapshot_rides_on_a_commit_and_each_commit_is_one_transaction():
    cadence = Cadence(commit_every=1.0, snapshot_every=3.0, now=0.0)
    passes = {t / 4: cadence.due(t / 4) for t in range(1, 121)}  # the loop's passes, every 0.25 s for 30 s
    due = {t: what for t, what in passes.items() if what}
    assert list(due) == [float(t) for t in range(1, 31)]  # a transaction a second, no more
    assert [t for t, what in due.items() if what == "publish"] == [3.0 * k for k in range(1, 11)]
    # a loop that came back late: the commit is due at once, and the snapshot with it once its time passed
    late = Cadence(commit_every=1.0, snapshot_every=3.0, now=0.0)
    assert [late.due(t) for t in (0.5, 2.5, 3.6, 3.8, 7.0)] == [None, "commit", "publish", None, "publish"]
    # snapshots asked for more often than commits: every commit carries one
    eager = Cadence(commit_every=1.0, snapshot_every=0.5, now=0.0)
    assert [eager.due(t / 4) for t in range(1, 13)] == [None, None, None, "publish"] * 3
