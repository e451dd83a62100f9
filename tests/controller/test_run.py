"""The real entry point as a subprocess, with a tiny budget (real Ray, DuckDB, sandbox)."""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pytest

from store.query import QueryError, run_query
from tests.controller.runs import TINY, env
from tests.controller.runs import atoll as run_cli
from tests.controller.test_run_secrets import assert_secrets_drawn_stored_and_used, rescored_exactly

ROOT = Path(__file__).resolve().parents[2]


def _counts(run_dir):
    cols, rows, _ = run_query(run_dir, "SELECT count(*), count(DISTINCT program_id) FROM evaluations WHERE split = 'search'")
    return rows[0]


def test_run_then_best_status_and_query(atoll_cli, tmp_path):
    run_dir = tmp_path / "run"
    out = atoll_cli("run", "configs/inventory.toml", "--run-dir", str(run_dir), "--max-evals", "10", *TINY)
    assert "held-out" in out.stdout and "optimized base-stock" in out.stdout
    assert "sandbox: no-network, " in out.stdout and "private-filesystem" in out.stdout
    assert _counts(run_dir) == (10, 10)
    assert "[atoll] 0/10 evals  0.00/s  best -  in flight " in out.stderr  # a log's progress line says what runs
    best = atoll_cli("best", str(run_dir), "--out", str(tmp_path / "best.py"))
    assert "def policy" in best.stdout and "held-out score" in best.stdout
    metrics = best.stdout.split("held-out metrics (whole: atoll query ", 1)[1].splitlines()[1:]
    # a line a metric, an instance's row on one line (it was ~250 lines of JSON, a number a line)
    assert metrics[0].startswith("  mean_cost: ") and "    poisson-" in best.stdout and len(metrics) < 20, metrics
    assert any("trajectory_costs [" in line and " values]" in line for line in metrics), metrics
    written = (tmp_path / "best.py").read_text()
    assert written in best.stdout and "def policy" in written and "held-out" not in written
    compile(written, "best.py", "exec")  # the program alone, not the lines around it
    status = atoll_cli("status", str(run_dir))
    assert "completed" in status.stdout and "no-network" in status.stdout
    assert "seccomp" in run_query(run_dir, "SELECT protections FROM runs")[1][0][0]
    cols, rows, _ = run_query(run_dir, "SELECT count(*) FROM mutator_success")
    assert rows[0][0] >= 1
    # every held-out result is in the archive, and so are the reference figures: nothing is measured
    # again, and no Ray is started (none in the report's RAY_TMPDIR)
    sessions = Path(tempfile.mkdtemp(prefix="atoll-t-"))
    try:
        again = run_cli(tmp_path, "report", run_dir, RAY_TMPDIR=str(sessions))
        started_ray = (sessions / "ray").exists()
    finally:
        shutil.rmtree(sessions, ignore_errors=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "5 of 5 programs already scored" in again.stdout and "scoring" not in again.stdout
    assert "reference figures from the archive" in again.stdout and "measuring" not in again.stdout
    assert not started_ray
    assert _heldout_table(again.stdout) == _heldout_table(out.stdout)
    assert "optimized base-stock" in again.stdout and "DP optimum" in again.stdout
    # figures stored by another version of the domain, which its table cannot read, are measured again
    # (here beside a held-out result gone missing: one start of Ray and the evaluators serves both)
    with duckdb.connect(str(run_dir / "archive.duckdb")) as con:
        con.execute("UPDATE events SET data = '{\"figures\": {\"dp_optimum\": 5}}' "
                    "WHERE kind = 'heldout-reference'")
        con.execute("DELETE FROM evaluations WHERE split = 'heldout' AND program_id LIKE 'baseline-myopic-%'")
    remeasured = atoll_cli("report", str(run_dir))
    assert "4 of 5 programs already scored" in remeasured.stdout
    assert "do not fit this version of the domain; measuring them again" in remeasured.stdout
    assert _heldout_table(remeasured.stdout) == _heldout_table(out.stdout)
    assert_secrets_drawn_stored_and_used(run_dir)


@pytest.mark.slow
def test_ctrl_c_during_the_report_keeps_the_search_and_the_report_command_finishes_it(atoll_cli, tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "controller", "run", "configs/inventory.toml", "--run-dir", str(run_dir),
           "--max-evals", "4", *TINY]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(tmp_path), start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for line in proc.stdout:
            if "held-out: scoring" in line:
                break
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert f"atoll report {run_dir}" in rest
    assert "completed" in atoll_cli("status", str(run_dir)).stdout
    done = atoll_cli("report", str(run_dir))
    assert "held-out split (inventory)" in done.stdout and "evolved best" in done.stdout
    assert _counts(run_dir) == (4, 4)
    assert rescored_exactly(run_dir) == 5  # the baselines, scored by the report's new process on the stored secrets


def _heldout_table(stdout: str) -> list[str]:
    """The held-out table's rows as printed."""
    table = stdout.split("held-out split (inventory)", 1)[1]
    return [line for line in table.splitlines() if line.startswith("│")]


def _wait_for_evaluations(run_dir, n, proc, limit=180):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        try:
            count, _ = _counts(run_dir)
            if count >= n:
                return count
        except QueryError:
            pass
        time.sleep(0.3)
    raise AssertionError("the run made no progress")


def _started(run_dir, tmp_path, max_evals):
    """`atoll run` on the tiny inventory config, in a process group of its own (Ctrl-C goes to the group)."""
    cmd = [sys.executable, "-m", "controller", "run", "configs/inventory.toml", "--run-dir", str(run_dir),
           "--max-evals", str(max_evals), "--no-report", *TINY]
    return subprocess.Popen(cmd, cwd=ROOT, env=env(tmp_path), start_new_session=True, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _ctrl_c_again(proc):
    """Another Ctrl-C to the run's process group, unless it has already ended (a fast machine)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)


def test_ctrl_c_while_a_run_starts_is_one_line_that_says_how_to_continue(tmp_path):
    """Ctrl-C once the archive exists, while the actors start and the seed is scored (outside the
    search loop), then again: a KeyboardInterrupt traceback before; now one line with the resume."""
    run_dir = tmp_path / "run"
    proc = _started(run_dir, tmp_path, 10)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "archive.duckdb").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended or never made its archive"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.3)
        _ctrl_c_again(proc)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # 130, or Ctrl-C's own -2 when the second one came as Python finalized (everything was written)
    assert proc.returncode in (130, -signal.SIGINT) and "Traceback" not in err, err
    # on stderr; on stdout where a slow machine had the search loop begun (its own stop says it)
    assert f"Continue with: atoll resume {run_dir}" in out + err, err


def test_a_sigterm_while_ray_starts_stops_the_run_in_one_line_and_leaves_no_ray_behind(tmp_path):
    """SIGTERM (a scheduler's kill) in the seconds `ray.init` takes: Ray's own handler, put in place by
    `ray.init`, exited with status 15 and no word, and left the Ray's agents running and its session
    folder behind. Now it waits for the start, as Ctrl-C does, and stops the command in one line."""
    temp = Path(tempfile.mkdtemp(prefix="atoll-t-"))  # short: Ray's sockets are in it
    try:
        cmd = [sys.executable, "-m", "controller", "run", "configs/inventory.toml", "--run-dir",
               str(tmp_path / "run"), "--max-evals", "4", "--no-report", *TINY]
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**env(tmp_path), "RAY_TMPDIR": str(temp)}, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while not list(temp.glob("ray/session_2*")):  # made by ray.init, after it put its handler in place
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, (proc.returncode, err)
        assert "atoll run: stopped (Ctrl-C, SIGTERM or SIGHUP)" in err and "Traceback" not in err, err
        time.sleep(1.0)  # what Ray's shutdown stopped is gone by now; what it left is not
        left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _environ_has(pid, str(temp))]
        assert left == [] and not list(temp.glob("ray/session_2*")), (left, list(temp.glob("ray/*")))
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _environ_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def test_query_answers_during_a_live_run_and_a_second_ctrl_c_while_stopping_is_one_line(atoll_cli, tmp_path):
    """`atoll query` reads a live run and refuses writes. Then Ctrl-C, and Ctrl-C again while the run
    commits and ends: the second one broke the library's write off with DuckDB's 'Query interrupted'
    traceback (or Ray's shutdown with a KeyboardInterrupt one). Now it is answered with one line, and
    the stop completes: the archive and the library both say interrupted."""
    run_dir = tmp_path / "run"
    proc = _started(run_dir, tmp_path, 400)
    try:
        assert _wait_for_evaluations(run_dir, 2, proc) >= 2
        cli = subprocess.run([sys.executable, "-m", "controller", "query", str(run_dir),
                              "SELECT count(*) AS n FROM programs", "--json"],
                             cwd=ROOT, env=env(tmp_path), capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0 and json.loads(cli.stdout.splitlines()[0])["n"] >= 2
        assert "live" in cli.stderr
        refused = subprocess.run([sys.executable, "-m", "controller", "query", str(run_dir), "DELETE FROM programs"],
                                 cwd=ROOT, env=env(tmp_path), capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and "read-only" in refused.stderr and "Traceback" not in refused.stderr
        os.killpg(proc.pid, signal.SIGINT)
        for pause in (0.15, 0.4):  # the stop's commits and Ray's shutdown take seconds
            time.sleep(pause)
            _ctrl_c_again(proc)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.count("atoll: still stopping: committing what finished") == 1, err
    assert f"stopped; everything finished is committed. Continue with: atoll resume {run_dir}" in out
    assert "interrupted" in atoll_cli("status", str(run_dir)).stdout
    # the session and what stopped it, in the archive
    sessions = run_query(run_dir, "SELECT kind, json_extract_string(data, '$.by') FROM events "
                                  "WHERE kind IN ('started', 'stopping') ORDER BY ts")[1]
    assert sessions == [("started", None), ("stopping", "Ctrl-C (SIGINT)")], sessions
    runs = [json.loads(line) for line in atoll_cli("runs", "--json").stdout.splitlines()]
    assert [r["status"] for r in runs if str(run_dir) in json.dumps(r)] == ["interrupted"], runs


@pytest.mark.slow
def test_a_hangup_of_the_runs_terminal_stops_it_as_ctrl_c_does_and_a_resume_finishes_it(atoll_cli, tmp_path):
    """The terminal the run was started from goes away (an ssh session dropped): the kernel hangs the
    terminal up and sends SIGHUP. It killed the driver with everything committed but its archive's
    log, socket, control record and Ray's session left behind; now it stops as on Ctrl-C (its prints
    to the hung-up terminal go nowhere instead of failing with EIO) and says what stopped it in the
    archive's events; a resume then finishes the budget exactly."""
    import fcntl
    import pty
    import termios
    import threading

    run_dir = tmp_path / "run"
    master, slave = pty.openpty()
    cmd = [sys.executable, "-m", "controller", "run", "configs/inventory.toml", "--run-dir", str(run_dir),
           "--max-evals", "12", "--no-report", *TINY]
    # a session of its own whose controlling terminal is the pty, as a login shell's command has
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env(tmp_path), stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))  # noqa: PLW1509
    os.close(slave)
    shown = []

    def drain():  # the terminal's screen
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 4096):
                shown.append(chunk)
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert _wait_for_evaluations(run_dir, 2, proc) >= 2
        os.close(master)  # the hangup
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (proc.returncode, b"".join(shown)[-2000:])
    assert b"sandbox: no-network" in b"".join(shown)  # it was the run's terminal
    left = sorted(p.name for p in run_dir.iterdir() if p.name in ("archive.duckdb.wal", "archive.sock", "control.json"))
    assert left == [], left
    assert "interrupted" in atoll_cli("status", str(run_dir)).stdout
    [(by,)] = run_query(run_dir, "SELECT json_extract_string(data, '$.by') FROM events WHERE kind = 'stopping'")[1]
    assert by == "a hangup (SIGHUP)"
    done = _counts(run_dir)[0]
    assert 2 <= done < 12
    atoll_cli("resume", str(run_dir), "--no-report")
    assert _counts(run_dir) == (12, 12)
    assert [k for (k,) in run_query(run_dir, "SELECT kind FROM events WHERE kind IN ('started', 'stopping') "
                                             "ORDER BY ts")[1]] == ["started", "stopping", "started"]


@pytest.mark.parametrize("args, needle", [
    (["run", "configs/absent.toml"], "does not exist"),
    (["resume", "/nonexistent/run"], "is not a run directory"),
    (["query", "/nonexistent/run", "SELECT 1"], "not a run directory"),
    (["report", "/nonexistent/run"], "not a run directory"),
    (["run", "configs/inventory.toml", "--set", "islands.count=-1"], "islands.count"),
])
def test_bad_input_gets_one_line_and_exit_2(atoll_cli, args, needle):
    out = atoll_cli(*args, check=False)
    assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr


def _tiny_with_wall_s(seconds: int) -> list[str]:
    """TINY with a shorter search wall-time budget."""
    return [x if x != "run.max_wall_s=240" else f"run.max_wall_s={seconds}" for x in TINY]


@pytest.mark.slow
def test_a_search_whose_mutators_ran_out_of_new_programs_ends_stalled_and_says_so(tmp_path):
    """One operator on one island soon has nothing new to propose: each request then makes a program
    already tried. The run says so once, keeps the event and ends 'stalled' with its resume, where it
    idled (archiving a duplicate event a request) until its wall time."""
    run_dir = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "controller", "run", "configs/inventory.toml", "--run-dir",
                          str(run_dir), "--max-evals", "400", "--no-report", *_tiny_with_wall_s(120),
                          "--set", "islands.count=1", "--set", 'mutator.embedded.operators=["swap_operator"]'],
                         cwd=ROOT, env=env(tmp_path), text=True, capture_output=True, timeout=240, check=False)
    said = [line for line in out.stderr.splitlines() if "every child it made of these programs was one already tried"
            in line]
    assert len(said) == 1 and f"atoll resume {run_dir}" in said[0], out.stderr[-3000:]
    assert "search stalled" in out.stdout and "Traceback" not in out.stderr, out.stdout
    count, distinct = _counts(run_dir)
    assert count == distinct < 40  # a handful of operator swaps, each tried once
    stalls = run_query(run_dir, "SELECT json_extract(data, '$.requests_in_a_row')::INT FROM events "
                                "WHERE kind = 'embedded-stalled'")[1]  # again after an island gained a member
    assert stalls and all(n >= 200 for (n,) in stalls)  # kept in the archive too, and shown by `atoll watch`
    assert run_query(run_dir, "SELECT status FROM runs")[1] == [("stalled",)]


@pytest.mark.slow
def test_wall_time_ends_the_run_cleanly_and_it_says_it_waits_for_what_is_in_flight(atoll_cli, tmp_path):
    """Out of wall time with an evaluation still running (a MILP one lasts a minute): one line says that
    nothing new starts, how long the jobs in flight may take, and that Ctrl-C stops at once; what was in
    flight is committed and the run ends as wall-time."""
    run_dir = tmp_path / "run"
    out = run_cli(tmp_path, "run", ROOT / "benchmarks" / "fixed_cost.toml", "--run-dir", run_dir, "--set",
                  "domain.options.cost_s=3", "--set", "run.max_wall_s=1", "--set", "evaluator.actors=1",
                  "--no-report", timeout=240)
    assert out.returncode == 0 and "search wall-time" in out.stdout, out.stdout + out.stderr
    said = [line for line in out.stderr.splitlines() if "run.max_wall_s (1 s) is spent" in line]
    assert len(said) == 1, out.stderr
    assert re.search(r"the 1 job\(s\) in flight finish within 3\d s and are committed \(Ctrl-C stops now", said[0])
    [(in_flight,)] = run_query(run_dir, "SELECT json_extract(data, '$.in_flight')::INT FROM events "
                                        "WHERE kind = 'wall-time-reached'")[1]  # also for `atoll watch`
    assert in_flight == 1
    count, distinct = _counts(run_dir)
    assert count >= 1 and count == distinct  # the one in flight was committed
    assert "wall-time" in atoll_cli("status", str(run_dir)).stdout


def test_a_job_that_outlasts_the_wall_time_wait_is_dropped_and_said_and_the_run_ends_as_wall_time(atoll_cli,
                                                                                                   tmp_path):
    """The seed alone spends the budget (max_evals 1) but takes 10 s, longer than the wait after the wall
    time (sandbox.wall_s + 5 = 6 s): it is dropped, a line says so and how to go on, and the run is
    "wall-time", never "completed" with none of its evaluations."""
    run_dir = tmp_path / "run"
    out = run_cli(tmp_path, "run", ROOT / "benchmarks" / "fixed_cost.toml", "--run-dir", run_dir, "--set",
                  "domain.options.cost_s=10", "--set", "run.max_wall_s=1", "--set", "evaluator.actors=1", "--set",
                  "evaluator.sandbox.wall_s=1", "--max-evals", "1", "--no-report", timeout=120)
    assert out.returncode == 0 and "search wall-time: 0 evaluations" in out.stdout, out.stdout + out.stderr
    said = [line for line in out.stderr.splitlines() if "were dropped, uncommitted" in line]
    assert len(said) == 1 and f"atoll resume {run_dir} evaluates the 1 evaluation(s) left" in said[0], out.stderr
    [(dropped,)] = run_query(run_dir, "SELECT json_extract(data, '$.in_flight')::INT FROM events "
                                      "WHERE kind = 'wall-time-dropped'")[1]
    assert dropped == 1
    assert "wall-time" in atoll_cli("status", str(run_dir)).stdout
