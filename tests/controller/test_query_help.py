"""`atoll query --help` names every table and view a run's archive offers, and its examples run."""
import shlex

from controller.cli import QUERY_EPILOG
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

# Kept for the archive's own use: its migrations, the islands' snapshots, the counters behind
# mutator_success and the prompt texts behind llm_prompts.
INTERNAL = {"schema_version", "snapshots", "mutator_counts", "mutator_counts_seq", "llm_prompt_parts"}


def test_the_help_names_every_table_and_view_and_its_examples_run(tmp_path, atoll_cli):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        archive.record([(Candidate("p0", "r1", 0, 0, (), "x = 0", "seed", 0.0),
                         EvalResult("p0", "search", Status.OK, score=-1.0)),
                        (Candidate("p1", "r1", 0, 1, ("p0",), "x = 1", "embedded:perturb", 0.0),
                         EvalResult("p1", "search", Status.FAILED, error="boom"))])
        names = {row[0] for row in archive.con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert INTERNAL <= names
    missing = {name for name in names - INTERNAL if f" {name}" not in QUERY_EPILOG.replace(",", " ")}
    assert not missing, f"atoll query --help does not name {sorted(missing)}"
    assert "lineage_of(" in QUERY_EPILOG
    help_text = atoll_cli("query", "--help").stdout
    assert "run_secrets" in help_text and "lineage_of('PROGRAM_ID')" in help_text
    examples = [shlex.split(line.strip())[2:] for line in QUERY_EPILOG.splitlines()
                if line.strip().startswith("atoll query runs/x")]
    assert len(examples) == 4
    for run_path, sql in examples:
        assert run_path == "runs/x"
        out = atoll_cli("query", str(run_dir), sql.replace("PROGRAM_ID", "p1"), "--json")
        assert out.stdout.strip(), sql  # each example answers with rows on a real archive


def test_every_command_s_own_help_says_what_it_does():
    """`atoll best --help` and the like open with the line the command list gives them."""
    from controller.cli import build_parser

    commands = next(a for a in build_parser()._actions if a.dest == "command")
    for entry in commands._choices_actions:
        text = commands.choices[entry.dest].format_help()
        assert entry.help[1:].split()[0] in text.split("\n\n")[1], (entry.dest, text[:300])


def test_every_argument_has_help_and_the_help_names_every_shipped_config():
    """A positional or option shown bare in `atoll X --help` leaves the user guessing; and the config list
    that `atoll --help` ends with is where a user looks for the LLM configs too."""
    import argparse
    from pathlib import Path

    from controller.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    bare = [(name, action.option_strings or action.dest) for name, sub in commands.choices.items()
            for action in sub._actions if not isinstance(action, argparse._HelpAction) and not action.help]
    assert not bare, f"arguments without help text: {bare}"
    listed = parser.format_help().split("shipped configs", 1)[1].replace("\n", " ")
    shipped = sorted(p.stem for p in (Path(__file__).parents[2] / "configs").glob("*.toml"))
    assert [name for name in shipped if f" {name}" not in listed.replace(",", " ").replace(";", " ")] == []
