"""What the commands print is data, printed as it is: rich's markup would read `params[i]`
or `[atoll]` in a program, an error or a path as a style tag and drop it from the screen."""
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

CODE = 'PARAMS = {"w": (1.0, 0.0, 2.0)}\n\n\ndef policy(state, params):\n    return [params[i] for i in state]  # [atoll]\n'
ERROR = "IndexError at season.visits[t + 1000] in [bold]simulate[/]"


def test_query_and_status_print_code_errors_and_paths_as_they_are(tmp_path, atoll_cli):
    run_dir = tmp_path / "run [1]"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        archive.set_run_status("r1", "running")  # then no driver: as after a kill
        archive.record([(Candidate("p0", "r1", 0, 0, (), CODE, "seed", 0.0),
                         EvalResult("p0", "search", Status.FAILED, error=ERROR))])
    code = atoll_cli("query", str(run_dir), "SELECT code FROM programs").stdout
    assert "[params[i] for i in state]" in code and "# [atoll]" in code
    error = atoll_cli("query", str(run_dir), "SELECT error FROM evaluations").stdout
    assert "season.visits[t + 1000] in [bold]simulate[/]" in error
    status = atoll_cli("status", str(run_dir)).stdout  # a run left "running": the line says how to resume it
    assert f"atoll resume {run_dir} " in status
