"""`atoll submit` against a real Ray started with `ray start --head` (loopback, token authentication on).

The head runs in a temp dir of its own and is stopped by killing the processes that name
that dir (never `ray stop`, which would stop every Ray on the machine).
"""
import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import psutil
import pytest

from store.query import run_query
from tests.controller.runs import ROOT, atoll, kill_group, start, wait_for_evaluations
from workers.llm.local_server import free_port

CONFIG = "benchmarks/fixed_cost.toml"
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this Python


@pytest.fixture(autouse=True)
def _a_users_environment(monkeypatch):
    """`atoll submit` as from a user's shell: a Ray started earlier in this test process (another test's
    `ray_cluster`) left RAY_AUTH_MODE=token in its environment, which every `atoll` here inherited, so the
    printed hints left out the RAY_AUTH_MODE=token that a shell without it needs."""
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)


@pytest.fixture(scope="module")
def head():
    """A one-node cluster from `ray start --head`, its job server on a free loopback port; yields that address."""
    with ray_head() as (address, _):
        yield address


@contextlib.contextmanager
def ray_head():
    """(the job server's address, the temp dir whose processes `_stop` kills) of a fresh `ray start --head`."""
    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    # Every port of its own: a Ray the test session started earlier (in this process) holds the defaults,
    # and a job agent that cannot bind its port never comes up ("No available agent").
    ports = _free_ports(7)
    names = ("port", "dashboard-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
             "metrics-export-port", "runtime-env-agent-port", "ray-client-server-port")
    out = subprocess.run([*RAY, "start", "--head", "--num-cpus=2", f"--temp-dir={temp}", "--include-dashboard=true",
                          "--dashboard-host=127.0.0.1", "--disable-usage-stats",
                          *(f"--{name}={port}" for name, port in zip(names, ports))],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    try:
        assert out.returncode == 0, out.stdout + out.stderr
        yield f"http://127.0.0.1:{ports[1]}", temp
    finally:
        _stop(temp)
        shutil.rmtree(temp, ignore_errors=True)


def _free_ports(n: int) -> list[int]:
    """`n` different free loopback ports, below the kernel's ephemeral range (`free_port`): a port the
    kernel handed out for a bind to port 0 and closed again could be handed to a connection or a
    listener of the other test process's Ray before `ray start` binds it (seconds later for its job
    server)."""
    ports: list[int] = []
    while len(ports) < n:
        port = free_port()
        ports += [port] if port not in ports else []
    return ports


def _stop(temp: str) -> None:
    """Kill the processes of the Ray started in `temp` (each names its session folder there), and theirs."""
    ours = [p for p in psutil.process_iter(["cmdline"]) if any(temp in part for part in p.info["cmdline"] or ())]
    family = {p.pid: p for p in ours}
    for p in ours:
        try:
            family.update({c.pid: c for c in p.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
    for p in family.values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(list(family.values()), timeout=10)


def _count(run_dir) -> int:
    _, rows, _ = run_query(run_dir, "SELECT count(*) FROM evaluations WHERE split = 'search'")
    return rows[0][0]


def test_submit_runs_a_search_as_a_ray_job_then_status_and_query_read_it(head, tmp_path, session_library):
    run_dir = tmp_path / "run"
    out = atoll(tmp_path, "submit", CONFIG, "--address", head, "--run-dir", run_dir, "--max-evals", 10,
                "--set", "evaluator.actors=2", "--no-report", "--wait", timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "submitted job atoll-run-" in out.stdout and "ray job logs -f atoll-run-" in out.stdout
    assert "search completed: 10 evaluations" in out.stdout  # the job's own output, followed
    assert "Ignoring upload" not in out.stdout + out.stderr  # Ray's notes on packing the project, left out
    assert "WebSocket closed" not in out.stdout + out.stderr
    # The hint to follow the job works as printed, from a shell that set nothing (the token found in ~/.ray).
    follow = next(line.split(":", 1)[1].strip() for line in out.stdout.splitlines() if "follow it:" in line)
    assert follow.startswith("RAY_AUTH_MODE=token ray job logs -f ")
    logs = _shell(follow)
    assert logs.returncode == 0 and "search completed: 10 evaluations" in logs.stdout, logs.stdout + logs.stderr
    # `ray job stop` gives the driver a minute, not Ray's 3 s, to commit and say how to resume
    listed = _shell(f"RAY_AUTH_MODE=token ray job list --address {head}")
    assert "'RAY_JOB_STOP_WAIT_TIME_S': '60'" in listed.stdout, listed.stdout + listed.stderr
    status = atoll(tmp_path, "status", run_dir)
    assert status.returncode == 0 and "completed" in status.stdout
    assert _count(run_dir) == 10
    query = atoll(tmp_path, "query", run_dir, "SELECT count(DISTINCT node_id) AS nodes FROM evaluations", "--json")
    assert query.stdout.strip() == '{"nodes": 1}'
    jobs = atoll(tmp_path, "jobs", "--address", head)
    assert str(run_dir) in jobs.stdout and "SUCCEEDED" in jobs.stdout
    # the job's driver inherits the head's environment: the test session's library, never the user's
    with duckdb.connect(str(session_library), read_only=True) as con:
        assert (str(run_dir),) in con.execute("SELECT run_dir FROM runs").fetchall()

    more = atoll(tmp_path, "submit", "--resume", run_dir, "--address", head, "--set", "run.max_evals=14",
                 "--no-report", "--wait", timeout=180)
    assert more.returncode == 0, more.stdout + more.stderr
    assert _count(run_dir) == 14


@pytest.mark.slow
def test_the_printed_stop_hint_stops_the_job_which_commits_and_says_to_submit_its_resume(head, tmp_path):
    run_dir = tmp_path / "run"
    out = atoll(tmp_path, "submit", CONFIG, "--address", head, "--run-dir", run_dir, "--max-evals", 100000,
                "--set", "evaluator.actors=1", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    hints = dict(line.strip().split(":", 1) for line in out.stdout.splitlines() if line.startswith("  "))
    deadline = time.monotonic() + 120
    while not ((run_dir / "archive.duckdb").exists() and _count(run_dir) >= 2):  # answered live by the driver
        assert time.monotonic() < deadline, "no evaluations in 120 s"
        time.sleep(1)
    stop = _shell(hints["stop it"].split("(")[0])  # as printed, from a shell that set nothing
    assert stop.returncode == 0, stop.stdout + stop.stderr
    logs = _shell(hints["follow it"].strip().replace(" -f ", " "))
    assert "search interrupted" in logs.stdout, logs.stdout + logs.stderr
    assert f"Continue with: atoll submit --resume {run_dir} --address" in logs.stdout
    assert f"(resume with: atoll submit --resume {run_dir} --address" in logs.stdout  # said as it started
    status = atoll(tmp_path, "status", run_dir)
    assert "interrupted" in status.stdout and _count(run_dir) >= 2  # everything finished was committed


def test_the_printed_hints_work_as_pasted_whatever_the_run_directory_is_called(head, tmp_path):
    """The run directory's name goes into the job's id: a space, `?` or `#` in it made hints that a
    shell took apart and a job id that Ray's URLs cut short ("Job atoll-b does not exist")."""
    odd = "/tmp/no such run?#1"  # not a run: the job fails at once, which is all the hints need
    out = atoll(tmp_path, "submit", "--resume", odd, "--address", head, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    hints = dict(line.strip().split(":", 1) for line in out.stdout.splitlines() if line.startswith("  "))
    logs = _shell(hints["follow it"])  # as printed: follows until the job ends
    assert logs.returncode == 0 and f"{odd} is not a run directory" in logs.stdout, logs.stdout + logs.stderr
    assert odd in shlex.split(hints["continue"]) and odd in shlex.split(hints["status"].split("(")[0])


def test_the_continue_hint_sends_the_drivers_home_not_this_machines():
    """`~/` in a run directory is the driver node's home: pasted here, the hint must not let this shell
    expand it to this user's home (the head's user is often another)."""
    from controller.submit import hints

    lines = dict(line.strip().split(":", 1) for line in hints("j", "~/runs/r 1", "http://h:8265", "ray").splitlines())
    said = _shell(f"printf '%s\\n' {lines['continue'].strip()}").stdout.splitlines()
    assert said == ["atoll", "submit", "--resume", "~/runs/r 1", "--address", "http://h:8265"]
    assert lines["status"].split("(")[0].split() == ["atoll", "status", "~/'runs/r", "1'"]  # the driver's shell expands it


@pytest.mark.slow
def test_a_ctrl_c_while_waiting_stops_the_printing_and_says_the_job_goes_on(head, tmp_path):
    """It said "stopped ...; what was committed before stays", as if the run had stopped: it had not."""
    run_dir = tmp_path / "run"
    proc = start(tmp_path, "submit", CONFIG, "--address", head, "--run-dir", run_dir, "--max-evals", 100000,
                 "--set", "evaluator.actors=1", "--no-report", "--wait")
    try:
        wait_for_evaluations(run_dir, 1, proc)  # the job runs, and the client prints its output
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode == 130 and err.strip().count("\n") == 0, err
    job = out.split("submitted job ", 1)[1].split()[0]
    assert f"stopped following job {job}, which goes on running on the cluster" in err
    jobs = atoll(tmp_path, "jobs", "--address", head)
    assert any(job in line and "RUNNING" in line for line in jobs.stdout.splitlines()), jobs.stdout
    hints = dict(line.strip().split(":", 1) for line in out.splitlines() if line.startswith("  "))
    assert _shell(hints["stop it"].split("(")[0]).returncode == 0


def test_the_job_servers_address_without_its_scheme_is_the_job_server(head, tmp_path):
    """HEAD:8265 without http://: Ray alone reads it as a GCS's address, and it took some 40 s, four
    lines of Ray's own and then "no Ray cluster's job server answers there", where one did."""
    bare = head.removeprefix("http://")
    jobs = atoll(tmp_path, "jobs", "--address", bare, timeout=60)
    assert jobs.returncode == 0 and not jobs.stderr and "run directory" in jobs.stdout, jobs.stderr
    out = atoll(tmp_path, "submit", "--resume", "/tmp/no-run", "--address", bare, timeout=60)
    assert out.returncode == 0 and "job logs -f atoll-no-run-" in out.stdout, out.stdout + out.stderr
    assert f"--address {head}" in out.stdout  # the hints give Ray's command the form it reads as meant
    nothing = atoll(tmp_path, "jobs", "--address", "127.0.0.1:9", timeout=60)  # nothing listens: at once
    assert nothing.returncode == 2 and nothing.stderr.strip().count("\n") == 0, nothing.stderr
    assert "no Ray cluster's job server answers there" in nothing.stderr


@pytest.mark.slow
def test_a_job_server_lost_while_waiting_is_one_line(tmp_path):
    """Its head stopped while `--wait` printed the job's output: a traceback ("WebSocket connection closed
    unexpectedly")."""
    run_dir = tmp_path / "run"
    with ray_head() as (address, temp):
        proc = start(tmp_path, "submit", CONFIG, "--address", address, "--run-dir", run_dir, "--max-evals", 100000,
                     "--set", "evaluator.actors=1", "--no-report", "--wait")
        try:
            wait_for_evaluations(run_dir, 1, proc)  # the job runs, and the client prints its output
            _stop(temp)
            _, err = proc.communicate(timeout=60)
        finally:
            kill_group(proc)
    assert proc.returncode == 2 and err.strip().count("\n") == 0, err
    assert f"lost the job server at {address} while following job atoll-run-" in err
    assert f"`atoll jobs --address {address}` says what became of the job" in err


def _shell(command: str) -> subprocess.CompletedProcess:
    """`command` in a shell whose environment has no RAY_AUTH_MODE, with this Python's `ray` first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PATH"] = f"{os.path.dirname(sys.executable)}:{env['PATH']}"
    return subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=90, check=False)


@pytest.mark.slow
def test_plain_ray_job_submit_puts_the_run_under_the_storage_root(head, tmp_path):
    root = tmp_path / "runs"
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # the client sends ~/.ray/auth_token
    out = subprocess.run([*RAY, "job", "submit", "--address", head, "--working-dir", ".", "--",
                          "python", "-m", "controller", "run", CONFIG, "--no-report", "--max-evals", "4",
                          "--set", "evaluator.actors=1", "--set", f"cluster.storage_root={root}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert out.returncode == 0 and "search completed: 4 evaluations" in out.stdout, out.stdout + out.stderr
    (run_dir,) = root.iterdir()  # outside Ray's copy of the working directory, which is gone
    assert run_dir.name.startswith("fixed-cost-") and _count(run_dir) == 4


def test_a_client_without_the_clusters_token_is_refused_in_one_line(head, tmp_path):
    wrong = tmp_path / "token"
    wrong.write_text("0" * 32)
    out = atoll(tmp_path, "submit", CONFIG, "--address", head, RAY_AUTH_TOKEN_PATH=str(wrong), timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "refused this client's token" in out.stderr


def test_in_a_ray_job_a_relative_run_dir_is_refused(tmp_path):
    out = atoll(tmp_path, "run", CONFIG, "--run-dir", "runs/x", RAY_JOB_CONFIG_JSON_ENV_VAR="{}", timeout=60)
    assert out.returncode == 2 and "lies in Ray's copy of the working directory" in out.stderr, out.stderr


@pytest.mark.parametrize("address", ["http://127.0.0.1:9", "ray://127.0.0.1:9"])
def test_submit_says_in_one_line_when_no_cluster_answers(tmp_path, address):
    """A Ray Client address (ray://) where nothing listens took 30 s and Ray's own lines before this one."""
    out = atoll(tmp_path, "submit", CONFIG, "--address", address, timeout=20)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "no Ray cluster's job server answers there" in out.stderr


@pytest.mark.parametrize("args, needle", [
    (["--run-dir", "runs/x"], "give an absolute path on the driver's node"),
    (["--resume", "/tmp/r"], "give a CONFIG to start a run, or --resume RUN_DIR"),
])
def test_submit_refuses_what_cannot_work_on_a_cluster(tmp_path, args, needle):
    out = atoll(tmp_path, "submit", CONFIG, "--address", "http://127.0.0.1:9", *args, timeout=60)
    assert out.returncode == 2 and needle in out.stderr and out.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(("item", "needle"), [
    ("domain.options.search_periods=9", "--set domain.options.search_periods=9: a resume cannot change the domain"),
    (" domain . name = 'milp'", "--set  domain . name = 'milp': a resume cannot change the domain or its options"),
    ("domain={name='milp'}", "--set domain={name='milp'}: a resume cannot change the domain or its options"),
    ("run.max_evals", "--set 'run.max_evals': expected section.key=value"),
])
def test_a_resume_that_would_change_the_domain_is_refused_before_it_is_sent(tmp_path, item, needle):
    out = atoll(tmp_path, "submit", "--resume", "/tmp/r", "--set", item, "--address", "http://127.0.0.1:9",
                timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert needle in out.stderr


def test_a_resume_that_points_the_data_at_a_new_path_is_sent_for_the_job_to_check(tmp_path):
    """The job's `atoll resume` takes it on the same content (tests/controller/test_resume_config.py)."""
    out = atoll(tmp_path, "submit", "--resume", "/tmp/r", "--set", "domain.options.demand_history.path=/new/d.csv",
                "--address", "http://127.0.0.1:9", timeout=60)
    assert out.returncode == 2 and "cannot change the domain" not in out.stderr, out.stderr
    assert "no Ray cluster's job server answers there" in out.stderr


def test_a_resume_from_the_backup_is_what_the_job_runs_and_a_new_run_has_none(tmp_path):
    from controller.cli import build_parser
    from controller.submit import entrypoint

    args = build_parser().parse_args(["submit", "--resume", "/runs/r 1", "--from-backup", "--no-report"])
    command, run_dir = entrypoint(args, None, None)
    assert command == "python -m controller resume '/runs/r 1' --from-backup --no-report" and run_dir == "/runs/r 1"
    # a lost head node's run: its copy in controller.backup_dir, read on the new driver's node
    args = build_parser().parse_args(["submit", "--resume", "~/runs/r", "--from-backup", "~/nfs/b/r 1.duckdb"])
    command, _ = entrypoint(args, None, None)
    assert command == "python -m controller resume ~/runs/r --from-backup ~/'nfs/b/r 1.duckdb'"
    out = atoll(tmp_path, "submit", "--resume", "/runs/r", "--from-backup", "b/r.duckdb", "--address",
                "http://127.0.0.1:9", timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "--from-backup b/r.duckdb: give the backup's absolute path on the driver's node" in out.stderr
    out = atoll(tmp_path, "submit", CONFIG, "--from-backup", "--address", "http://127.0.0.1:9", timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "submit: --from-backup goes with --resume RUN_DIR (a new run has no backup)" in out.stderr


def test_a_config_elsewhere_whose_domain_file_is_not_beside_it_is_refused(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text((ROOT / CONFIG).read_text().replace('path = "fixed_cost.py"',
                                                          f'path = "{ROOT / "benchmarks" / "fixed_cost.py"}"'))
    out = atoll(tmp_path, "submit", config, "--address", "http://127.0.0.1:9", timeout=60)
    assert out.returncode == 2 and "put the domain file beside the config" in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0


@pytest.mark.slow
def test_a_config_of_ones_own_outside_atolls_folder_runs_as_a_job(head, tmp_path):
    """What `pip install .` users meet: Atoll's code is not a checkout around the config. The job gets
    a folder made for it (Atoll's packages, the config's folder as job/), nothing else of this machine's."""
    mine = tmp_path / "mine"
    mine.mkdir()
    for name in ("fixed_cost.toml", "fixed_cost.py"):
        shutil.copy(ROOT / "benchmarks" / name, mine / name)
    (mine / "runs").mkdir()
    (mine / "runs" / "big.bin").write_bytes(b"0" * 2**20)  # never sent (EXCLUDES)
    run_dir = tmp_path / "run"
    out = atoll(tmp_path, "submit", mine / "fixed_cost.toml", "--address", head, "--run-dir", run_dir,
                "--max-evals", 4, "--set", "evaluator.actors=1", "--no-report", "--wait", timeout=180)
    assert out.returncode == 0 and "search completed: 4 evaluations" in out.stdout, out.stdout + out.stderr
    assert "python -m controller run job/fixed_cost.toml" in out.stdout  # the job's command, as Ray prints it
    assert _count(run_dir) == 4
    assert not list(Path(tempfile.gettempdir()).glob("atoll-job-*")), "the folder made for the job is removed"


@pytest.mark.parametrize("written", ["key.txt", "{mine}/key.txt"])
def test_an_api_key_file_that_would_travel_with_the_job_is_refused_before_anything_is_sent(tmp_path, written):
    """A key file beside the config went to the cluster in the job's folder, kept in Ray's store; a
    relative path could be read there only so. Refused in one line; a path outside the folder is sent."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "key.txt").write_text("sk-test-not-a-real-key\n")
    text = (ROOT / "configs" / "inventory_api.toml").read_text()
    config = mine / "api.toml"
    config.write_text(text.replace('api_key_env = "ATOLL_API_KEY"', f'api_key_file = "{written.format(mine=mine)}"'))
    out = atoll(tmp_path, "submit", config, "--address", "http://127.0.0.1:9", timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "mutator.llm model 'hosted': api_key_file" in out.stderr and "the key must not travel" in out.stderr
    (tmp_path / "key.txt").write_text("sk-test-not-a-real-key\n")
    config.write_text(text.replace('api_key_env = "ATOLL_API_KEY"', f'api_key_file = "{tmp_path / "key.txt"}"'))
    out = atoll(tmp_path, "submit", config, "--address", "http://127.0.0.1:9", timeout=60)
    assert out.returncode == 2 and "no Ray cluster's job server answers there" in out.stderr, out.stderr


def test_a_run_directory_a_socket_or_a_fifo_beside_the_config_stays_on_this_machine(tmp_path, monkeypatch):
    """A crashed run beside the config left its archive.sock there: making the job's folder stopped with a
    traceback (shutil.Error), and a live run's control.json (its control token) went to the cluster."""
    from controller import submit

    mine = tmp_path / "mine"
    (mine / "r1").mkdir(parents=True)
    (mine / "c.toml").write_text("")
    (mine / "d.py").write_text("")
    (mine / "r1" / "archive.duckdb").write_bytes(b"")
    (mine / "r1" / "control.json").write_text('{"token": "the-run-s-own-control-token"}')
    os.mkfifo(mine / "pipe")
    monkeypatch.chdir(mine / "r1")  # a socket's path has at most 107 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("archive.sock")
        with submit.working_dir(mine / "c.toml", str(mine / "d.py")) as (folder, shipped):
            sent = sorted(p.relative_to(folder / "job").as_posix() for p in (folder / "job").rglob("*"))
    assert shipped == "job/c.toml" and sent == ["c.toml", "d.py"]


def test_a_config_folder_too_big_to_send_is_refused_before_anything_is_sent(tmp_path, monkeypatch):
    from controller import submit

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "c.toml").write_text("")
    (mine / "data.bin").write_bytes(b"0" * 4096)
    monkeypatch.setattr(submit, "JOB_FOLDER_MAX", 1024)
    with pytest.raises(submit.UserError, match="holds more than 0 MiB: the config's folder travels to the cluster"), \
            submit.working_dir(mine / "c.toml", None):
        pass


def test_an_installed_atoll_sends_its_packages_and_the_configs_folder(tmp_path, monkeypatch):
    """Installed (no checkout around the code), even a shipped config goes as job/ beside Atoll's packages."""
    from controller import submit

    monkeypatch.setattr(submit, "checkout", lambda: None)
    with submit.working_dir(ROOT / CONFIG, str(ROOT / "benchmarks" / "fixed_cost.py")) as (folder, config):
        assert config == "job/fixed_cost.toml" and (folder / config).is_file()
        assert sorted(p.name for p in folder.iterdir()) == sorted([*submit.PACKAGES, "job"])
        assert (folder / "controller" / "__main__.py").is_file() and (folder / "store" / "schema").is_dir()
        assert not list(folder.rglob("__pycache__"))
    assert not folder.exists()
    with submit.working_dir(None, None) as (folder, config):  # a resume: Atoll's packages only
        assert config is None and sorted(p.name for p in folder.iterdir()) == sorted(submit.PACKAGES)


def _inventory_on_own_data(folder: Path, demand: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "inv.toml"
    config.write_text((ROOT / "configs" / "inventory.toml").read_text()
                      + f'\n[domain.options]\ndemand_history = {{ path = "{demand}", lead_times = [1, 2] }}\n')
    return config


def test_a_data_file_named_by_a_relative_path_outside_the_travelling_folder_is_refused(tmp_path):
    """On the cluster the relative path would resolve inside the job's copy of the config's folder and find
    nothing: refused before anything is sent, in one line."""
    from tests.userdata_files import write_demand

    write_demand(tmp_path / "demand.csv")
    config = _inventory_on_own_data(tmp_path / "mine", "../demand.csv")
    out = atoll(tmp_path, "submit", config, "--address", "http://127.0.0.1:9", timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "domain.options.demand_history = '../demand.csv' lies outside" in out.stderr and "put the file in that " \
        "folder, or name it by an absolute path" in out.stderr


def test_a_data_file_beside_the_config_travels_and_one_named_by_an_absolute_path_is_noted(tmp_path):
    from controller.config import load_config
    from controller.submit import check_data, data_files
    from tests.userdata_files import write_demand

    (tmp_path / "mine" / "data").mkdir(parents=True)
    write_demand(tmp_path / "mine" / "data" / "demand.csv")
    beside = _inventory_on_own_data(tmp_path / "mine", "data/demand.csv")
    files = data_files(beside, [], load_config(beside)[0])
    assert files == [("demand_history", "data/demand.csv", (tmp_path / "mine" / "data" / "demand.csv").resolve())]
    assert check_data(beside, files) == []
    (tmp_path / "shared").mkdir()
    shared = write_demand(tmp_path / "shared" / "demand.csv")
    elsewhere = _inventory_on_own_data(tmp_path / "other", str(shared))
    notes = check_data(elsewhere, data_files(elsewhere, [], load_config(elsewhere)[0]))
    assert len(notes) == 1 and f"domain.options.demand_history ({shared.resolve()}) lies outside" in notes[0]
    moved = data_files(elsewhere, ["domain.options.demand_history.path=../mine/data/demand.csv"],
                       load_config(elsewhere, ["domain.options.demand_history.path=../mine/data/demand.csv"])[0])
    assert moved[0][1] == "../mine/data/demand.csv"  # --set counts as written
