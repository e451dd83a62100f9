"""A run's secret randomness through the real entry point: drawn, stored, reloaded, replayable.

Every check re-scores programs here, with the secrets read back from the run's
archive, and demands exactly the scores the run's own evaluator actors stored:
an actor that had drawn secrets of its own would have scored other data.
"""
import os
import signal
import subprocess
import sys
from pathlib import Path

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


def _rescored_exactly(run_dir: Path, seed_program: str | None = None) -> int:
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


def test_a_run_draws_secrets_keeps_them_in_its_archive_and_every_evaluator_uses_them(atoll_cli, tmp_path):
    run_dir = tmp_path / "run"
    out = atoll_cli("run", "configs/inventory.toml", "--run-dir", str(run_dir), "--max-evals", "4", "--no-report",
                    *TINY)
    assert "Replayable" not in out.stdout
    report = atoll_cli("report", str(run_dir))  # a new process: it must load the stored secrets
    assert "held-out split (inventory)" in report.stdout and "Replayable" not in report.stdout
    _, rows, _ = run_query(run_dir, "SELECT search, validation, heldout, replayable FROM run_secrets")
    search, validation, heldout, replayable = rows[0]
    assert len(rows) == 1 and not replayable and len({search, validation, heldout}) == 3
    assert all(2 ** 64 < int(v) < 2 ** 128 for v in (search, validation, heldout))  # drawn: 128-bit
    from evaluators.registry import get_domain
    seed_program = get_domain("inventory", **TINY_INVENTORY).seed_program
    assert _rescored_exactly(run_dir, seed_program) == 5  # 4 baselines and the seed, spread over both actors


def test_a_stopped_run_resumes_on_its_stored_secrets(tmp_path):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), ATOLL_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "controller", "run", "configs/inventory.toml", "--run-dir", str(run_dir),
           "--max-evals", "10", "--no-report", *TINY]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        for line in proc.stdout:
            if "evals" in line and not line.startswith("[atoll] 0/"):
                break
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before = _stored(run_dir)[0]
    done = subprocess.run([sys.executable, "-m", "controller", "resume", str(run_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    assert "held-out split (inventory)" in done.stdout
    assert _stored(run_dir)[0] == before
    assert _rescored_exactly(run_dir) == 5  # the baselines by the resumed process's actors


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
