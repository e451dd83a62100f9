"""Helpers for tests that drive the real CLI in subprocesses on a tiny inventory config."""
import os
import subprocess
import sys
import time
from pathlib import Path

from store.duckdb_archive import DuckDBArchive
from store.query import QueryError, run_query
from tests.tiny import TINY_INVENTORY

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "inventory.toml")
TINY = ["--set", "run.max_wall_s=240", "--set", "islands.count=2", "--set", "evaluator.actors=2",
        "--set", "controller.commit_every_s=0.2", "--set", "controller.snapshot_every_s=0.5"]
for _key, _value in TINY_INVENTORY.items():
    TINY += ["--set", f"domain.options.{_key}={_value}"]


def env(tmp_path, **extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def start(tmp_path, *args, **extra_env) -> subprocess.Popen:
    """`atoll ARGS` in its own session (so the test can kill its whole process group)."""
    return subprocess.Popen([sys.executable, "-m", "controller", *map(str, args)], cwd=ROOT,
                            env=env(tmp_path, **extra_env), start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def atoll(tmp_path, *args, timeout=300, **extra_env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller", *map(str, args)], cwd=ROOT,
                          env=env(tmp_path, **extra_env), capture_output=True, text=True, timeout=timeout)


def counts(run_dir) -> tuple[int, int]:
    """(search evaluations, distinct programs among them), live or not."""
    _, rows, _ = run_query(run_dir, "SELECT count(*), count(DISTINCT program_id) FROM evaluations "
                                    "WHERE split = 'search'")
    return rows[0]


def proposed_texts(run_dir) -> int:
    """Distinct program texts evaluated on the search split, as proposed (before tuning rewrote PARAMS)."""
    _, rows, _ = run_query(run_dir, (
        "SELECT count(DISTINCT coalesce(json_extract_string(e.metrics, '$.proposed_hash'), p.code_hash)) "
        "FROM evaluations e JOIN programs p USING (program_id) WHERE e.split = 'search'"))
    return rows[0][0]


def committed_ids(run_dir, name: str = "archive.duckdb") -> set[str]:
    """Program ids of the committed search evaluations (no driver may hold the archive): in the
    archive, or in another file of the run directory (its backup)."""
    if not (Path(run_dir) / name).exists():
        return set()
    with DuckDBArchive(Path(run_dir) / name, read_only=True) as archive:
        rows = archive.con.execute("SELECT program_id FROM evaluations WHERE split = 'search'").fetchall()
    return {pid for (pid,) in rows}


def wait_for_evaluations(run_dir, n: int, proc, limit: float = 180) -> int:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended early: {proc.communicate()}"
        try:
            count, _ = counts(run_dir)
            if count >= n:
                return count
        except QueryError:
            pass
        time.sleep(0.2)
    raise AssertionError("the run made no progress")


def kill_group(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    proc.wait()


def tiny_domain(name: str, seed: str) -> str:
    """The text of a user's domain file: one scalar action per instance, scored by its distance to
    the instance's number, with `seed` (a program defining `act`) as its seed and only baseline."""
    return f'''from evaluators.simple import SimpleDomain

SEED = {seed!r}


class Tiny(SimpleDomain):
    name = {name!r}
    entry_point = "act"
    seed_program = SEED
    baseline_programs = {{"seed": SEED}}
    action_shape = ()
    action_bounds = (-1.0, 1.0)

    def instances(self, split, rng):
        return [float(x) for x in rng.uniform(size=2)]

    def simulate(self, instances, policy):
        return [-abs(float(a) - x) for a, x in zip(policy([{{"x": x}} for x in instances]), instances)]
'''
