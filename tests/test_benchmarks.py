"""The scripts in benchmarks/ run as the README's commands run them, with tiny arguments.

Nothing else runs them, so a change in the code they lean on breaks them unseen (channel_floor.py
once died on an attribute the sandbox had renamed). Each test runs one script as a subprocess and
checks that it exits 0 and prints the lines that carry its figures, with numbers in them; the
figures' values are the benchmarks' business, not the tests'. The scripts that start Ray, a run
or a long solve are marked slow (`pytest -m slow`); run the suite inside `unshare -n` (README).
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.controller.runs import CONFIG, TINY
from tests.controller.runs import atoll as run_cli

ROOT = Path(__file__).resolve().parents[1]
NUM = r"[-+]?[\d,]*\.?\d+"
# the MILP scripts read only [domain.options]: one held-out instance, solved in about a second
MILP_OPTIONS = """[domain.options]
family = "setcover"
search_size = "fast"
heldout_size = "{size}"
search_instances = 1
heldout_instances = 1
scip_seeds = 1
time_limit_s = {limit}
clock = "cpu"
"""


def bench(script: str, *args, timeout: float = 240) -> str:
    """Stdout of `python3 benchmarks/SCRIPT ARGS` from the checkout's root, which must exit 0."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *map(str, args)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def assert_lines(out: str, patterns: tuple[str, ...]) -> None:
    """Every pattern matches a line of `out` (NUM stands for a printed figure)."""
    for pattern in patterns:
        assert re.search(pattern.replace("NUM", NUM), out, re.MULTILINE), f"no line matches {pattern!r}:\n{out[-3000:]}"


def milp_config(tmp_path: Path, limit: float, size: str = "medium") -> Path:
    path = tmp_path / "milp.toml"
    path.write_text(MILP_OPTIONS.format(limit=limit, size=size))
    return path


FAST = {
    "wire_frames.py": (["--rows", 8, "--leads", 1, 2],
                       (r"^together\s+NUM\s+NUM$", r"^frame bytes: request NUM / NUM, reply NUM / NUM")),
    "wakeup_cost.py": (["--round-trips", 200],
                       (r"blocking, any core\s+NUM µs wall,\s+NUM µs CPU", r"spinning up to NUM µs, any core\s+NUM µs")),
    "duckdb_statement_cost.py": (["--repeat", 5],
                                 (r"SELECT 1\s+NUM µs wall", r"through the appender \+ COMMIT\s+NUM µs wall")),
    "namespace_cost.py": (["--processes", 5, "--rounds", 1],
                          (r"^every namespace\s+wall NUM ms per child", r"^none\s+wall NUM ms per child")),
    "child_check_cost.py": (["--proposals", 5],
                            (r"^inventory seed\s+NUM chars: worker's child check\s+NUM µs, driver's duplicate check\s+NUM µs",
                             r"^control, grown\s+NUM chars")),
    "archive_ingest.py": (["--programs", 200, "--batch", 50, "--row-by-row", 20],
                          (r"record\(\), batches of 50\s+NUM\s+NUM$", r"executemany, 20 programs\s+NUM\s+NUM$",
                           r"known_hashes\s+NUM$")),
    "channel_floor.py": (["--repeats", 1],
                         (r"sandboxed\s+wall\s+NUM ms, CPU: evaluator\s+NUM ms \+ candidate\s+NUM ms = NUMx",
                          r"plain fork, no confinement\s+wall\s+NUM ms", r"in process\s+wall\s+NUM ms")),
    "sandbox_overhead.py": (["--candidates", 3],
                            (r"^first candidate \(starts the fork server\): NUM ms",
                             r"^no-op candidate, .*: median NUM ms", r"made ready in advance: median NUM ms")),
    "first_commit.py": (["--rounds", 1], (r"^this tree: first commit, median of 1: NUM ms CPU, NUM ms wall",)),
    "null_market_generator.py": (["--markets", 2], (r"^long\s+NUM ± NUM\s+NUM ± NUM", r"^SMA 50/200\s+NUM")),
    "channel_overhead.py": (["--round-trips", 20, "--repeats", 1],
                            (r"round trip, 1 batch of 8 rows: median NUM us", r"through the sandbox: NUM s",
                             r"in-process:\s+NUM s", r"sandboxed / in-process: NUMx")),
    "history_replay.py": (["--periods", 120, "--splits", "search"],
                          (r"^\s+120 periods  search\s+base-stock NUM  remembering NUM",)),
    "evaluation_cost.py": (["--repeats", 1], (r"inventory search evaluation, NUM programs x 1: median NUM ms",)),
    "archive_scale.py": (["--programs", 2000, "--batch", 100, "--snapshot-every", 500, "--driver-candidates", 20,
                          "--islands", 2],
                         (r"^at 2,000 programs", r"ingest: NUM rows/s", r"best_per_island \(all rows\)\s+NUM ms",
                          r"resume, archive and islands\s+NUM s", r"driver per candidate .*\n.*= NUM \(NUM\)",
                          r"^done")),
}

SLOW = {
    "gpu_generation.py": (["--help"], (r"^usage: gpu_generation.py",)),  # imports torch (14 s); no GPU here
    "selection_scale.py": (["--niches", 10, 100],
                           (r"^\s+10 niches: next_parent .*\s+NUM µs, best over 4 islands\s+NUM µs",
                            r"^snapshot of 4 islands x 1,000 niches, .*: NUM MiB, packed in NUM ms",
                            r"full island of 10,000 niches .*: NUM µs")),
    "ray_call_cost.py": (["--jobs", 20, "--batches", 1, 2, "--idle-s", 0.5],
                         (r"^1 job\(s\) per call:\s+NUM us wall", r"^idle, two actors: NUM ms of machine CPU")),
    "ray_start.py": (["--rounds", 1, "--idle", 0],
                     (r"^now\s+median of 1: ray.init NUM s, two actors ready NUM s, shutdown NUM s",)),
    "throughput.py": (["--evaluations", 2], (r"^evaluations/s: 1 actor NUM, 2 actors NUM \(speed-up NUMx",)),
    "report_again.py": (["--rounds", 1], (r"^this tree: atoll report on a finished run, median of 1: NUM s",)),
    # no sleep in the evaluations: the rate of the sandbox and the driver alone, with no ideal to compare
    "cluster_scale.py": (["--actors", 1, "--nodes", 1, "--cpus-per-node", 1, "--cost", 0, "--rounds", 1],
                         (r"^\s+1\s+NUM\s+NUM\s+nan\s+nan%\s+NUM\s+NUM%\s+NUM\s+1$",)),
    "ctrl_c_stress.py": (["--rounds", 1, "--from", 3, "--to", 3],
                         (r"^round 1: exit -?\d+ \w+", r"^\s+-?\d+\s+\w+\s+1$")),
    "loop_overhead.py": (["--proposals", 5, "--work-ms", 0],
                         (r"no-op evaluation, 5 proposals: 5 proposals evaluated",
                          r"proposals/s NUM\s+overhead per proposal NUM ms",
                          r"CPU per proposal, every process of the tree together")),
    "null_market_psr.py": (["--markets", 2, "--max-evals", 2, "--actors", 1, "--set", "domain.options.max_folds=1"],
                           (r"^\s+1000\s+2\s+NUM", r"^\s+1001\s+2\s+NUM",
                            r"^evolved best\s+n=\s+2\s+mean NUM\s+median NUM .*KS vs uniform D=NUM p=NUM")),
}


@pytest.mark.parametrize("script", FAST)
def test_fast_benchmark_prints_its_figures(script):
    args, patterns = FAST[script]
    assert_lines(bench(script, *args), patterns)


@pytest.mark.slow
@pytest.mark.parametrize("script", SLOW)
def test_slow_benchmark_prints_its_figures(script):
    args, patterns = SLOW[script]
    assert_lines(bench(script, *args, timeout=400), patterns)


def test_milp_root_share_on_one_instance(tmp_path):
    out = bench("milp_root_share.py", "--config", milp_config(tmp_path, 10), "--repeats", 2)
    assert_lines(out, (r"^setcover-medium-heldout-0\s+NUM\s+NUM\s+NUM\s+NUM%\s+NUM%$",
                       r"^root share of total time: NUM%; median spread of 2 repeats: NUM%, largest NUM%$"))


@pytest.mark.slow
def test_milp_clock_noise_on_one_instance(tmp_path):
    # a large instance runs to the 2 s limit: the script times only solves of half a second or more, and a
    # medium one solved faster than that on a quiet machine
    out = bench("milp_clock_noise.py", "--config", milp_config(tmp_path, 2, "large"), "--instances", 1, "--repeats", 2,
                "--load", 1)
    assert_lines(out, (r"^alone\s+0\s+NUMs\s+NUM%\s+NUMs\s+NUM%$", r"^load 1\s+0\s+NUMs",
                       r"^median spread, load 1, cpu clock: NUM%$"))


@pytest.mark.slow
def test_racing_milp_both_arms(tmp_path):
    out = bench("racing_milp.py", "--budget", 20, "--size", "fast", "--instances", 3, "--heldout", 1,
                "--min-instances", 2, "--rerun", 1, "--wall", 60, "--work", tmp_path / "work", timeout=500)
    assert_lines(out, (r"^both arms done in NUM s", r'^racing off: \{"evaluated": NUM', r'^racing on : \{"evaluated": NUM',
                       r"^racing replayed on the full evaluations", r"^(wrong stops: NUM of NUM|racing stopped nothing)"))


@pytest.mark.slow
def test_memory_warm_start_four_runs(tmp_path):
    out = bench("memory_warm_start.py", "--evals", 2, "--keep", tmp_path / "work", timeout=900)
    assert_lines(out, (r"^run C: 2 evaluations, best NUM", r"^same config: A's final best search score NUM, first reached after",
                       r"^other instances \(geometric demand\): C0's final best", r"^--- run C ---", r"held-out split \(inventory\)"))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny finished inventory run, as `atoll run` leaves it."""
    tmp = tmp_path_factory.mktemp("bench-run")
    proc = run_cli(tmp, "run", CONFIG, "--run-dir", tmp / "run", "--max-evals", 6, *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run"


@pytest.mark.slow
def test_unread_params_on_a_run(finished_run):
    out = bench("unread_params.py", finished_run)
    assert_lines(out, (r"^\s+seed\s+1 programs,\s+0 \(0%\) declare an unread parameter; 0 of NUM declared",))


@pytest.mark.slow
def test_heldout_tuning_on_a_run(finished_run):
    out = bench("heldout_tuning.py", finished_run, "--trials", 2, "--secrets", 1)
    assert_lines(out, (r"\s+2 trials: median NUM \(NUM to NUM\), NUM s an evaluation; NUM$",))
