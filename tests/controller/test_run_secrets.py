"""A run's secret randomness through the real entry point: drawn, stored, reloaded, replayable.

The drawn-and-stored checks run on test_run.py's runs (one run serves both).

Every check re-scores programs here, with the secrets read back from the run's
archive, and demands exactly the scores the run's own evaluator actors stored:
an actor that had drawn secrets of its own would have scored other data.
"""
from pathlib import Path

import pytest

from evaluators.evaluator import Evaluator
from evaluators.sandbox.config import SandboxConfig
from evaluators.secrets import RunSecrets
from store.duckdb_archive import DuckDBArchive
from store.query import run_query
from tests.tiny import TINY_INVENTORY

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--set", "run.max_wall_s=240", "--set", "islands.count=2", "--set", "evaluator.actors=2",
        "--set", "controller.commit_every_s=0.2", "--set", "controller.snapshot_every_s=0.5"]
for _key, _value in TINY_INVENTORY.items():
    TINY += ["--set", f"domain.options.{_key}={_value}"]


def _stored(run_dir: Path) -> tuple[RunSecrets, dict, dict]:
    """(the run's secrets, {program label: held-out result row}, the seed's search row) from its archive."""
    with DuckDBArchive(run_dir / "archive.duckdb", read_only=True) as archive:
        run_id = archive.latest_run_id()
        secrets = RunSecrets.from_record(archive.load_secrets(run_id))
        rows = archive.con.execute(
            "SELECT p.mutator, p.code, e.split, e.score, e.metrics FROM programs p JOIN evaluations e "
            "USING (program_id) WHERE p.mutator LIKE 'baseline:%' OR p.mutator = 'seed'").fetchall()
    held = {m: (code, score, metrics) for m, code, split, score, metrics in rows if split == "heldout"}
    seed = next((code, score) for m, code, split, score, _ in rows if m == "seed" and split == "search")
    return secrets, held, {"seed": seed}


def rescored_exactly(run_dir: Path, seed_program: str | None = None) -> int:
    """Re-score every stored baseline held-out result (and the seed's search score) with the stored
    secrets; returns how many results were compared."""
    import json

    secrets, held, seed = _stored(run_dir)
    evaluator = Evaluator("inventory", TINY_INVENTORY, SandboxConfig(wall_s=60), secrets=secrets)
    for label, (code, score, metrics) in held.items():
        again = evaluator.evaluate(label, code, "heldout")
        assert again.score == score and again.metrics == json.loads(metrics), label
    if seed_program is not None:
        assert evaluator.evaluate("seed", seed_program, "search").score == seed["seed"][1]
    return len(held)


def assert_secrets_drawn_stored_and_used(run_dir: Path) -> None:
    """The finished run `run_dir` (no replay seed) drew 128-bit secrets, stored them once, and every
    evaluator actor scored with them (called by tests/controller/test_run.py on its runs)."""
    _, rows, _ = run_query(run_dir, "SELECT search, validation, heldout, replayable FROM run_secrets")
    search, validation, heldout, replayable = rows[0]
    assert len(rows) == 1 and not replayable and len({search, validation, heldout}) == 3
    assert all(2 ** 64 < int(v) < 2 ** 128 for v in (search, validation, heldout))  # drawn: 128-bit
    from evaluators.registry import get_domain
    seed_program = get_domain("inventory", **TINY_INVENTORY).seed_program
    assert rescored_exactly(run_dir, seed_program) == 5  # 4 baselines and the seed, spread over both actors


@pytest.mark.slow
def test_a_replay_seed_reproduces_the_scores_and_the_run_says_so(atoll_cli, tmp_path):
    fixed = ["--set", "run.replay_seed=7"]
    run = atoll_cli("run", "configs/inventory.toml", "--run-dir", str(tmp_path / "a"), "--max-evals", "2",
                    *TINY, *fixed)
    first = run.stdout.index("Replayable run")
    assert "run.replay_seed = 7" in run.stdout and first < run.stdout.index("held-out split")
    assert run.stdout.count("Replayable run") == 2  # at the start, and in the held-out table's notes
    secrets = _stored(tmp_path / "a")[0]
    assert secrets == RunSecrets.fixed(7)
    baselines = atoll_cli("baselines", "configs/inventory.toml", *TINY, *fixed)
    assert "Replayable run" in baselines.stdout
    table, again = _baseline_rows(run.stdout), _baseline_rows(baselines.stdout)
    assert len(table) == 4 and table == again  # the same data, the same figures, in another process


def _baseline_rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split("│")] for line in text.splitlines() if "│ baseline:" in line]


def test_a_run_without_stored_secrets_is_refused_in_one_line(atoll_cli, tmp_path):
    from controller.config import load_config

    config, text = load_config(ROOT / "configs" / "inventory.toml")
    (tmp_path / "old").mkdir()
    with DuckDBArchive(tmp_path / "old" / "archive.duckdb") as archive:
        archive.create_run("old-1", config.model_dump(mode="json"), text)
    out = atoll_cli("resume", str(tmp_path / "old"), check=False)
    assert out.returncode == 2 and "predates secret randomness" in out.stderr and "Traceback" not in out.stderr
