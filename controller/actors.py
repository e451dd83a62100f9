"""Ray actors: thin wrappers that make the plain classes remote.

The logic lives in `evaluators.evaluator.Evaluator` and `MutationWorker`, both
testable without Ray; `ray.remote(TheClass)` makes the actor.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib.util
import logging
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

import ray

from controller.address import join, patched, ray_leaves_sigterm
from controller.cli import UserError
from controller.submit import project_root, ray_token_found
from evaluators.evaluator import Evaluator
from evaluators.registry import get_domain
from store import signals
from store.records import MutationRequest
from workers._base import MutationFailed, Proposal
from workers.embedded import EmbeddedMutator


class MutationWorker:
    """Proposes children for one domain with the embedded mutator."""

    def __init__(self, domain, domain_options: dict, mutator_config):
        domain = get_domain(domain, **domain_options)  # a registered name or the run's DomainConfig
        self.mutator = EmbeddedMutator.for_domain(mutator_config, domain)

    def propose(self, request: MutationRequest) -> Proposal | str:
        """A proposal, or the reason no child could be made (data, not an error)."""
        try:
            return self.mutator.propose(request)
        except MutationFailed as exc:
            return f"mutation failed: {exc}"


class NodeEvaluator(Evaluator):
    """The evaluator as a Ray actor: each result names the node it was measured on (the archive keeps it)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.node = where()

    def evaluate(self, program_id: str, code: str, split: str, race=None):
        return dataclasses.replace(super().evaluate(program_id, code, split, race), node_id=self.node[0],
                                   node_ip=self.node[1])


def where() -> tuple[str, str]:
    """(node id, node IP) of the Ray node this process runs on."""
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


# Evaluators are not restarted by Ray: the driver replaces a lost one, because only it knows which
# program was running and may be the cause (controller.faults). A mutator is a pure function of its
# request, so Ray restarts it and retries its requests; the driver steps in when Ray gives up.
# SPREAD: a cluster's evaluators go to every node, not first to fill the head.
EVALUATOR_OPTIONS = {"num_cpus": 1, "max_restarts": 0, "scheduling_strategy": "SPREAD"}
MUTATOR_OPTIONS = {"num_cpus": 0, "max_restarts": 3, "max_task_retries": 2}
EvaluatorActor = ray.remote(**EVALUATOR_OPTIONS)(NodeEvaluator)
MutatorActor = ray.remote(**MUTATOR_OPTIONS)(MutationWorker)


def evaluator_count(config) -> int:
    """`evaluator.actors`, or one per CPU of the cluster when it is 0."""
    return config.evaluator.actors or max(1, int(ray.cluster_resources().get("CPU", 1)))


def new_evaluator(config, hide: tuple[str, ...] = (), *, secrets):
    """An evaluator actor for `config`'s domain; `hide` lists paths its sandboxes must not see.

    `secrets` (the run's `RunSecrets`) must be the same for every evaluator of a run, so every
    program meets the same data (common random numbers).
    """
    return EvaluatorActor.remote(config.domain, {}, config.evaluator.sandbox, hide, secrets)


def new_mutator(config):
    """A mutator actor for `config`'s domain."""
    return MutatorActor.remote(config.domain, {}, config.mutator.embedded)


def connect(address: str | None, num_cpus: int | None = None) -> dict:
    """Join the cluster at `address` (or RAY_ADDRESS), else start a local Ray."""
    if ray.is_initialized():
        return ray.cluster_resources()
    source = "--ray-address" if address else "RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS")
    # Atoll's own tree first, then the caller's path (where a user's domain package may live)
    paths = [str(project_root()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    path = os.pathsep.join(dict.fromkeys(paths))
    if address:
        # a Ray job's working_dir reaches every node already; another cluster's workers get the path
        env = {} if os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") else {"env_vars": {"PYTHONPATH": path}}
        join(address, env, source)  # a bad address is one line, before the run exists
    else:
        start_local(num_cpus, path)
    return ray.cluster_resources()


def start_local(num_cpus: int | None, path: str) -> None:
    """A Ray of this machine's own whose workers import from `path`.

    "local": never the last `ray start` cluster that Ray would otherwise find through
    /tmp/ray/ray_current_cluster (another user's, or one in another network namespace). The
    path goes to Ray's processes through the environment they inherit, not a runtime_env: Ray
    hands a worker with a runtime_env to its agent first, and two actors took 0.94 s to be
    ready instead of 0.25 s (`benchmarks/ray_start.py`).
    """
    token_without_home()
    temp = ray_temp_dir()
    free = free_bytes(temp)
    if free is not None and free < RAY_MIN_FREE:  # Ray would wait half a minute for its GCS, then raise
        raise UserError(f"{temp} has {_size(free)} free: the command's own Ray keeps its session's files, sockets and "
                        "logs there and cannot start; free some space there, or set RAY_TMPDIR to a folder with room")
    before = {name: os.environ.get(name) for name in ("PYTHONPATH", *OWN_RAY)}
    os.environ["PYTHONPATH"] = path
    for name, value in OWN_RAY.items():
        os.environ.setdefault(name, value)  # one the user set stands
    notice = logging.getLogger(AUTH_NOTICE)
    level = notice.level
    notice.setLevel(logging.ERROR)
    atexit.register(_forget_session)  # runs before Ray's own atexit shutdown, registered when ray was imported
    try:
        # a Ctrl-C or SIGTERM waits the seconds Ray takes to start: one inside it could crash its teardown,
        # and Ray's own SIGTERM handler (a sys.exit) would leave its agents running and its session behind
        with signals.held(), no_api_server(), no_helpers(), deps_found_not_imported(), node_seen_soon(), \
                ray_leaves_sigterm(), loopback_node():
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
            _SESSION.append(Path(ray._private.worker._global_node.get_session_dir_path()))  # before a held stop
    except Exception as exc:  # noqa: BLE001  whatever Ray raised, the user gets one line and where to look
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        room = f", {_size(free)} free there" if free is not None else ""
        logs = temp / "session_latest" / "logs"
        where = (f"its logs are under {logs}" if _is_dir(logs)
                 else "set RAY_TMPDIR to a folder you can write")  # it could not even make its session folder
        raise UserError(f"the command's own Ray did not start: {detail[:300]} (Ray keeps its session in {temp}{room}; "
                        f"{where})") from None
    finally:
        notice.setLevel(level)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_SESSION: list[Path] = []  # the session folder of this command's own Ray


def _forget_session() -> None:
    """At exit, stop this command's own Ray and remove its session folder (logs, sockets, Ray's
    metrics dashboards: 2 to 4 MB) unless the command ended in a traceback, whose cause its Ray's
    logs may hold: a folder was left in RAY_TMPDIR (/tmp/ray) by every run, resume and report."""
    if not _SESSION:
        return
    # Not as Ray's own atexit handler (next, then a no-op) calls it: with `_exiting_interpreter` a
    # driver sleeps 0.5 s for its workers' log lines to be printed, and this driver prints none
    # (`log_to_driver=False`); every command's exit waited for them.
    ray.shutdown()
    if getattr(sys, "last_value", None) is not None:  # an uncaught exception (set before atexit runs)
        return
    latest = _SESSION[0].parent / "session_latest"
    shutil.rmtree(_SESSION[0], ignore_errors=True)
    if latest.is_symlink() and not latest.exists():  # it named this session
        latest.unlink(missing_ok=True)


# Where Ray says, at every start of a new local Ray, that token authentication is on and how to
# turn it off: two lines on each `atoll` command's terminal about a Ray only that command uses.
# Authentication stays on; only the notice is left out.
AUTH_NOTICE = "ray._private.authentication.authentication_token_setup"


# What a command's own Ray does for a dashboard that is not started, made rarer or left out.
# Its processes get these through the environment they inherit, as they get PYTHONPATH; a value
# the user set stands. The dashboard agent's node statistics (psutil over every process) every
# minute instead of every 5 s; no metrics recorded and exported by every process, nor timings
# of each of their event loops' handlers (`benchmarks/ray_start.py --against`: idle, the Ray and
# its two actors spent 27.5 instead of 33.0 ms of CPU a second).
QUIET_RAY = {"REPORTER_UPDATE_INTERVAL_MS": "60000", "RAY_enable_metrics_collection": "0", "RAY_event_stats": "0"}
# Ray's own switch for a one-machine Ray (on Windows and macOS, where it is the default), for the
# processes a command's own Ray starts; the driver's is `loopback_node`.
LOOPBACK_RAY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
OWN_RAY = {**QUIET_RAY, **LOOPBACK_RAY}


RAY_MIN_FREE = 32 * 2**20  # below this a local Ray's head cannot write its session (checked before it starts)


def ray_temp_dir() -> Path:
    """Where a Ray started here keeps its sessions (RAY_TMPDIR, else TMPDIR, else /tmp; then `ray`),
    as Ray 2.60 itself picks it."""
    from ray._common.utils import get_default_ray_temp_dir

    return Path(get_default_ray_temp_dir())


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem that holds `path` (its nearest existing folder); None if none can be read."""
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # e.g. a folder above it this user may not search (Path.is_dir raises for that)
        return False


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.1f} GiB"


def token_without_home() -> None:
    """Give this command's Ray a token of its own where Ray could not save one in ~/.ray.

    Ray turns token authentication on for a cluster that `ray.init` starts and, unless a token
    is given (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH) or saved (~/.ray/auth_token), writes a new
    one there; with a home that cannot be written (a batch job's or a container's user) it
    failed with a traceback. Authentication stays on: Ray's processes, started by this one,
    inherit the token through the environment.
    """
    if "RAY_AUTH_MODE" in os.environ or ray_token_found():
        return
    try:
        folder = Path.home() / ".ray"
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return
    except (OSError, RuntimeError):  # RuntimeError: no home at all
        pass
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)


@contextlib.contextmanager
def no_api_server():
    """Start a command's own Ray without its API server (the dashboard's head process).

    With `include_dashboard=False` Ray still starts that process, with only its usage-statistics
    module and no web page, and `ray.init` waits for it to publish its address: about a second of
    every command's start (`benchmarks/ray_start.py`), and a process that then runs for nobody (a
    Ray of this machine's own takes no jobs and serves no state API; `atoll submit` talks to a
    cluster's own). Ray 2.60 runs without it as it runs when that process fails to start.
    `Node.start_api_server` is Ray's; on a Ray without it this does nothing."""
    def skipped(node, *args, **kwargs):
        node._webui_url = None  # as when it did not start
    with patched(getattr(getattr(ray._private, "node", None), "Node", None), "start_api_server", skipped):
        yield


# What Ray 2.60's `ray.dashboard.optional_deps` imports to tell a full install from a minimal one
DASHBOARD_DEPS = ("aiohttp", "aiohttp_cors", "grpc", "opencensus", "opentelemetry.exporter.prometheus",
                  "opentelemetry.proto", "prometheus_client", "pydantic")


def _dashboard_deps_error() -> ImportError | None:
    """Ray's answer to "is this a minimal install?", from where the packages are, not by importing them."""
    try:
        missing = [name for name in DASHBOARD_DEPS if importlib.util.find_spec(name) is None]
    except (ImportError, ValueError) as exc:  # a parent package that cannot even be found
        return ImportError(str(exc))
    return ImportError(f"not installed: {', '.join(missing)}") if missing else None


@contextlib.contextmanager
def deps_found_not_imported():
    """Start a command's own Ray without importing the full dashboard's packages in the driver.

    To choose between its dashboard agent's two forms (full where those packages are installed,
    minimal where not), Ray imports them all in the driver before it starts the raylet (aiohttp,
    OpenTelemetry's Prometheus exporter and more): CPU spent, and the raylet started later, for
    packages the driver never uses. Where the packages are (`DASHBOARD_DEPS`) gives the same
    answer, so the agent runs in the form Ray would choose. Ray 2.60's
    `ray._private.utils.get_dashboard_dependency_error`; on a Ray without it this does nothing."""
    with patched(getattr(ray._private, "utils", None), "get_dashboard_dependency_error", _dashboard_deps_error):
        yield


# How often the node table is read while the raylet registers, and for how long: Ray's own limit. A
# raylet that never registers is still reported by Ray, which counts its 30 s from before this wait.
NODE_POLL_S, NODE_WAIT_S = 0.02, 30.0


@contextlib.contextmanager
def node_seen_soon():
    """Start a command's own Ray without a second's wait for its raylet to register.

    `ray.init` asks the GCS for the new node once the raylet is started, and where the raylet has
    not registered yet (it waits for its agents first) Ray's call looks again only a second
    later, so a start often lasted up to a second longer than its raylet needed
    (`benchmarks/ray_start.py`). This reads the node table every `NODE_POLL_S` until the node is
    alive, then lets Ray's call find it at once; after `NODE_WAIT_S` (a registration takes a
    second or two, and several on a loaded machine) or if the table cannot be read, Ray's call
    decides as before. Ray 2.60's `ray._private.services.get_node` and `state.GlobalState`; on a
    Ray without them this does nothing."""
    services = getattr(ray._private, "services", None)
    original = getattr(services, "get_node", None)

    def get_node(gcs_address, node_id):
        with contextlib.suppress(Exception):  # Ray's own call below is the one that answers
            _wait_for_node(services, gcs_address, node_id)
        return original(gcs_address, node_id)
    with patched(services, "get_node", get_node):
        yield


def _wait_for_node(services, gcs_address: str, node_id: str) -> None:
    state = ray._private.state.GlobalState()
    state._initialize_global_state(services._get_gcs_client_options(gcs_address))
    give_up = time.monotonic() + NODE_WAIT_S
    try:
        while time.monotonic() < give_up:
            if any(row.get("NodeID") == node_id and row.get("Alive") for row in state.node_table()):
                return
            time.sleep(NODE_POLL_S)
    finally:
        state.disconnect()


@contextlib.contextmanager
def loopback_node():
    """Start a command's own Ray on 127.0.0.1: its node's address, and every port its GCS, raylet,
    agents and workers listen on (`LOOPBACK_RAY` tells the processes it starts).

    Such a Ray serves this machine only; a cluster (`--ray-address`) is never started here. Left to
    itself, Ray 2.60 learns an outward address by a UDP probe towards a public DNS server and then
    listens on every interface; where there is no way out it prints "Failed to determine local IP"
    on every command's stderr and falls back to the hostname's address. Ray reads its switch
    (`ray_constants.ENABLE_RAY_CLUSTER`) from the environment once, when it is imported, so the
    driver's is set here; on a Ray without it this does nothing."""
    with patched(getattr(ray._private, "ray_constants", None), "ENABLE_RAY_CLUSTER", False):
        yield


@contextlib.contextmanager
def no_helpers():
    """Start a command's own Ray without the two processes it would run for nobody: its log
    monitor and its autoscaler monitor.

    The log monitor tails every worker's log for drivers that print them; Atoll's driver asks
    for none (`log_to_driver=False`). The autoscaler monitor scales a cluster; a Ray of this
    machine's own has a fixed size. Running, the two cost CPU every second between them; at
    exit, Ray's shutdown stopped the GCS, then waited a second for the autoscaler monitor to
    give up on it. Stopped once Ray was up, as Atoll did first, they still cost every start
    two Python processes that import Ray, beside the raylet's own start, and so a slower
    `ray.init` (`benchmarks/ray_start.py`). Ray 2.60's `Node.start_log_monitor` and
    `start_monitor`; on a Ray without them this does nothing."""
    def skipped(node, *args, **kwargs):
        return None
    node = getattr(getattr(ray._private, "node", None), "Node", None)
    with patched(node, "start_log_monitor", skipped), patched(node, "start_monitor", skipped):
        yield
