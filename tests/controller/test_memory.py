"""A run's memory without Ray: skill checks on the validation split, library writes that survive a
busy library and add up when re-sent, warm-start plans."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from controller.config import load_config, validate
from controller.fingerprint import fingerprint
from controller.memory import WARM, RunMemory, library_note, retrieve_skills
from controller.scaffold import write_domain
from controller.skill_learning import SkillLearner
from controller.variant_memory import VariantMemory
from controller.warm_start import WarmStartError
from evaluators.domains.inventory.programs import MOTIFS, SEED_PROGRAM
from store import library_records as records
from store.duckdb_archive import DuckDBArchive
from store.library import Library, default_path
from store.records import Candidate, EvalResult, MutationRequest, Status
from tests.disks import small_disk
from tests.tiny import TINY_INVENTORY
from workers.ast_ops import OPERATORS, Motif, OpContext

CAPPED = Motif(MOTIFS[0][0], MOTIFS[0][1], tuple(MOTIFS[0][2]))
CHILD = OPERATORS["insert_motif"](SEED_PROGRAM, OpContext("policy", np.random.default_rng(0), motifs=(CAPPED,)))


def _config(**memory):
    return validate({"domain": {"name": "inventory", "options": dict(TINY_INVENTORY)}, "memory": memory})


def _candidate(pid, code=CHILD, parents=("seed",), mutator="embedded:insert_motif", run_id="r1"):
    return Candidate(pid, run_id, 0, 1, parents, code, mutator, 0.0)


def _request(parent_id, parent_code=SEED_PROGRAM):
    return MutationRequest("r1", 0, 1, parent_id, parent_code)


def _ok(pid, score, split="search"):
    return EvalResult(pid, split, Status.OK, score=score)


def test_a_child_ahead_on_search_becomes_a_skill_only_if_it_holds_on_validation():
    learner = SkillLearner("inventory", "fp", "policy", every=5, min_gain=0.0)
    learner.consider(_candidate("c1"), _ok("c1", -0.9), "seed", SEED_PROGRAM, -1.0)
    learner.consider(_candidate("c2"), _ok("c2", -1.1), "seed", SEED_PROGRAM, -1.0)  # behind: never checked
    learner.consider(_candidate("c3"), _ok("c3", -0.8), "seed", SEED_PROGRAM, -1.0)
    first = learner.jobs(done=10)
    assert [(j.program_id, j.code) for j in first] == [("seed", SEED_PROGRAM), ("c3", CHILD)]  # largest gain first
    assert learner.jobs(done=11) == []  # one check at a time
    assert learner.on_result(_ok("seed", -1.0, "validation")) is None
    assert learner.on_result(_ok("c3", -1.02, "validation")) is None  # the gain did not hold
    assert learner.jobs(done=12) == []  # rate-limited: one check per 5 search evaluations
    second = learner.jobs(done=15)
    assert [j.program_id for j in second] == ["c1"]  # the parent's validation score is known
    skill = learner.on_result(_ok("c1", -0.95, "validation"))
    assert skill["validation_gain"] == pytest.approx(0.05) and skill["search_gain"] == pytest.approx(0.1)
    assert skill["title"].startswith("wrap the returned value as np.minimum(…, cap)")
    assert skill["edit"]["anchor"] == "return" and skill["child_id"] == "c1" and skill["parent_id"] == "seed"


@pytest.fixture()
def archive(tmp_path):
    (tmp_path / "run").mkdir()
    with DuckDBArchive(tmp_path / "run" / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        yield archive


def _skill_row(run_id="r0"):
    learner = SkillLearner("inventory", "fp", "policy", every=1, min_gain=0.0)
    learner.consider(_candidate("c1", run_id=run_id), _ok("c1", -0.9), "seed", SEED_PROGRAM, -1.0)
    for job in learner.jobs(0):
        skill = learner.on_result(_ok(job.program_id, -0.9 if job.program_id == "c1" else -1.0, "validation"))
    return skill


def test_skill_uses_are_counted_once_however_often_they_are_sent(archive, tmp_path):
    library = Library(default_path())
    library.transaction(lambda con: records.add_skills(con, [_skill_row()]))
    memory = RunMemory(_config(warm_start=True), archive, "r1", tmp_path / "run")
    assert list(memory.skills) == [_skill_row()["skill_id"]]
    [found] = retrieve_skills(library, "inventory", SEED_PROGRAM)
    assert found.skill_id == _skill_row()["skill_id"] and found.edit.wraps and found.uses == 0
    assert retrieve_skills(library, "milp", SEED_PROGRAM) == []
    sid = _skill_row()["skill_id"]
    events = []
    for i, score in enumerate([-0.8, -1.2, -0.95]):
        pid = f"k{i}"
        memory.on_proposal(pid, _request("seed"), sid)
        events += memory.on_search_result(_candidate(pid, mutator="embedded:skill"), _ok(pid, score),
                                          SEED_PROGRAM, -0.9)
    archive.record([(_candidate(f"k{i}", CHILD.replace("12.0", f"1{i}.5"), mutator="embedded:skill"),
                     _ok(f"k{i}", s)) for i, s in enumerate([-0.8, -1.2, -0.95])])
    archive.log_events("r1", events)
    memory.flush(3, -0.8, force=True)
    memory.finish("completed", 3, -0.8)
    memory.finish("completed", 3, -0.8)  # a resume sends it all again
    [row] = library.transaction(lambda con: records.skills(con, "inventory"))
    assert (row["uses"], row["successes"]) == (3, 1) and memory.skills[sid].uses == 3
    [run] = library.transaction(lambda con: records.runs(con))
    assert (run["status"], run["evaluations"], run["best_search_score"]) == ("completed", 3, -0.8)
    assert [e["program_id"] for e in library.transaction(lambda con: records.elites(con, run_ids=["r1"]))] == [
        "k0", "k2", "k1"]


def test_writes_wait_out_a_busy_library_and_are_sent_at_the_next_commit_point(archive, tmp_path):
    memory = RunMemory(_config(busy_timeout_s=0.3), archive, "r1", tmp_path / "run")
    memory.pending["uses"].append({"run_id": "r1", "program_id": "k1", "skill_id": "sk", "parent_id": "seed",
                                   "status": "OK", "success": True, "gain": 0.1})
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(30)", str(default_path())],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        memory.flush(1, -0.9, force=True)
        assert "stayed busy" in memory.flush_error and len(memory.pending["uses"]) == 1
    finally:
        holder.kill()
        holder.wait()
    memory.flush(1, -0.9, force=True)
    assert memory.flush_error == "" and memory.pending["uses"] == []
    uses = Library(default_path()).transaction(lambda con: con.execute("SELECT count(*) FROM skill_uses").fetchall())
    assert uses == [(1,)]


def test_a_library_that_cannot_be_written_is_said_once_as_it_happens_and_again_when_it_can(archive, tmp_path):
    """A full disk under the library: the run heard of it first at its end (the failure was only kept);
    now one notice as it happens, none while it lasts, and one when a write gets through again, with
    what was kept for it sent then."""
    with small_disk(tmp_path / "disk", "2m") as disk:
        memory = RunMemory(_config(library=str(disk / "library.duckdb"), backup_every_s=0), archive, "r1",
                           tmp_path / "run")  # (no backup: it wants more room than the disk has)
        filler = disk / "filler"
        with open(filler, "wb", buffering=0) as out, pytest.raises(OSError):
            while True:
                out.write(b"x" * 4096)
        memory.pending["uses"].extend({"run_id": "r1", "program_id": f"k{i}", "skill_id": "sk", "parent_id": "seed",
                                       "status": "OK", "success": True, "gain": 0.1} for i in range(2000))
        for _ in range(3):
            memory.flush(1, -0.9, force=True)
        assert len(memory.notices) == 1, memory.notices
        assert memory.notices[0].startswith("atoll: the library cannot be written (") and "\n" not in memory.notices[0]
        assert "No space left on device" in memory.notices[0] and len(memory.pending["uses"]) == 2000
        filler.unlink()
        memory.flush(1, -0.9, force=True)
        assert memory.notices[1:] == [f"atoll: the library is written again ({disk / 'library.duckdb'})"]
        assert memory.pending["uses"] == [] and memory.flush_error == ""
        uses = Library(disk / "library.duckdb").transaction(lambda con: con.execute(
            "SELECT count(*) FROM skill_uses").fetchall())
        assert uses == [(2000,)]


def test_a_warm_start_plan_takes_elites_by_search_score_and_is_kept_for_a_resume(archive, tmp_path):
    library = Library(default_path())
    config = _config(warm_start=True, warm_elites=2)
    fp = fingerprint("inventory", dict(TINY_INVENTORY))
    elites = [{"program_id": f"e{i}", "domain": "inventory", "fingerprint": fp, "search_score": s,
               "code": SEED_PROGRAM.replace("15.0", str(10 + i)), "code_hash": f"h{i}"}
              for i, s in enumerate([-0.9, -0.8, -0.95])]
    library.transaction(lambda con: records.replace_elites(con, "r0", elites))
    memory = RunMemory(config, archive, "r1", tmp_path / "run")
    assert [e["program_id"] for e in memory.plan["elites"]] == ["e1", "e0"]
    first = memory.warm_candidates(lambda code: False, budget=10)
    assert [c.mutator for c in first] == [WARM, WARM] and memory.warm_candidates(lambda code: False, 10) == []
    event = memory.on_search_result(first[0], _ok(first[0].program_id, -0.85), None, None)
    assert event == [("warm-start", {"program_id": first[0].program_id, "source_run": "r0",
                                     "source_program_id": "e1", "source_search_score": -0.8, "status": "OK",
                                     "search_score": -0.85})]
    assert library_note(archive, "r1").startswith("Library memory: warm-started from library (2 elites chosen by "
                                                  "search score, 0 skills), replayed skills 0 times; skills are kept "
                                                  "only if their gain holds on the validation split (0 validation")
    library.transaction(lambda con: records.replace_elites(con, "r0", []))  # the library moves on...
    again = RunMemory(config, archive, "r1", tmp_path / "run")  # ...a resume keeps the plan it logged
    assert [e["program_id"] for e in again.plan["elites"]] == ["e1", "e0"]
    [run] = library.transaction(lambda con: records.runs(con))
    assert '"elites": [{"run_id": "r0", "program_id": "e1"' in run["warm_start"]


def test_warm_from_must_name_known_runs_of_the_same_domain(archive, tmp_path):
    with pytest.raises(WarmStartError, match="knows no run 'nowhere'"):
        RunMemory(_config(warm_start=True, warm_from=["nowhere"]), archive, "r1", tmp_path / "run")
    Library(default_path()).transaction(lambda con: records.upsert_run(con, {
        "run_id": "m1", "run_dir": "/runs/m1", "domain": "milp", "fingerprint": "x", "config": {},
        "status": "completed"}))
    with pytest.raises(WarmStartError, match="searched domain 'milp'"):
        RunMemory(_config(warm_start=True, warm_from=["/runs/m1"]), archive, "r1", tmp_path / "run")


def test_a_users_domain_named_like_a_built_in_one_keeps_its_skills_and_runs_apart(archive, tmp_path):
    library = Library(default_path())
    library.transaction(lambda con: records.add_skills(con, [_skill_row()]))  # learned by a built-in inventory run
    library.transaction(lambda con: records.upsert_run(con, {
        "run_id": "r0", "run_dir": "/runs/r0", "domain": "inventory", "fingerprint": "x", "config": {},
        "status": "completed"}))
    write_domain("inventory", tmp_path / "mine")  # atoll new-domain inventory: a pricing domain of the user's
    config, _ = load_config(tmp_path / "mine" / "inventory.toml", ["memory.warm_start=true"])
    memory = RunMemory(config, archive, "r1", tmp_path / "run")
    assert memory.plan["skills"] == [] and memory.skills == {} and memory.domain == "file:inventory"
    with pytest.raises(WarmStartError, match="searched domain 'inventory', not 'file:inventory'"):
        RunMemory(load_config(tmp_path / "mine" / "inventory.toml", ["memory.warm_start=true",
                                                                      "memory.warm_from=[\"r0\"]"])[0],
                  archive, "r2", tmp_path / "run")
    # a file domain with a name of its own keeps that name, as libraries hold it
    write_domain("pricing", tmp_path / "own")
    assert RunMemory(load_config(tmp_path / "own" / "pricing.toml")[0], archive, "r3", tmp_path / "run").domain == (
        "pricing")


def test_the_fingerprint_fills_in_defaults_and_tells_options_apart():
    assert fingerprint("inventory", {}) == fingerprint("inventory", {"mean_demand": 5.0})
    assert fingerprint("inventory", {}) != fingerprint("inventory", {"mean_demand": 6.0})


def test_prompt_variants_carry_their_success_across_runs():
    library = Library(default_path())
    first = VariantMemory(library, "inventory", "r1", defaults=["Improve the policy.", "Make one small change."])
    rng = np.random.default_rng(0)
    chosen = [first.choose(rng).variant_id for _ in range(20)]
    assert set(chosen) == set(first.variants)  # both untried variants get tried
    good, bad = sorted(first.variants)
    for i in range(6):
        first.record(f"p{i}", good, success=True)
        first.record(f"q{i}", bad, success=False)
    assert first.flush() and first.flush()
    second = VariantMemory(library, "inventory", "r2", defaults=["Improve the policy."])
    assert (second.variants[good].uses, second.variants[good].successes) == (6, 6)
    assert (second.variants[bad].uses, second.variants[bad].successes) == (6, 0)
    picks = [second.choose(rng).variant_id for _ in range(50)]
    assert picks.count(good) > 40


def test_prompt_variant_uses_reach_the_library_once_and_a_child_never_made_counts_nothing(archive, tmp_path):
    from workers.llm.prompts import DEFAULT_INSTRUCTION

    llm = {"models": [{"backend": "openai", "name": "m", "base_url": "http://127.0.0.1:1/v1", "model": "m"}]}
    config = validate({"domain": {"name": "inventory", "options": dict(TINY_INVENTORY)}, "mutator": {"llm": llm}})
    memory = RunMemory(config, archive, "r1", tmp_path / "run")
    variant = memory.variant()
    assert variant.text == DEFAULT_INSTRUCTION and RunMemory(_config(), archive, "r1", tmp_path / "run").variant() is None
    events = []
    for i, score in enumerate([-0.8, -1.2]):
        memory.on_proposal(f"v{i}", _request("seed"), variant=variant.variant_id)
        events += memory.on_search_result(_candidate(f"v{i}", mutator="llm:m"), _ok(f"v{i}", score), None, -0.9)
    memory.on_proposal("lost", _request("seed"), variant=variant.variant_id)
    memory.forget("lost")  # the call gave no child
    assert not memory.variant_of and not memory.parent_code
    archive.log_events("r1", events)
    memory.flush(2, -0.8, force=True)
    memory.finish("completed", 2, -0.8)  # re-sends the run's uses from its events: counted once
    [row] = Library(default_path()).transaction(lambda con: records.variants(con, "inventory"))
    assert (row["variant_id"], row["uses"], row["successes"]) == (variant.variant_id, 2, 1)


def test_a_warm_start_elite_joins_every_island_again_on_a_resume(archive):
    from controller.resume import load_islands

    config = validate({"domain": {"name": "inventory"}, "islands": {"count": 3}})
    archive.record([(Candidate("seed", "r1", 0, 0, (), SEED_PROGRAM, "seed", 0.0), _ok("seed", -1.0)),
                    (Candidate("elite", "r1", 0, 0, (), CHILD, WARM, 0.0), _ok("elite", -0.8))])
    islands = load_islands(archive, "r1", config, 2).islands
    assert [island.best().program_id for island in islands.islands] == ["elite"] * 3


def test_a_resumed_copy_of_a_run_directory_says_the_library_now_follows_it_and_a_move_says_nothing(
        archive, tmp_path, capsys):
    original, copy = (tmp_path / "run").resolve(), (tmp_path / "copy").resolve()
    RunMemory(_config(), archive, "r1", original)  # the library knows r1 here
    copy.mkdir()
    (copy / "archive.duckdb").write_bytes((original / "archive.duckdb").read_bytes())
    capsys.readouterr()
    RunMemory(_config(), archive, "r1", copy)  # the copy resumed while the original is still there
    said = capsys.readouterr().err.strip()
    assert said.startswith(f"atoll: the library knew run r1 at {original}, which still holds a run's archive")
    assert f"it now follows {copy}." in said and "\n" not in said
    assert f"--set memory.warm_start=true --set 'memory.warm_from=[\"{copy}\"]'" in said
    assert Library(default_path()).transaction(lambda con: records.run_dir_of(con, "r1")) == str(copy)
    RunMemory(_config(), archive, "r1", copy)  # resumed there again: nothing new to say
    assert capsys.readouterr().err == ""
    (copy / "archive.duckdb").unlink()  # the copy was a move after all: its source is gone
    RunMemory(_config(), archive, "r1", original)
    assert capsys.readouterr().err == ""


def _backed_up(library):
    """The run rows of the library's backup, as (status, evaluations)."""
    rows = Library(library.backup_path).transaction(lambda con: records.runs(con))
    return [(r["status"], r["evaluations"]) for r in rows]


def test_a_run_that_never_ends_keeps_the_library_backed_up_and_says_once_when_it_cannot(archive, tmp_path):
    library = Library(default_path())
    # backup_every_s is long and the backup is made old by hand: a 0.3 s period with a sleep failed
    # about once in 20 on a busy machine, when the first backup alone took longer than that
    memory = RunMemory(_config(backup_every_s=60), archive, "r1", tmp_path / "run")
    assert _backed_up(library) == [("running", 0)]  # the run's first write made the library, then its backup
    memory.flush(5, -0.9, force=True)
    assert _backed_up(library) == [("running", 0)]  # under backup_every_s old: kept
    os.utime(library.backup_path, (time.time() - 120, time.time() - 120))
    memory.flush(7, -0.8, force=True)  # a write once the backup is old copies the library again, mid-run
    assert _backed_up(library) == [("running", 7)] and memory.notices == []
    library.backup_path.unlink()
    library.backup_path.mkdir()  # a backup that cannot be put in place, and an old one
    os.utime(library.backup_path, (time.time() - 120, time.time() - 120))
    memory.flush(8, -0.8, force=True)
    [said] = memory.notices
    assert said.startswith("atoll: the library's backup was not made (") and str(library.backup_path) in said
    assert "the run goes on" in said and "\n" not in said
    memory.backup_retry_at = 0.0  # as if minutes had passed: tried again, and not said again
    memory.flush(9, -0.8, force=True)
    assert len(memory.notices) == 1 and memory.backup_failed
    library.backup_path.rmdir()
    memory.backup_retry_at = 0.0
    memory.flush(10, -0.7, force=True)
    assert memory.notices[1] == f"atoll: the library's backup is made again ({library.backup_path})"
    assert _backed_up(library) == [("running", 10)] and not list(library.path.parent.glob("*.tmp"))
    off = RunMemory(_config(backup_every_s=0), archive, "r1", tmp_path / "run")
    library.backup_path.unlink()
    off.flush(11, -0.7, force=True)
    assert off.finish("completed", 11, -0.7).startswith("library ") and not library.backup_path.exists()  # 0: none
