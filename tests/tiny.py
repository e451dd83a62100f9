"""Small, fast options shared by the tests that run whole evaluations."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# held-out tuning as short as the search's: the tests check what a report holds, not how well it tunes.
# Every trial of a study in one round: each round is a period-by-period exchange with the candidate's
# process, so an evaluation in two rounds of 4 took twice as long as one round of 8
TINY_INVENTORY = {"search_periods": 300, "heldout_periods": 300, "warmup": 50, "search_trajectories": 2,
                  "heldout_trajectories": 2, "tune_trials": 8, "tune_batch": 8, "heldout_tune_trials": 8}


def llm_config(path: Path, model: str, max_evals: int, max_wall_s: int = 200, run: str = "", more: str = "",
               llm: str = "", prompt: str = "inspirations = 0") -> Path:
    """A config at `path`: the tiny inventory on 2 islands and 1 evaluator, island 0 asking only the one
    `[[mutator.llm.models]]` entry (`model`, its TOML lines). `run`, `llm` and `prompt` add lines to
    [run], [mutator.llm] and [mutator.llm.prompt]; `more` adds TOML sections."""
    options = "\n".join(f"{k} = {v}" for k, v in TINY_INVENTORY.items())
    path.write_text(f"""
[run]
{run}
max_evals = {max_evals}
max_wall_s = {max_wall_s}
[domain]
name = "inventory"
[domain.options]
{options}
[islands]
count = 2
[evaluator]
actors = 1
{more}
[mutator.llm]
{llm}
island_weights = {{0 = {{embedded = 0}}}}
[mutator.llm.prompt]
{prompt}
[[mutator.llm.models]]
{model}
""")
    return path


def llm_run(tmp_path: Path, model: str, max_evals: int, more: str = "", max_wall_s: int = 200,
            timeout: int = 300) -> subprocess.CompletedProcess:
    """`atoll run --no-report` in a subprocess (run directory tmp_path/run) of `llm_config`'s config,
    no inspirations."""
    config = llm_config(tmp_path / "llm-run.toml", model, max_evals, max_wall_s, more=more)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "controller", "run", str(config), "--run-dir", str(tmp_path / "run"),
                           "--no-report"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
