"""The control plane over real gRPC on loopback, against live tiny runs of the real CLI.

One run is steered through a first segment (raise the budget, status, a wrong token,
events, pause, bad budget changes, continue, stop) and resumed in a second segment
bound beyond loopback with the user's token (lower the budget; the run ends exactly
there; `atoll watch` follows it to the end). A run in a network namespace of its own, as
under `unshare -n`, is steered from outside it (refused: live, out of reach) and from inside.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest

from controller import control
from controller.cli import UserError
from controller.control_client import CONNECT_S, ControlClient
from controller.control_server import WATCHERS, WORKERS, ControlPlane, pb, rpc
from controller.steering import Steering
from store.query import run_query
from tests.controller.runs import CONFIG, ROOT, TINY, atoll, committed_ids, counts, env, kill_group, proposed_texts, start

TOKEN = "a-user-token-of-32-characters-xy"


def wait_for(what, check, proc, limit=90.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended early: {proc.communicate()}"
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def live_count(run_dir) -> int:
    try:
        return counts(run_dir)[0]
    except Exception:  # noqa: BLE001  the archive may not hold a run yet
        return 0


def follow(client, kinds: list) -> threading.Thread:
    def run():
        for event in client.events():
            kinds.append((event.kind, json.loads(event.detail_json)))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def segment_one(tmp_path_factory):
    """Start a run with 4 evaluations, steer it, stop it through the control plane; what was seen."""
    tmp = tmp_path_factory.mktemp("control")
    run_dir = tmp / "run"
    seen = {"run_dir": run_dir, "tmp": tmp}
    proc = start(tmp, "run", CONFIG, *TINY, "--set", "run.max_evals=4", "--run-dir", run_dir, "--no-report")
    try:
        record = wait_for("control.json", lambda: control.read_record(run_dir), proc, limit=180)
        client = ControlClient(run_dir)
        events: list = []
        stream = follow(client, events)
        seen["raised"] = client.set_budget("run.max_evals", "60")
        seen["past_old_budget"] = wait_for("5 evaluations", lambda: live_count(run_dir) >= 5, proc)
        seen["status"] = client.status()
        seen["refused"] = _wrong_tokens(record)
        seen["paused_after_wrong_tokens"] = client.status().paused
        seen["pause"] = atoll(tmp, "pause", run_dir, timeout=60)
        _check_pause_holds(client, run_dir, proc, seen)
        seen["bad_cli"] = atoll(tmp, "set", run_dir, "run.max_evals=abc", timeout=60)
        seen["bad_sets"] = [seen["bad_cli"].stderr]
        seen["bad_sets"] += [_refusal(lambda item=item: client.set_budget(*item.split("=")))
                             for item in ("run.seed=3", "run.max_evals=1", "mutator.llm.budget.calls=5")]
        seen["continue"] = atoll(tmp, "continue", run_dir, timeout=60)
        wait_for("progress after continue", lambda: live_count(run_dir) >= seen["held"] + 2, proc)
        seen["stop"] = atoll(tmp, "stop", run_dir, timeout=60)
        seen["out"], seen["err"] = proc.communicate(timeout=120)
        seen["exit"] = proc.returncode
        stream.join(timeout=30)
        seen["events"] = events
        seen["after"] = [atoll(tmp, "watch", run_dir, timeout=60)]
        seen["after_client"] = _refusal(lambda: ControlClient(run_dir))
    finally:
        kill_group(proc)
    return seen


def _refusal(call) -> str:
    try:
        call()
    except UserError as exc:
        return f"atoll: {exc}"
    return "accepted"


def _wrong_tokens(record) -> dict:
    """Calls with a wrong token, or none, over raw gRPC."""
    stub = rpc.ControlStub(grpc.insecure_channel(control.client_address(record["address"])))
    codes = {}
    for name, metadata in (("wrong", ((control.TOKEN_HEADER, "x" * 32),)), ("none", ())):
        for method, request in (("Pause", pb.PauseRequest()), ("Status", pb.StatusRequest())):
            try:
                getattr(stub, method)(request, metadata=metadata, timeout=30)
                codes[f"{method} {name}"] = "OK"
            except grpc.RpcError as exc:
                codes[f"{method} {name}"] = exc.code()
        try:
            next(iter(stub.Events(pb.EventsRequest(), metadata=metadata, timeout=30)))
        except grpc.RpcError as exc:
            codes[f"Events {name}"] = exc.code()
    return codes


def _check_pause_holds(client, run_dir, proc, seen) -> None:
    """Paused: what is in flight finishes and is committed, then nothing new starts."""
    wait_for("in-flight work to finish", lambda: client.status().in_flight == 0, proc)
    status = wait_for("everything finished to be committed",
                      lambda: (s := client.status()).evaluations == live_count(run_dir) and s, proc)
    seen["held"], seen["held_samples"] = status.evaluations, []
    for _ in range(8):  # two seconds of a paused run with nothing in flight: nothing new may start
        time.sleep(0.25)
        s = client.status()
        seen["held_samples"].append((s.paused, s.in_flight, s.evaluations, live_count(run_dir)))


def test_every_call_works_on_a_live_run_and_a_wrong_token_is_refused(segment_one):
    seen = segment_one
    assert seen["raised"].startswith("run.max_evals = 60") and seen["past_old_budget"]
    status = seen["status"]
    budgets = {b.name: b for b in status.budgets}
    assert budgets["evaluations"].limit == 60 and budgets["evaluations"].used >= 5
    assert budgets["wall_s"].limit == 240 and budgets["wall_s"].left < 240
    assert status.run_id and not status.paused and len(status.islands) == 2 and status.HasField("best")
    assert status.evals_per_s > 0 and status.protections
    codes = seen["refused"]
    assert len(codes) == 6 and set(codes.values()) == {grpc.StatusCode.UNAUTHENTICATED}, codes
    assert seen["paused_after_wrong_tokens"] is False
    assert seen["pause"].returncode == 0 and seen["pause"].stdout.startswith("paused")
    assert f"(continue with: atoll continue {seen['run_dir']})" in seen["pause"].stdout  # the run's own directory
    assert seen["held_samples"] and all(s == (True, 0, seen["held"], seen["held"]) for s in seen["held_samples"])
    messages = [m.strip() for m in seen["bad_sets"]]
    assert seen["bad_cli"].returncode == 2 and all("\n" not in m for m in messages)
    assert messages[0] == "atoll: run.max_evals: Input should be a valid integer, unable to parse string as an integer"
    assert messages[1].startswith("atoll: run.seed: not a budget that can change during a run")
    assert messages[2] == (f"atoll: run.max_evals: 1 is below the {seen['held']} evaluations finished or under way; "
                           f"give at least {seen['held']}")
    assert messages[3] == ("atoll: mutator.llm.budget.calls: this run has no LLM models ([mutator.llm]), "
                           "so it has no LLM budget")
    assert seen["continue"].returncode == 0 and seen["continue"].stdout.startswith("resumed")
    kinds = [kind for kind, _ in seen["events"]]
    for kind in ("budget-set", "new-best", "paused", "resumed", "stopping", "ended"):
        assert kind in kinds, kinds
    assert seen["events"][-1] == ("ended", {"status": "interrupted"})
    # and in the archive, for whoever asks later what happened to the run
    archived = run_query(seen["run_dir"], "SELECT kind, data FROM events WHERE kind IN ('started', 'paused', "
                                          "'resumed', 'stopping', 'budget-set') ORDER BY ts")[1]
    kinds = [kind for kind, _ in archived]
    assert kinds[0] == "started" and kinds[-1] == "stopping" and {"paused", "resumed", "budget-set"} <= set(kinds)
    assert json.loads(archived[-1][1])["by"] == "atoll stop", archived


def test_stop_commits_everything_and_resume_ends_exactly_at_a_lowered_budget(segment_one):
    seen, run_dir, tmp = segment_one, segment_one["run_dir"], segment_one["tmp"]
    assert seen["stop"].returncode == 0 and seen["stop"].stdout.startswith("stopping as on Ctrl-C")
    assert seen["exit"] == 130 and f"Continue with: atoll resume {run_dir}" in seen["out"]
    assert not (run_dir / control.RECORD).exists()
    not_live = (f"atoll: {run_dir}: the run is not live (no driver is running it now); "
                f"`atoll status {run_dir}` shows where it stands")
    assert seen["after"][0].returncode == 2 and seen["after"][0].stderr.strip() == not_live
    assert seen["after_client"] == not_live
    stopped = len(committed_ids(run_dir))
    assert seen["held"] + 2 <= stopped < 60
    proc = start(tmp, "resume", run_dir, "--no-report", "--set", "control.host=0.0.0.0",
                 ATOLL_CONTROL_TOKEN=TOKEN)
    try:
        record = wait_for("control.json", lambda: control.read_record(run_dir), proc, limit=180)
        assert record["token"] is None and record["address"].startswith("0.0.0.0:")
        no_token = atoll(tmp, "set", run_dir, "run.max_evals=30", timeout=60)
        (tmp / "wrong").write_text("y" * 32)
        wrong = atoll(tmp, "pause", run_dir, "--token-file", tmp / "wrong", timeout=60)
        watch = start(tmp, "watch", run_dir, "--every", "1", ATOLL_CONTROL_TOKEN=TOKEN)
        # paused first, so the budget can be lowered to 6 past what is done however fast the run goes
        # (unpaused, a fast machine had finished more than that before the call arrived, and it was refused)
        paused = atoll(tmp, "pause", run_dir, timeout=60, ATOLL_CONTROL_TOKEN=TOKEN)
        wrong_watch = atoll(tmp, "watch", run_dir, "--token-file", tmp / "wrong", "--every", "1", timeout=60)
        client = ControlClient(run_dir, token=TOKEN)
        wait_for("in-flight work to finish", lambda: client.status().in_flight == 0, proc)
        settled = wait_for("everything finished to be committed",
                           lambda: (s := client.status()).evaluations == live_count(run_dir) and s, proc)
        target = settled.evaluations + 6
        lowered = atoll(tmp, "set", run_dir, f"run.max_evals={target}", timeout=60, ATOLL_CONTROL_TOKEN=TOKEN)
        resumed = atoll(tmp, "continue", run_dir, timeout=60, ATOLL_CONTROL_TOKEN=TOKEN)
        out, err = proc.communicate(timeout=150)
        watched, _ = watch.communicate(timeout=60)
    finally:
        kill_group(proc)
        if "watch" in locals():
            kill_group(watch)
    assert no_token.returncode == 2 and "needs its token: set ATOLL_CONTROL_TOKEN" in no_token.stderr
    assert wrong.returncode == 2 and "refused the token (wrong or missing control token)" in wrong.stderr
    # a refused watch says so, and not that the run ended (it goes on)
    assert wrong_watch.returncode == 2 and wrong_watch.stdout == "", (wrong_watch.stdout, wrong_watch.stderr)
    assert "refused the token (wrong or missing control token)" in wrong_watch.stderr
    assert paused.returncode == 0 and resumed.returncode == 0, (paused.stderr, resumed.stderr)
    assert stopped <= settled.evaluations < 54
    assert lowered.returncode == 0, lowered.stderr
    assert proc.returncode == 0 and f"search completed: {target} evaluations" in out, (out, err)
    assert counts(run_dir) == (target, target) and proposed_texts(run_dir) == target
    assert watch.returncode == 0 and "evaluations" in watched
    assert 'ended {"status": "completed"}' in watched and watched.rstrip().endswith("the run ended: completed")


def test_a_run_bound_beyond_loopback_without_a_token_is_refused_before_it_exists(tmp_path):
    run_dir = tmp_path / "run"
    refused = atoll(tmp_path, "run", CONFIG, "--set", "control.host=0.0.0.0", "--run-dir", run_dir, timeout=120)
    assert refused.returncode == 2 and refused.stderr.strip().startswith(
        "atoll: control.host=0.0.0.0 is not a loopback address, so the control plane needs a token")
    assert not (run_dir / "archive.duckdb").exists()


@pytest.mark.parametrize("token_file, token_env", [(None, "tökentökentökentöken"),
                                                    (bytes(range(128, 176)), None)], ids=["non-ascii", "random-bytes"])
def test_a_token_that_grpc_cannot_carry_is_refused_before_the_run_exists(tmp_path, token_file, token_env):
    """A token of non-ASCII characters, or random bytes in its file, made a run that every steering call
    failed on (INTERNAL: Invalid metadata), or a UnicodeDecodeError traceback."""
    run_dir, extra, args = tmp_path / "run", {}, []
    if token_env:
        extra[control.TOKEN_ENV] = token_env
    if token_file:
        (tmp_path / "token").write_bytes(token_file)
        args = ["--set", f"control.token_file={tmp_path / 'token'}"]
    refused = atoll(tmp_path, "run", CONFIG, *TINY, *args, "--max-evals", "2", "--no-report", "--run-dir", run_dir,
                    timeout=120, **extra)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "the token must be printable ASCII" in refused.stderr and "openssl rand -hex" in refused.stderr
    assert not (run_dir / "archive.duckdb").exists()


def _in_a_network_namespace_of_its_own(tmp_path, *args) -> subprocess.Popen:
    """`atoll ARGS` as the README starts a run, under `unshare -n`: its loopback is not the test's."""
    return subprocess.Popen(["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" -m controller "$@"',
                             sys.executable, *map(str, args)], cwd=ROOT, env=env(tmp_path), start_new_session=True,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _behind_a_dropping_firewall(tmp_path, run_dir):
    """`atoll pause` with the run's control.json pointed at a port that takes connections and never
    answers, as when a firewall drops the packets; the record is put back after. (result, seconds)"""
    record = run_dir / control.RECORD
    kept = record.read_bytes()
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(0)  # never accepted: the connection hangs unanswered
        moved = dict(json.loads(kept), address=f"127.0.0.1:{hole.getsockname()[1]}")
        record.write_text(json.dumps(moved))
        try:
            began = time.monotonic()
            out = atoll(tmp_path, "pause", run_dir, timeout=60)
            return out, time.monotonic() - began
        finally:
            record.write_bytes(kept)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")),
                    reason="needs root, unshare and nsenter (util-linux) to give the run a network namespace")
def test_a_live_run_whose_control_plane_is_out_of_reach_is_said_to_be_live_and_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    proc = _in_a_network_namespace_of_its_own(tmp_path, "run", CONFIG, *TINY, "--set", "run.max_evals=400",
                                              "--run-dir", run_dir, "--no-report")
    try:
        record = wait_for("control.json", lambda: control.read_record(run_dir), proc, limit=180)
        pause = atoll(tmp_path, "pause", run_dir, timeout=60)
        watch = atoll(tmp_path, "watch", run_dir, "--every", "1", timeout=60)
        status = atoll(tmp_path, "status", run_dir, timeout=60)
        dropped, dropped_s = _behind_a_dropping_firewall(tmp_path, run_dir)
        refused_at = live_count(run_dir)
        wait_for("progress after the refusals", lambda: live_count(run_dir) >= refused_at + 2, proc)
        steered = subprocess.run(["nsenter", "-n", "-t", str(record["pid"]), sys.executable, "-m", "controller",
                                  "stop", str(run_dir)], cwd=ROOT, env=env(tmp_path), capture_output=True,
                                 text=True, timeout=60, check=False)  # as the refusal says, from the run's namespace
        out, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    pid, address = record["pid"], record["address"]
    for refused in (pause, watch):
        line = refused.stderr.strip()
        assert refused.returncode == 2 and refused.stdout == "" and "\n" not in line, (refused.stdout, line)
        assert line.startswith(f"atoll: {run_dir}: the run is live (driver pid {pid}), but its control plane at "
                               f"{address} cannot be reached from here (failed to connect"), line
        assert line.endswith(": this shell is likely in another network namespace or on another host than the run "
                             "(a run started under `unshare -n`, say), or a firewall is in the way. `atoll status` "
                             "and `atoll query` still work; to steer it, run this command in the run's network "
                             f"namespace (as root: nsenter -n -t {pid} atoll ...)"), line
    assert status.returncode == 0 and f"live run: answered by the process holding it (pid {pid})" in status.stderr
    line = dropped.stderr.strip()
    assert dropped.returncode == 2 and f"the run is live (driver pid {pid}), but its control plane at " in line, line
    assert f"cannot be reached from here (no answer to a connection within {CONNECT_S:g} s)" in line, line
    assert dropped_s < CONNECT_S + 8, dropped_s  # not the call's 40 s deadline
    assert steered.returncode == 0 and steered.stdout.startswith("stopping as on Ctrl-C"), steered.stderr
    assert proc.returncode == 130 and f"Continue with: atoll resume {run_dir}" in out, (out, err[-3000:])
    kinds = [kind for (kind,) in run_query(run_dir, "SELECT kind FROM events ORDER BY ts")[1]]
    assert "paused" not in kinds and kinds.count("stopping") == 1, kinds  # the refused pause never reached it


def _drain_ends(run_dir) -> float | None:
    """When the run's wall-time drain ends (seconds since the epoch), once it has begun and is archived."""
    try:
        rows = run_query(run_dir, "SELECT ts, data FROM events WHERE kind = 'wall-time-reached'")[1]
    except Exception:  # noqa: BLE001  the archive may not hold a run yet
        return None
    return rows[0][0] + json.loads(rows[0][1])["finish_within_s"] if rows else None


@pytest.mark.slow
def test_more_wall_time_given_while_the_run_drains_lets_it_search_on(tmp_path):
    """`atoll set run.max_wall_s` after the wall time was spent, while what was in flight finished: the
    run searched on until the drain's end, then dropped all its work at every tick until the new time ran out."""
    run_dir = tmp_path / "run"
    proc = start(tmp_path, "run", CONFIG, *TINY, "--set", "run.max_evals=400", "--set", "run.max_wall_s=3",
                 "--set", "evaluator.sandbox.wall_s=8", "--run-dir", run_dir, "--no-report")
    try:
        drain_ends = wait_for("the wall time to be spent", lambda: _drain_ends(run_dir), proc, limit=180)
        with ControlClient(run_dir) as client:
            raised = client.set_budget("run.max_wall_s", "600")
        wait_for("the drain's end", lambda: time.time() > drain_ends + 1, proc)
        after = live_count(run_dir)
        wait_for("evaluations after the drain's end", lambda: live_count(run_dir) >= after + 3, proc, limit=45)
        stopped = atoll(tmp_path, "stop", run_dir, timeout=60)
        _, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert raised.startswith("run.max_wall_s = 600"), raised
    assert stopped.returncode == 0 and proc.returncode == 130, (stopped.stderr, err[-2000:])


def _answer(call) -> str:
    try:
        return call()
    except UserError as exc:
        return f"atoll: {exc}"


def _answering(steering: Steering, done: threading.Event) -> None:
    """The run loop's part, without a search: answer every command at a tick."""
    while not done.is_set():
        for command, future in steering.take():
            future.set_result(f"{command.kind} done")
        time.sleep(0.05)


def test_a_crowd_of_watchers_never_locks_out_pause_and_stop(tmp_path, monkeypatch):
    """Each event stream holds one of the server's threads: 16 watchers (or clients that open a stream and
    never read it) took them all, and every pause, stop or set waited out its deadline. Past WATCHERS
    streams, a watcher is refused in one line and every other call is answered."""
    monkeypatch.setattr("controller.control_client.TIMEOUT_S", 10.0)
    (tmp_path / "archive.duckdb").touch()  # a run directory, for the client
    steering, done = Steering(), threading.Event()
    with ControlPlane(control.Setup("127.0.0.1", 0, "t" * 24, True), tmp_path, steering), \
            ControlClient(tmp_path) as client:
        threading.Thread(target=_answering, args=(steering, done), daemon=True).start()
        streams = [client.stub.Events(pb.EventsRequest(), metadata=client.metadata) for _ in range(WORKERS + 4)]
        deadline = time.monotonic() + 30  # every stream is served, or refused, or holds a thread
        while len(steering._subscribers) + sum(s.done() for s in streams) < WORKERS and time.monotonic() < deadline:
            time.sleep(0.05)
        paused = _answer(lambda: client.call("Pause", pb.PauseRequest()).message)
        stopped = _answer(lambda: client.call("Stop", pb.StopRequest()).message)
        watcher = []  # a thread: with no thread left to serve it, the stream waited for ever
        threading.Thread(target=lambda: watcher.append(_refusal(lambda: next(client.events()))), daemon=True).start()
        deadline = time.monotonic() + 15
        while not watcher and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = [s.code() for s in streams if s.done()]
        done.set()
        for stream in streams:
            stream.cancel()
    assert (paused, stopped) == ("pause done", "stop done")
    assert refused == [grpc.StatusCode.RESOURCE_EXHAUSTED] * (WORKERS + 4 - WATCHERS)
    assert watcher == [(f"atoll: {tmp_path}: {WATCHERS} watchers already follow this run, the most it serves at "
                        "once (so pause, continue, stop and set are always answered); end one (Ctrl-C in its "
                        "`atoll watch`) and watch again")], watcher


def test_a_command_to_a_search_that_just_ended_says_so_not_that_it_is_out_of_reach(tmp_path):
    """A command that arrives while the driver finishes (its last commit, a stop's shutdown) is refused by
    the ended search: that was said as a control plane "that cannot be reached from here", in another
    network namespace or behind a firewall."""
    from store.duckdb_archive import DuckDBArchive

    steering = Steering()
    with DuckDBArchive(tmp_path / "archive.duckdb"), \
            ControlPlane(control.Setup("127.0.0.1", 0, "t" * 24, True), tmp_path, steering):  # this the driver
        steering.end("interrupted")
        refused = atoll(tmp_path, "pause", tmp_path, timeout=60)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"atoll: {tmp_path}: the search has ended (interrupted): its driver is finishing and takes no more "
        f"commands; `atoll status {tmp_path}` shows where it stands"), refused.stderr


def test_a_raced_child_is_a_raced_event_and_never_counted_as_a_failure(tmp_path):
    """Racing stops a child that is clearly worse than its parent: a partial evaluation, which `atoll status`
    counts apart from failures. The control plane called it a failure: `atoll watch` showed "failures RACED 5"
    and a `failure` event for each raced child."""
    from tests.controller.test_racing_cli import CONFIG as RACING
    from tests.controller.test_racing_cli import DOMAIN as TARGETS

    (tmp_path / "targets.py").write_text(TARGETS)
    (tmp_path / "racing.toml").write_text(RACING)
    run_dir = tmp_path / "run"
    proc = start(tmp_path, "run", tmp_path / "racing.toml", "--run-dir", run_dir, "--no-report",
                 "--set", "run.max_evals=100000")
    try:
        wait_for("control.json", lambda: control.read_record(run_dir), proc, limit=180)
        with ControlClient(run_dir) as client:
            events: list = []
            follow(client, events)
            wait_for("a raced child in the archive", lambda: run_query(
                run_dir, "SELECT count(*) FROM evaluations WHERE status = 'RACED'")[1][0][0], proc)
            wait_for("its event", lambda: [d for k, d in events if d.get("status") == "RACED"], proc)
            failures = {f.kind for f in client.status().failures}
            client.call("Stop", pb.StopRequest())
        proc.wait(timeout=120)
    finally:
        kill_group(proc)
    assert "RACED" not in failures
    assert {k for k, d in events if d.get("status") == "RACED"} == {"raced"}


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_a_run_bound_to_the_ipv6_loopback_can_be_steered(tmp_path):
    """control.host = "::1" is a loopback address, so the run started without a token of the user's; its
    control.json gave the address as ::1:PORT, which gRPC cannot parse, and every command said the live
    run's control plane could not be reached from here (another network namespace, a firewall)."""
    (tmp_path / "archive.duckdb").touch()  # a run directory, for the client
    steering, done = Steering(), threading.Event()
    threading.Thread(target=_answering, args=(steering, done), daemon=True).start()
    try:
        with ControlPlane(control.Setup("::1", 0, "t" * 24, True), tmp_path, steering) as plane, \
                ControlClient(tmp_path) as client:
            paused = _answer(lambda: client.call("Pause", pb.PauseRequest()).message)
    finally:
        done.set()
    assert paused == "pause done"
    assert plane.address.startswith("[::1]:")


def test_a_command_to_a_driver_that_serves_no_control_plane_says_so_not_that_none_runs(tmp_path):
    """While its driver writes the held-out report (or starts, or runs with control.enabled = false) a run
    has no control.json, and `atoll stop` said "no driver is running it now" of a driver running for minutes."""
    from store.duckdb_archive import DuckDBArchive

    with DuckDBArchive(tmp_path / "archive.duckdb"):  # this process: the driver, its search ended
        held = atoll(tmp_path, "stop", tmp_path, timeout=60)
    gone = atoll(tmp_path, "stop", tmp_path, timeout=60)
    assert held.returncode == 2 and held.stderr.count("\n") == 1, held.stderr
    assert "a process holds the run's archive (its driver, or `atoll report`) but serves no control plane now" \
        in held.stderr and "no driver is running it" not in held.stderr, held.stderr
    assert gone.returncode == 2 and "the run is not live (no driver is running it now)" in gone.stderr, gone.stderr


def test_watch_s_status_line_in_a_log_says_whether_the_run_is_paused():
    """Into a file or a pipe `atoll watch` prints a status line every few seconds: a paused run's said nothing of
    the pause (only evaluations that no longer moved), for whoever joined after the `paused` event."""
    from controller.control_server import status_reply
    from controller.watch import status_line

    status = {"run_id": "r", "evaluations": 7, "elapsed_s": 3.0, "evals_per_s": 0.0, "proposals_per_s": 0.0,
              "in_flight": 0, "best": -1.5, "islands": [-1.5, None], "failures": {}, "protections": ["rlimits"],
              "budgets": [("evaluations", 7, 50), ("wall_s", 3.0, 240.0)]}
    paused, running = (status_line(status_reply({**status, "paused": p})) for p in (True, False))
    assert "state paused " in paused and "state running " in running
    assert "evaluations 7 / 50" in paused and "island 0 best" not in paused and "rlimits" not in paused


def test_a_budget_of_thousands_of_digits_is_refused_in_one_line_and_the_run_goes_on(tmp_path):
    """`atoll set RUN run.max_evals=999...` (5,000 digits) raised Python's ValueError for integer strings that
    long in the run loop, which ended the live run with a traceback; `atoll run --set` with it was one too."""
    from controller.config import load_config
    from controller.helm import budget_change
    from controller.steering import Refused

    huge = "9" * 5000
    with pytest.raises(Refused, match="run.max_evals: Unable to parse input string as an integer"):
        budget_change(load_config(CONFIG, [])[0], "run.max_evals", huge, 0)
    out = atoll(tmp_path, "run", CONFIG, "--set", f"run.max_evals={huge}", "--run-dir", tmp_path / "r", timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "run.max_evals" in out.stderr, out.stderr[-500:]


def test_two_runs_given_one_control_port_never_share_it(tmp_path):
    """gRPC binds with SO_REUSEPORT: a second run given the same control.port bound it too, the kernel shared
    the connections between the two drivers, and with the user's one token `atoll stop A` stopped run B."""
    from workers.llm.local_server import free_port

    port, first, second = free_port(), tmp_path / "a", tmp_path / "b"
    for run_dir in (first, second):
        run_dir.mkdir()
    with ControlPlane(control.Setup("127.0.0.1", port, TOKEN, False), first, Steering()):
        with pytest.raises(UserError, match=f"cannot bind 127.0.0.1:{port} for the control plane"):
            control.prepare(control.ControlConfig(port=port))  # before the second run exists
        with pytest.raises(UserError, match=f"cannot bind 127.0.0.1:{port} for the control plane"), \
                ControlPlane(control.Setup("127.0.0.1", port, TOKEN, False), second, Steering()):
            pass  # and should the port be taken between the check and the bind
    assert not (second / control.RECORD).exists()
    assert control.prepare(control.ControlConfig(port=port)).port == port  # free again once the first ended
