"""Resume: the islands snapshot plus a replay of the rows after it give the islands of a full replay."""
import msgpack
import numpy as np
import pytest

from controller.config import validate
from controller.resume import expand_seeds, islands_snapshot, load_islands
from islands.archipelago import Archipelago
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

CONFIG = validate({"domain": {"name": "inventory"}, "run": {"seed": 7},
                   "islands": {"count": 3, "migration": "random", "migrate_every": 2, "reset_every": 5,
                               "max_members_per_niche": 2}})


def _search(archive, n=240, batch=16):
    """A toy run through the real write path: children of island members, some failing."""
    rng = np.random.default_rng(1)
    islands = Archipelago(CONFIG.islands, 3)
    seed = (Candidate("seed", "r1", 0, 0, (), "s = 0", "seed", 0.0),
            EvalResult("seed", "search", Status.OK, score=0.0, instance_scores=(0.0, 0.0)))
    archive.record([seed])
    for i in range(CONFIG.islands.count):
        islands.add_result(i, _member(seed))
    pending = []
    for step in range(n):
        island = islands.pick_island()
        parent, _ = islands.next_parent(island)
        score = parent.score + float(rng.normal())
        status = Status.OK if rng.random() > 0.2 else Status.FAILED
        child = (Candidate(f"c{step}", "r1", island, islands.islands[island].generation + 1, (parent.program_id,),
                           parent.code + "+", "embedded:perturb_const", 0.0),
                 EvalResult(f"c{step}", "search", status, score=score if status == Status.OK else None,
                            instance_scores=(round(score, 1), float(step % 3)) if status == Status.OK else ()))
        if status == Status.OK:
            islands.add_result(island, _member(child))
        islands.on_generation(island)
        pending.append(child)
        if len(pending) == batch:
            archive.record(pending)
            pending = []
    archive.record(pending)


def _member(pair):
    from islands.population import Member

    candidate, result = pair
    return Member(candidate.program_id, result.score, candidate.code, candidate.generation, result.instance_scores, ())


def _rows(archive, after=0):
    return list(expand_seeds(archive.search_rows("r1", after_seq=after), CONFIG.islands.count))


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    with DuckDBArchive(tmp_path_factory.mktemp("run") / "archive.duckdb") as a:
        a.create_run("r1", {})
        _search(a)
        yield a


@pytest.mark.parametrize("cut", [1, 2, 60, 137, 241])
def test_snapshot_plus_tail_replay_equals_a_full_replay(archive, cut):
    rows = _rows(archive)
    seqs = [r["seq"] for r in rows]
    full = Archipelago(CONFIG.islands, 11).replay(rows)
    upto = sorted(set(seqs))[cut - 1]
    prefix = Archipelago(CONFIG.islands, 11).replay(r for r in rows if r["seq"] <= upto)
    archive.save_snapshot("r1", islands_snapshot(prefix, upto))
    restored = load_islands(archive, "r1", CONFIG, done=241)
    assert restored.snapshot_seq == upto and restored.replayed == len(set(seqs)) - cut
    assert restored.islands.to_msgpack() == full.to_msgpack()  # members, niches, counters and generator


def test_without_a_snapshot_every_row_is_replayed_from_a_fresh_generator(archive):
    archive.con.execute("DELETE FROM snapshots")
    restored = load_islands(archive, "r1", CONFIG, done=241)
    assert restored.snapshot_seq is None and restored.replayed == 241
    assert restored.islands.to_msgpack() == Archipelago(CONFIG.islands, 7 + 241).replay(_rows(archive)).to_msgpack()


def test_an_old_snapshot_counts_only_after_a_clean_stop(archive):
    islands = Archipelago(CONFIG.islands, 5).replay(_rows(archive))
    old = msgpack.packb({"rows": 241, "islands": islands.to_msgpack()})
    archive.save_snapshot("r1", old)
    assert load_islands(archive, "r1", CONFIG, done=241).islands.to_msgpack() == islands.to_msgpack()
    stale = load_islands(archive, "r1", CONFIG, done=242)  # a crash after it: replay everything
    assert stale.snapshot_seq is None and stale.replayed == 241


def test_a_snapshot_leaves_the_code_to_the_archive_and_older_snapshots_with_code_still_load(archive):
    rows = _rows(archive)
    upto = sorted({r["seq"] for r in rows})[99]
    prefix = Archipelago(CONFIG.islands, 11).replay(r for r in rows if r["seq"] <= upto)
    full = Archipelago(CONFIG.islands, 11).replay(rows)
    blob = islands_snapshot(prefix, upto)
    members = [m for island in msgpack.unpackb(msgpack.unpackb(blob)["islands"])["islands"]
               for _, niche in island["niches"] for m in niche]
    assert members and all(m[2] is None for m in members)  # ids, scores, generations: no code
    with_code = msgpack.packb({"version": 2, "seq": upto, "islands": prefix.to_msgpack()})  # before this change
    for saved in (blob, with_code):
        archive.save_snapshot("r1", saved)
        restored = load_islands(archive, "r1", CONFIG, done=241)
        assert restored.snapshot_seq == upto and restored.islands.to_msgpack() == full.to_msgpack()


def test_a_snapshot_member_missing_from_the_archive_means_a_full_replay(archive):
    from islands.population import Member

    islands = Archipelago(CONFIG.islands, 11).replay(_rows(archive))
    islands.add_result(0, Member("ghost", 99.0, "x = 1", 1, (99.0, 0.0), ()))  # never committed
    archive.save_snapshot("r1", islands_snapshot(islands, 10**9))
    restored = load_islands(archive, "r1", CONFIG, done=241)
    assert restored.snapshot_seq is None and restored.replayed == 241
    assert not restored.islands.islands[0].contains("ghost")
