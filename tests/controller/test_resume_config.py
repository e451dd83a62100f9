"""What `atoll resume --set` may change: budgets no lower than the work already done.
The real CLI in subprocesses, real DuckDB."""
from store.duckdb_archive import DuckDBArchive
from tests.controller.runs import atoll


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def _stored(run_dir) -> dict:
    with DuckDBArchive(run_dir / "archive.duckdb", read_only=True) as archive:
        return archive.get_run(archive.latest_run_id())


def test_a_resume_cannot_lower_the_evaluations_below_those_done(tmp_path):
    """As `atoll set` on a live run: one line, exit 2, nothing changed (it was accepted, printed
    '4/2 evaluations done' and ended the run as completed at once)."""
    from controller.config import validate
    from evaluators.secrets import RunSecrets
    from store.records import Candidate, EvalResult, Status

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = validate({"domain": {"name": "inventory"}, "run": {"max_evals": 8}}).model_dump(mode="json")
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", config)
        archive.save_secrets("r1", RunSecrets.fixed(0).to_record())
        archive.record([(Candidate(f"p{i}", "r1", 0, i, ("p0",) if i else (), f"x = {i}", "seed", 0.0),
                         EvalResult(f"p{i}", "search", Status.OK, score=-1.0)) for i in range(4)])
        archive.set_run_status("r1", "interrupted", ended=True)
    out = atoll(tmp_path, "resume", run_dir, "--set", "run.max_evals=2", timeout=60)
    assert out.returncode == 2
    assert _one_line(out.stderr) == ("atoll: run.max_evals: 2 is below the 4 evaluations finished or under way; "
                                     "give at least 4")
    run = _stored(run_dir)
    assert run["status"] == "interrupted" and run["config"]["run"]["max_evals"] == 8
