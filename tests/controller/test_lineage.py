"""`atoll lineage`: how a program was made, step by step from its root, on a made archive."""
import json
import shutil

import pytest

from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

# (id, first parent and the others, island, source, status, score), in commit order: a300 is the run's
# best, a crossover of a200 (its first parent) and b100; a200 scored below its parent; a400 failed
PROGRAMS = [("s000", (), 0, "seed", Status.OK, -3.0), ("a100", ("s000",), 0, "embedded:perturb_const", Status.OK, -2.5),
            ("b100", ("s000",), 1, "llm:m", Status.OK, -2.0), ("a200", ("a100",), 0, "embedded:add_branch", Status.OK, -2.8),
            ("a300", ("a200", "b100"), 0, "embedded:crossover", Status.OK, -1.0),
            ("a400", ("a300",), 0, "llm:m", Status.FAILED, None)]


def _code(i: int) -> str:
    return f"def policy(state, params):\n    level = {i}\n    return level\n"


def _run(path):
    path.mkdir()
    with DuckDBArchive(path / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        archive.record([(Candidate(pid, "r1", island, i, parents, _code(i), source, 1.8e9 + i),
                         EvalResult(pid, "search", status, score=score, error="" if score is not None else "no"))
                        for i, (pid, parents, island, source, status, score) in enumerate(PROGRAMS)])
        archive.record_evaluations([EvalResult("a300", "heldout", Status.OK, score=-1.25)], "r1")
        for call, kind, at in (("c1", "diagnosis", 1.0), ("c2", "edit", 2.0)):  # a400's calls: the edit is the last
            archive.con.execute("INSERT INTO llm_calls (call_id, run_id, program_id, model, kind, tokens_in, tokens_out, "
                                "latency_s, created_at) VALUES (?, 'r1', 'a400', 'm', ?, 900, 120, 2.5, ?)", [call, kind, at])
    return path


def _rows(out: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in out.splitlines() if line.startswith("│")]


def test_lineage_walks_first_parents_back_to_the_seed_with_each_steps_gain_and_diff(tmp_path, atoll_cli):
    run_dir = _run(tmp_path / "run")
    out = atoll_cli("lineage", str(run_dir)).stdout  # the run's best by default
    assert out.startswith("program a300: search score -1, held-out -1.25; 3 steps from s000 (seed)\n"), out
    assert [(r[0], r[1], r[3], r[4], r[5], r[6], r[7], r[8]) for r in _rows(out)] == [
        ("0", "s000", "0", "seed", "-3", "", "", ""),
        ("1", "a100", "0", "embedded:perturb_const", "-2.5", "+0.5", "", ""),
        ("2", "a200", "0", "embedded:add_branch", "-2.8", "-0.3", "", ""),
        ("3", "a300", "0", "embedded:crossover", "-1", "+1.8", "-1.25", "b100")], out
    assert atoll_cli("lineage", str(run_dir), "a3").stdout == out  # the start of an id will do
    assert f"how it was made, step by step: atoll lineage {run_dir} --diff\n" in atoll_cli("best", str(run_dir)).stderr
    copy = tmp_path / "elsewhere.duckdb"  # a backup's copy, read where it lies
    shutil.copyfile(run_dir / "archive.duckdb", copy)
    assert atoll_cli("lineage", str(copy)).stdout == out

    failed = atoll_cli("lineage", str(run_dir), "a400", "--last", "2", "--diff").stdout
    assert failed.startswith("program a400: no OK search score; 4 steps from s000 (seed), the latest 2 shown\n"), failed
    assert [(r[0], r[1], r[5], r[6]) for r in _rows(failed)] == [("3", "a300", "-1", "+1.8"),
                                                                 ("4", "a400", "FAILED", "")]
    diffs = failed.split("step 3: ", 1)[1]
    assert diffs.startswith("a300 (embedded:crossover, score -1, gain +1.8)\n--- a200\n+++ a300\n"), diffs
    assert "\n-    level = 3\n+    level = 4\n" in diffs, diffs
    assert ("step 4: a400 (llm:m, FAILED: no)\nmade by m in 2.5 s (900 tokens in, 120 out); its prompt and reply: "
            f"atoll query {run_dir} \"SELECT p.prompt, c.completion FROM llm_calls c JOIN llm_prompts p USING (call_id) "
            "WHERE call_id = 'c2'\"\n--- a300\n") in diffs, diffs

    whole = atoll_cli("lineage", str(run_dir), "--whole").stdout.split("\nfrom ", 1)[1]  # all the steps in one diff
    assert whole == ("s000 (seed) to a300, 3 steps together:\n--- s000\n+++ a300\n@@ -1,3 +1,3 @@\n"
                     " def policy(state, params):\n-    level = 0\n+    level = 4\n     return level\n"), whole
    last = atoll_cli("lineage", str(run_dir), "a400", "--whole", "--last", "1").stdout
    assert "\nfrom a300 (embedded:crossover) to a400, 1 step:\n" in last, last

    steps = [json.loads(line) for line in atoll_cli("lineage", str(run_dir), "--json").stdout.splitlines()]
    assert [(s["step"], s["program_id"], s["parent_id"], s["other_parents"], s["code"]) for s in steps] == [
        (0, "s000", None, [], _code(0)), (1, "a100", "s000", [], _code(1)), (2, "a200", "a100", [], _code(3)),
        (3, "a300", "a200", ["b100"], _code(4))]
    assert steps[3]["gain"] == pytest.approx(1.8) and steps[3]["heldout"] == -1.25 and steps[3]["llm_call"] is None
    last = json.loads(atoll_cli("lineage", str(run_dir), "a400", "--json", "--last", "1").stdout)
    assert (last["status"], last["error"], last["llm_call"]) == ("FAILED", "no", "c2"), last


def test_a_warm_started_root_names_the_run_and_program_it_came_from(tmp_path, atoll_cli):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r2", {})
        archive.record([(Candidate("w0", "r2", 0, 0, (), _code(0), "warm-start", 1.8e9),
                         EvalResult("w0", "search", Status.OK, score=-2.0)),
                        (Candidate("w1", "r2", 0, 1, ("w0",), _code(1), "llm:m", 1.8e9 + 1),
                         EvalResult("w1", "search", Status.OK, score=-1.0))])
        archive.log_events("r2", [("warm-start", {"program_id": "w0", "source_run": "r1", "source_program_id": "a300",
                                                  "status": "OK", "search_score": -2.0})])
    out = atoll_cli("lineage", str(run_dir)).stdout
    assert out.startswith("program w1: search score -1; 1 step from w0 (warm-start (run r1's a300; its lineage goes "
                          "on there: atoll lineage ITS_RUN_DIR a300, the directory as atoll runs lists it))\n"), out


def test_lineage_of_an_unknown_or_ambiguous_id_says_so_in_one_line(tmp_path, atoll_cli):
    run_dir = _run(tmp_path / "run")
    for args, said in ((("a",), "'a' begins 4 program ids (a100, a200, a300, a400); give more of it"),
                       (("zz",), f"{run_dir} has no program 'zz' (ids are in atoll progress {run_dir}"),
                       (("a3", "--last", "0"), "--last takes a number of steps of at least 1")):
        out = atoll_cli("lineage", str(run_dir), *args, check=False)
        assert out.returncode == 2 and out.stderr.startswith(f"atoll: {said}"), out.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    with DuckDBArchive(empty / "archive.duckdb") as archive:
        archive.create_run("r1", {})
    out = atoll_cli("lineage", str(empty), check=False)
    assert out.returncode == 2 and "has no successfully evaluated program yet" in out.stderr, out.stderr


def test_lineage_by_default_shows_the_program_atoll_best_names(tmp_path, atoll_cli):
    """`atoll best` ends with "how it was made: atoll lineage DIR --diff": that must be its program's lineage,
    not that of a better-scored program whose validation failed (which the report and `best` pass over)."""
    run_dir = _run(tmp_path / "run")
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.record_evaluations([EvalResult("a300", "validation", Status.INVALID, error="runs away")], "r1")
    assert atoll_cli("best", str(run_dir)).stdout.startswith("best program b100:")
    out = atoll_cli("lineage", str(run_dir)).stdout
    assert out.startswith("program b100: search score -2; 1 step from s000 (seed)\n"), out
