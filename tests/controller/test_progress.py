"""`atoll progress`: the best so far over a run's search evaluations, each improvement, each island's last."""
import json
import shutil

from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

# (island, mutator, status, score) in commit order: improvements of the run's best at 1, 2 and 6; a
# failure and a raced row (partial, never a score) between them
SEARCH = [(0, "seed", Status.OK, -3.0), (1, "embedded:perturb_const", Status.OK, -2.5),
          (0, "embedded:add_branch", Status.OK, -4.0), (1, "llm:m", Status.FAILED, None),
          (0, "embedded:wrap_clip", Status.RACED, None), (1, "llm:m", Status.OK, -1.0),
          (0, "embedded:perturb_const", Status.OK, -1.5), (1, "llm:m", Status.OK, -1.0)]


def _run(path):
    path.mkdir()
    with DuckDBArchive(path / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        archive.record([(Candidate(f"p{i}", "r1", island, i, ("p0",) if i else (), f"x = {i}", mutator, 1.8e9 + i),
                         EvalResult(f"p{i}", "search", status, score=score, error="" if score is not None else "no"))
                        for i, (island, mutator, status, score) in enumerate(SEARCH)])
        archive.record([(Candidate("b", "r1", -1, 0, (), "x = 9", "baseline:zero", 0.0),  # not the search's
                         EvalResult("b", "search", Status.OK, score=9.0))])
    return path


def _rows(out: str, title: str) -> list[list[str]]:
    table = out.split(title, 1)[1].split("\n\n")[0].split("islands (", 1)[0]
    return [[cell.strip() for cell in line.strip("│").split("│")] for line in table.splitlines() if line.startswith("│")]


def test_progress_lists_each_improvement_of_the_best_and_each_islands_last_also_on_a_copy(tmp_path, atoll_cli):
    run_dir = _run(tmp_path / "run")
    shown = atoll_cli("progress", str(run_dir))
    out = shown.stdout
    assert f"how one was made, step by step: atoll lineage {run_dir} PROGRAM_ID --diff" in shown.stderr
    assert "run r1: 8 search evaluations, 6 of them OK; best -1 (the seed: -3)" in out, out
    assert "last improvement: evaluation 6 of 8 (2 evaluations since; made " in out, out
    line = next(line for line in out.splitlines() if line.startswith("best so far, evaluations 1 to 8: "))
    assert line.endswith(": ▁▃▃▃▃███"), line  # 8 evaluations, a character each
    improvements = _rows(out, "improvements of the run's best:")
    assert [(r[0], r[2], r[3], r[4], r[5], r[6]) for r in improvements] == [
        ("1", "-3", "", "0", "seed", "p0"), ("2", "-2.5", "+0.5", "1", "embedded:perturb_const", "p1"),
        ("6", "-1", "+1.5", "1", "llm:m", "p5")], out
    islands = _rows(out, "islands (last improvement")
    assert [r for r in islands] == [["0", "4", "-1.5", "7", "1"], ["1", "4", "-1", "6", "2"]], out
    lines = [json.loads(line) for line in atoll_cli("progress", str(run_dir), "--json").stdout.splitlines()]
    assert [(d["evaluation"], d["score"], d["program_id"]) for d in lines] == [(1, -3.0, "p0"), (2, -2.5, "p1"),
                                                                              (6, -1.0, "p5")]
    status = atoll_cli("status", str(run_dir)).stdout  # the line `atoll status` gives it
    assert ("last improvement of the best: evaluation 6 of 8 (2 evaluations since; made " in status
            and f"; over the run: atoll progress {run_dir}\n" in status), status
    copy = tmp_path / "elsewhere.duckdb"  # a backup's copy, read where it lies
    shutil.copyfile(run_dir / "archive.duckdb", copy)
    assert atoll_cli("progress", str(copy)).stdout == out


def test_progress_of_a_run_without_a_search_evaluation_is_one_line(tmp_path, atoll_cli):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
    out = atoll_cli("progress", str(run_dir), check=False)
    assert out.returncode == 2 and out.stderr.strip() == f"atoll: {run_dir}: run r1 has no search evaluation yet", out
    out = atoll_cli("progress", str(tmp_path / "nothing"), check=False)
    assert out.returncode == 2 and "is not a run directory" in out.stderr, out
