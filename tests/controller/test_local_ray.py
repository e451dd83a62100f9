"""The Ray an `atoll` command starts for itself: its workers find Atoll and the caller's path
without a runtime_env, it starts with a home that cannot be written, it runs neither the log
monitor nor the autoscaler monitor (nobody reads the one, nothing scales, and Ray's shutdown
waited a second on the other) nor the dashboard's API server (ray.init waited for it), its dashboard agent gathers node statistics once a minute, the driver learns
that the full dashboard's packages are installed without importing them, ray.init finds its new
node as soon as it is alive (not a second later), and its session folder is removed at a clean exit,
which does not wait half a second for workers' log lines the driver never prints."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

SCRIPT = r'''
import json, os, sys
sys.path.insert(0, os.environ["SRC"])  # the driver finds Atoll as `atoll` does; its workers only through connect
import ray
from ray._private import services, state

import controller.actors
from controller.actors import connect

started = []  # the helpers Ray started: neither should be

def watched(name):
    start = getattr(services, name)
    def call(*args, **kwargs):
        started.append(name)
        return start(*args, **kwargs)
    return call

for name in ("start_log_monitor", "start_monitor"):
    setattr(services, name, watched(name))

def timed(call, times):  # `call`, each call's seconds appended to `times`
    def timed_call(*args):
        import time
        start = time.monotonic()
        try:
            return call(*args)
        finally:
            times.append(time.monotonic() - start)
    return timed_call

asked, waited = [], []  # Ray's own calls for its new node; the node table's reading before each
services.get_node = timed(services.get_node, asked)
controller.actors._wait_for_node = timed(controller.actors._wait_for_node, waited)
if os.environ.get("NO_NODE_TABLE"):  # the node table cannot be read: Ray's own call decides, as before
    def broken(self):
        raise RuntimeError("no node table")
    state.GlobalState.node_table = broken
import atexit, time
slept = []  # the sleeps of the command's exit (its handlers run last registered, first run)
atexit.register(lambda: print(json.dumps({{"exit slept": slept}}), flush=True))  # after Atoll's own
connect(None, 1)
def watch_sleeps():
    sleep = time.sleep
    def recorded(seconds):
        slept.append(seconds)
        sleep(seconds)
    time.sleep = recorded
atexit.register(watch_sleeps)  # before Atoll's own, which stops its Ray
dashboard_deps_imported = "aiohttp" in sys.modules
print(json.dumps({{"connected": sorted(ray._private.worker._global_node.all_processes)}}), flush=True)
assert os.environ.get("PYTHONPATH") == {pythonpath!r}, "the driver's own environment is left as it was"
job = ray.get_runtime_context().runtime_env

@ray.remote(num_cpus=1)
class Probe:
    def where(self):
        import controller.actors, user_pkg_for_probe
        return controller.actors.__file__, user_pkg_for_probe.X

found = ray.get(Probe.remote().where.remote())

def minimal_agent():  # how the raylet starts its dashboard agent (None: it says nothing of one)
    with open(f"/proc/{{raylet}}/cmdline", "rb") as f:
        for arg in f.read().split(b"\0"):
            if arg.startswith(b"--dashboard_agent_command="):
                return b"--minimal" in arg.split()
    return None
raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
with open(f"/proc/{{raylet}}/environ", "rb") as f:  # what the raylet hands its dashboard agent
    environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if item)
print(json.dumps({{"found": found, "runtime_env": job, "auth": os.environ.get("RAY_AUTH_MODE"),
                  "own token": "RAY_AUTH_TOKEN" in os.environ,
                  "agent's": environ.get(b"REPORTER_UPDATE_INTERVAL_MS", b"").decode(),
                  "metrics": environ.get(b"RAY_enable_metrics_collection", b"").decode(),
                  "event stats": environ.get(b"RAY_event_stats", b"").decode(),
                  "driver's metrics": os.environ.get("RAY_enable_metrics_collection"),
                  "driver's": os.environ.get("REPORTER_UPDATE_INTERVAL_MS"),
                  "session": ray._private.worker._global_node.get_session_dir_path(),
                  "asked": asked, "waited": waited, "helpers started": started, "deps imported": dashboard_deps_imported,
                  "minimal agent": minimal_agent()}}), flush=True)
from ray._private.utils import get_dashboard_dependency_error
print(json.dumps({{"rays own answer": get_dashboard_dependency_error() is not None}}), flush=True)
if os.environ.get("END_IN_A_TRACEBACK"):
    raise RuntimeError("a bug of the command's own")
'''


@pytest.mark.parametrize("home", ["a home of its own", "a home that cannot be written"])
def test_a_local_rays_workers_import_atoll_and_the_callers_path_and_its_idle_helpers_never_start(tmp_path, home):
    (tmp_path / "user_pkg_for_probe.py").write_text("X = 42\n")
    pythonpath = str(tmp_path)  # the caller's path only: Atoll's tree is added for the workers
    if home == "a home of its own":
        (tmp_path / "home").mkdir()
    else:
        (tmp_path / "home").write_text("")  # a file: no ~/.ray can be made in it, even by root
    # the dashboard agent reports node statistics every minute, not every 5 s; a setting the user made stands
    own = {} if home == "a home of its own" else {"REPORTER_UPDATE_INTERVAL_MS": "7000"}
    # the session folder goes at a clean exit; a traceback keeps it (its logs may hold the cause)
    ends = {} if home == "a home of its own" else {"END_IN_A_TRACEBACK": "1"}
    # where the node table cannot be read, Ray's own wait for the new node decides, as it did
    broken = {} if home == "a home of its own" else {"NO_NODE_TABLE": "1"}
    sessions = Path(tempfile.mkdtemp(prefix="atoll-t-"))  # short: Ray's sockets are in it
    try:
        proc = subprocess.run([sys.executable, "-c", SCRIPT.format(pythonpath=pythonpath)], cwd=tmp_path,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "PYTHONPATH": pythonpath,
                                   "SRC": str(ROOT), "RAY_TMPDIR": str(sessions), **own, **ends, **broken},
                              capture_output=True, text=True, timeout=180, check=False)
        assert proc.returncode == (1 if ends else 0), proc.stderr[-3000:]
        left = sorted(path.name for path in (sessions / "ray").glob("session_*"))
    finally:
        shutil.rmtree(sessions, ignore_errors=True)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    connected, probe, ray_says, exit_ = lines
    # neither helper started (each a process that imports Ray); Ray's own shutdown would ask the
    # autoscaler monitor to stop, then wait a second for it to give up on the GCS
    assert probe["helpers started"] == []
    assert "log_monitor" not in connected["connected"] and "monitor" not in connected["connected"]
    assert "raylet" in connected["connected"]
    assert "dashboard" not in connected["connected"]  # no API server: ray.init no longer waits for its start
    assert probe["found"] == [str(ROOT / "controller" / "actors.py"), 42]
    assert not probe["runtime_env"], "a local Ray's workers get the path from the environment, not a runtime_env"
    assert "autoscaler failed" not in proc.stderr
    assert "Token authentication is enabled" not in proc.stderr  # Ray's notice, on every start; auth stays on
    assert "Failed to determine local IP" not in proc.stderr  # it probed for a way out, which a netns has not
    # Ray's token authentication holds either way: its token saved in ~/.ray, or one of the command's own
    assert probe["auth"] == "token"
    assert probe["own token"] == (home == "a home that cannot be written")
    assert (tmp_path / "home" / ".ray" / "auth_token").is_file() == (home == "a home of its own")
    assert probe["agent's"] == own.get("REPORTER_UPDATE_INTERVAL_MS", "60000")
    assert probe["driver's"] == own.get("REPORTER_UPDATE_INTERVAL_MS"), "the driver's own environment is left as it was"
    # no metrics or event-loop timings recorded for a dashboard that is not started
    assert (probe["metrics"], probe["event stats"]) == ("0", "0")
    assert probe["driver's metrics"] is None
    assert left == ([Path(probe["session"]).name, "session_latest"] if ends else []), left
    # the exit stopped its Ray without waiting half a second for workers' log lines it never prints
    assert 0.5 not in exit_["exit slept"], exit_
    # the driver did not import the full dashboard's packages to learn they are installed, and the
    # agent runs in the form Ray's own check (which imports them) chooses
    assert not probe["deps imported"]
    assert probe["minimal agent"] is ray_says["rays own answer"]
    # Ray asked the GCS for its new node once; with the node table read until the node was alive,
    # its call found it at once, where it waited a second and more for a node still registering
    assert len(probe["asked"]) == 1
    if not broken:
        assert probe["asked"][0] < 0.9, probe  # a second and more on the code before


LISTENERS = r'''
import json, os, socket, sys
sys.path.insert(0, os.environ["SRC"])
import ray
from controller.actors import connect

connect(None, 1)

@ray.remote(num_cpus=1)
def node_ip():
    return ray.util.get_node_ip_address()

def listening(table, family):  # the local addresses of this network namespace's listening TCP sockets
    with open(f"/proc/self/net/{table}") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    out = []
    for row in rows:
        if row[3] == "0A":  # LISTEN
            raw = bytes.fromhex(row[1].split(":")[0])
            raw = raw[::-1] if family == socket.AF_INET else b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
            out.append(socket.inet_ntop(family, raw))
    return out

print(json.dumps({"node": ray.get(node_ip.remote()), "driver": ray.util.get_node_ip_address(),
                  "listening": listening("tcp", socket.AF_INET) + listening("tcp6", socket.AF_INET6)}))
'''


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"),
                    reason="needs root, unshare and ip to give Ray a network namespace with a way out")
def test_a_local_ray_listens_on_loopback_only_where_the_machine_has_a_way_out(tmp_path):
    """Ray would learn an outward address (a UDP probe towards a public DNS server) and listen there."""
    # a second address and a default route from it (on loopback: no kernel module needed), as an outward interface
    outward = ("ip link set lo up && ip addr add 192.0.2.77/32 dev lo && ip route add default dev lo src 192.0.2.77 "
               "&& exec \"$0\" -c \"$1\"")
    sessions = Path(tempfile.mkdtemp(prefix="atoll-t-"))  # short: Ray's sockets are in it
    try:
        proc = subprocess.run(["unshare", "-n", "sh", "-c", outward, sys.executable, LISTENERS],
                              cwd=tmp_path, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(tmp_path),
                                                 "SRC": str(ROOT), "RAY_TMPDIR": str(sessions)},
                              capture_output=True, text=True, timeout=180, check=False)
    finally:
        shutil.rmtree(sessions, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["node"] == seen["driver"] == "127.0.0.1", seen
    assert seen["listening"] and set(seen["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, seen
    assert "Failed to determine local IP" not in proc.stderr


def test_too_little_room_for_rays_session_is_one_line_before_ray_starts(tmp_path, monkeypatch):
    """A full /tmp made Ray wait half a minute for its GCS, then raise a traceback."""
    import shutil

    import ray

    from controller import actors
    from controller.cli import UserError

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    usage = type(shutil.disk_usage(tmp_path))
    monkeypatch.setattr(actors.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 2**20, 2**20))
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    with pytest.raises(UserError) as refused:
        actors.start_local(1, str(ROOT))
    assert str(refused.value) == (f"{tmp_path / 'ray'} has 1.0 MiB free: the command's own Ray keeps its session's "
                                  "files, sockets and logs there and cannot start; free some space there, or set "
                                  "RAY_TMPDIR to a folder with room")


def test_a_local_ray_that_does_not_start_is_one_line_that_says_where_it_writes(tmp_path):
    (tmp_path / "a-file").write_text("")
    temp = tmp_path / "a-file" / "ray"  # Ray cannot make its session folder there
    proc = subprocess.run([sys.executable, "-m", "controller", "run", str(ROOT / "configs" / "inventory.toml"),
                           "--max-evals", "2", "--run-dir", str(tmp_path / "run"), "--no-report"], cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
                               "RAY_TMPDIR": str(tmp_path / "a-file")},
                          capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"atoll: the command's own Ray did not start: [Errno 20] Not a directory: '{temp}' "
                           f"(Ray keeps its session in {temp}, "), last
    assert last.endswith(" free there; set RAY_TMPDIR to a folder you can write)"), last
