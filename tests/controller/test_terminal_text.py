"""What the commands print is data, printed as it is: rich's markup would read `params[i]`
or `[atoll]` in a program, an error or a path as a style tag and drop it from the screen."""
import os
import subprocess
import sys
from pathlib import Path

from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

ROOT = Path(__file__).resolve().parents[2]
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


def test_a_table_narrower_than_its_values_folds_them_whole(tmp_path):
    """`atoll runs` or `atoll query` in an 80-column terminal: a run directory too wide for its
    column is folded onto the next lines, every character kept (it had been cut to `/tmp…`)."""
    run_dir = tmp_path / "runs" / "pricing-20261206-123734-a-long-enough-name"
    run_dir.mkdir(parents=True)
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
    sql = (f"SELECT 'pricing-20261206-123734' AS run_id, 'completed' AS status, 'pricing' AS domain, "
           f"'abc123def456' AS fingerprint, 12 AS evaluations, '{run_dir}' AS run_dir, "
           f"'2026-12-06 12:37:34' AS started")
    out = subprocess.run([sys.executable, "-m", "controller", "query", str(run_dir), sql], cwd=ROOT, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="80"), capture_output=True,
                         timeout=120, check=True).stdout
    body = [line.split("│") for line in out.splitlines() if line.startswith("│")]
    assert len(body) > 1 and max(map(len, out.splitlines())) <= 80, out  # folded, in the terminal's width
    assert "".join(cells[6].strip() for cells in body) == str(run_dir), out
    assert "…" not in out


SEQUENCES = "\x1b[1A\x1b[2K\x1b]52;c;ZWNobyBoaQ==\x07\x9b2J\r"  # cursor up, erase line, set clipboard, C1 CSI, CR


def test_control_sequences_in_stored_text_reach_no_terminal_as_they_are(tmp_path, atoll_cli):
    """A program, a candidate's error or a reply may hold terminal control sequences (a program stored
    before replies were checked for them, an error any candidate can raise): every command prints them
    written out, so what the screen shows is what is stored; `best --out` writes the program exactly."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code = CODE.replace("# [atoll]", f"# {SEQUENCES}hidden")
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        archive.record([(Candidate("p0", "r1", 0, 0, (), CODE, "seed", 0.0),
                         EvalResult("p0", "search", Status.OK, score=1.0)),
                        (Candidate("p1", "r1", 0, 1, ("p0",), code, "llm:m", 1.0),
                         EvalResult("p1", "search", Status.OK, score=2.0)),
                        (Candidate("p2", "r1", 0, 1, ("p0",), CODE + "\n", "llm:m", 2.0),
                         EvalResult("p2", "search", Status.FAILED, error=f"ValueError: {SEQUENCES}"))])
    written = "\\x1b[1A\\x1b[2K\\x1b]52;c;ZWNobyBoaQ==\\x07\\x9b2J\\x0d"
    for args in (("best", str(run_dir), "--out", str(tmp_path / "p.py")), ("status", str(run_dir)),
                 ("query", str(run_dir), "SELECT code, 'x' AS y FROM programs"),
                 ("query", str(run_dir), "SELECT error FROM evaluations"),
                 ("lineage", str(run_dir), "--diff"), ("progress", str(run_dir))):
        out = atoll_cli(*args)
        for text in (out.stdout, out.stderr):
            assert not any(c in text for c in "\x1b\x07\x9b\r"), (args, text)
        if args[0] in ("best", "query", "lineage"):
            assert written in out.stdout, (args, out.stdout)
    assert (tmp_path / "p.py").read_bytes() == code.encode()  # the file holds the program as stored
    status = atoll_cli("status", str(run_dir)).stdout
    assert "ValueError: \\x1b[1A" in status, status  # the failure reasons' table
    mine = atoll_cli("lineage", str(run_dir), "p1\x1b[2J", check=False)  # an argument is written out too
    assert mine.returncode == 2 and "\x1b" not in mine.stderr and "p1\\x1b[2J" in mine.stderr, mine.stderr
