"""`atoll submit`: a search (or the resume of one) as a Ray job, through Ray's job submission SDK.

Atoll's code travels as the job's working directory (Ray unpacks it on every node): a
source checkout as it is when the config lies inside it; otherwise (Atoll installed with
`pip install .`, or a config of one's own elsewhere) a folder made for the job, holding
Atoll's packages and the config's folder as `job/`. The entry point is Atoll's own
command, `python -m controller run CONFIG --run-dir DIR`.
The run directory lies under a storage root on the driver's node (`cluster.storage_root`,
or `--storage-root`; `~` is that node's home), never inside the unpacked working directory,
which Ray deletes when the job ends. The job's metadata records the run directory, so
`atoll jobs` finds it, and `atoll status`, `query` and `submit --resume` take it.

Ray's token authentication stays on: the client sends the cluster's token, which it finds
in RAY_AUTH_TOKEN, in the file RAY_AUTH_TOKEN_PATH names, or in ~/.ray/auth_token (where
`ray start` writes it on the head node; copy it to the client's machine).
"""
from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import socket
import stat
import sys
import tempfile
import time
import tomllib
import urllib.parse
import uuid
from pathlib import Path, PurePosixPath

import tenacity

from controller.cli import UserError

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
# Never shipped: git's data, run directories and archives, caches (Ray also honours .gitignore files).
EXCLUDES = [".git", "runs", "*.duckdb", "*.duckdb.wal", "__pycache__", ".pytest_cache", ".mypy_cache",
            ".ruff_cache", "*.egg-info", ".venv", "venv", ".cache"]
METADATA_KEY = "atoll_run_dir"
# `ray job stop` sends SIGTERM, then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S (3 s by Ray's default),
# read by the job's supervisor in the job's own environment: a driver on a busy node cancels its
# work, commits, updates the library and says how to resume in more than that. Its kill -9 loses
# nothing committed, but the user would not see the resume line.
STOP_WAIT_S = 60
_EXCLUDED = shutil.ignore_patterns(*EXCLUDES)  # (folder, names) -> the names EXCLUDES leaves out


def not_sent(base: str, names: list[str]) -> set[str]:
    """The names in folder `base` that stay on this machine (as copytree's `ignore` asks): what EXCLUDES
    names, what is neither a file nor a folder (a crashed run's archive.sock, a FIFO, a dangling link),
    and every run directory (a folder holding archive.duckdb), whatever its name: a live run's
    control.json holds its control token, and a socket stopped the job's folder with a traceback."""
    left = set(_EXCLUDED(base, names))
    for name in set(names) - left:
        path = os.path.join(base, name)
        try:
            mode = os.stat(path).st_mode  # through a link, as copytree copies it
        except OSError:
            left.add(name)
            continue
        run_dir = stat.S_ISDIR(mode) and os.path.exists(os.path.join(path, "archive.duckdb"))
        if run_dir or not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            left.add(name)
    return left


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]


def address_of(given: str | None) -> str:
    """The job server's address: --address, else RAY_API_SERVER_ADDRESS, else the local head's."""
    return given or os.environ.get("RAY_API_SERVER_ADDRESS") or DEFAULT_ADDRESS


def client(address: str):
    """A JobSubmissionClient for `address`; no answer, or a refused token, is one line.

    HOST:PORT without a scheme is tried first as the job server's own address (http://HOST:PORT):
    Ray alone reads it as a GCS's, so the dashboard's port given without `http://` waited some
    40 s, printed four lines of Ray's own and was then refused as if no job server answered there.
    Where nothing answers that way, it goes to Ray as given (a GCS's address, e.g. HEAD:6379, from
    which Ray finds the job server), unless nothing listens there at all.
    """
    _token_auth_if_token_found()
    if _silent_ray_client(address):
        raise UserError(f"--address {address}: {NO_JOB_SERVER}")
    from ray.job_submission import JobSubmissionClient

    first = None
    for form in ([f"http://{address}", address] if _bare(address) else [address]):
        try:
            return JobSubmissionClient(form)
        except Exception as exc:  # noqa: BLE001  ConnectionError, ValueError, an HTTP error: all one line
            first = first or exc
            if _token_refused(exc) or not _listens(address):
                break
    raise UserError(f"--address {address}: {_why(first)}") from None


def served_at(jobs, given: str) -> str:
    """The job server's own address (http://...) that the client `jobs` for `given` found (see `client`)."""
    return getattr(jobs, "_address", None) or given


def _bare(address: str) -> bool:
    """HOST:PORT with no scheme."""
    return re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[^/:\[\]]+):\d{1,5}", address) is not None


def _silent_ray_client(address: str) -> bool:
    """A Ray Client address (ray://HOST, port 10001 unless given) where nothing accepts a connection:
    Ray waited 30 s for it and printed lines of its own before the one line saying so."""
    parts = urllib.parse.urlsplit(address)
    try:
        port = parts.port or 10001
    except ValueError:
        return False  # Ray says what is wrong with it
    return parts.scheme == "ray" and parts.hostname is not None and not _listens(f"[{parts.hostname}]:{port}")


def _listens(address: str) -> bool:
    """Whether anything accepts a connection at HOST:PORT."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except (OSError, ValueError):
        return False
    return True


def _token_refused(exc: Exception) -> bool:
    text = str(exc)
    return "authentication" in text.lower() or "401" in text or "403" in text


def _why(exc: Exception) -> str:
    if _token_refused(exc):
        return ("the cluster refused this client's token; put the head node's ~/.ray/auth_token in the same "
                "place here, or set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH)")
    return NO_JOB_SERVER


NO_JOB_SERVER = ("no Ray cluster's job server answers there; start one with `ray start --head` (its dashboard serves "
                 "jobs on port 8265), or give the head's address, e.g. --address http://HEAD:8265")


def _token_auth_if_token_found() -> None:
    """Send the token when there is one, as `ray start` and `ray.init` do (RAY_AUTH_MODE decides if set)."""
    if "RAY_AUTH_MODE" not in os.environ and ray_token_found():
        os.environ["RAY_AUTH_MODE"] = "token"


def ray_command() -> str:
    """Ray's own command as the user must type it to reach the cluster as this client does.

    This client sends a token it finds without being told (`_token_auth_if_token_found`);
    Ray's CLI sends one only with RAY_AUTH_MODE=token, and without it `ray job logs` fails
    with a traceback. Call before `client()`, which sets the variable in this process.
    """
    return "RAY_AUTH_MODE=token ray" if "RAY_AUTH_MODE" not in os.environ and ray_token_found() else "ray"


def quiet_packaging() -> None:
    """Leave out Ray's notes on packing the working directory (a dozen lines a submission, among
    them "Ignoring upload ... .gitignore" and ".git is now ignored") and on its log stream; its
    warnings about what is packed stay."""
    import logging

    _token_auth_if_token_found()  # before Ray's client loads: it reads the mode once
    import ray.job_submission  # noqa: F401  its modules set their loggers to INFO as they load: load them first

    for name in ("ray._private.runtime_env.packaging", "ray.dashboard.modules.dashboard_sdk",
                 "ray.dashboard.modules.job.sdk"):  # the last: "WebSocket closed" as --wait ends
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("ray._private.runtime_env.working_dir").setLevel(logging.ERROR)  # only the .git note


def ray_token_found() -> bool:
    """Whether Ray finds a token: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    try:
        return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token").is_file()
    except (OSError, RuntimeError):  # RuntimeError: no home at all
        return False


def run_dir_for(name: str, storage_root: str, given: str | None) -> str:
    """The run directory on the driver's node: absolute, or under the driver's home (`~/...`)."""
    path = given or str(PurePosixPath(storage_root) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if not path.startswith(("/", "~/")):
        raise UserError(f"run directory {path!r}: give an absolute path on the driver's node (or one under ~/), "
                        "never a relative one: the job runs in a copy of the project that Ray deletes")
    return path


def shell_path(path: str) -> str:
    """`path` quoted for the driver's shell, its leading ~/ left for that shell to expand."""
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


PACKAGES = ("controller", "workers", "islands", "evaluators", "store")  # Atoll's own, as pyproject.toml lists them
JOB_FOLDER_MAX = 100 * 2**20  # a config's folder bigger than this is not sent (the user's data belongs elsewhere)


def checkout() -> Path | None:
    """Atoll's source checkout, when it runs from one (pyproject.toml beside its packages); None when installed."""
    root = project_root()
    return root if (root / "pyproject.toml").is_file() else None


def travelling_folder(config_path: Path) -> Path:
    """The folder of this machine that travels to the cluster with a job of `config_path` (see working_dir)."""
    root = checkout()
    return root if root is not None and _inside(config_path, root) else config_path.resolve().parent


def data_files(config_path: Path, overrides: list[str], config) -> list[tuple[str, str, Path]]:
    """(option, its path as written, as resolved here) for each data file the domain's options name."""
    from controller.config import apply_overrides

    written = apply_overrides(tomllib.loads(config_path.read_text()), list(overrides)).get("domain", {}).get(
        "options", {})
    found = []
    for key, value in config.domain.options.items():
        if isinstance(value, dict) and {"path", "sha256"} <= set(value):  # pinned by evaluators.userdata
            raw = written.get(key)
            found.append((key, str(raw.get("path") if isinstance(raw, dict) else raw), Path(value["path"])))
    return found


def check_data(config_path: Path, files: list[tuple[str, str, Path]]) -> list[str]:
    """Refuse a data file outside the travelling folder named by a relative path (on the cluster it
    would resolve inside the job's copy of that folder, and not be there); for one named by an
    absolute path, a note: the job reads it at that path on the driver's node."""
    folder, notes = travelling_folder(config_path), []
    for key, raw, path in files:
        if _inside(path, folder):
            continue
        if not Path(raw).expanduser().is_absolute():
            raise UserError(f"domain.options.{key} = {raw!r} lies outside {folder}, the folder that travels to the "
                            f"cluster with the job, where the path would lead nowhere; put the file in that folder, "
                            f"or name it by an absolute path that the cluster's driver node holds")
        notes.append(f"note: domain.options.{key} ({path}) lies outside the folder that travels with the job; "
                     f"the job reads it at that path on the driver's node, which must hold the same content "
                     f"(the run pins its sha256 and refuses any other)")
    return notes


def check_keys(config_path: Path, config) -> None:
    """Refuse an API key file that would travel with the job: `atoll submit` sends no key.

    The driver reads `api_key_file` on its node. A relative path is read in Ray's copy of the
    folder that travels with the job, so the key would have to be in that folder; a file of that
    folder travels, and Ray keeps the job's files in the cluster's store, for every job to read.
    """
    folder = travelling_folder(config_path)
    for cfg in config.mutator.llm.models if config.mutator.llm else ():
        file = getattr(cfg, "api_key_file", None)
        if file is None:
            continue
        relative = not str(file).startswith(("/", "~"))
        if relative or (_inside(file.expanduser(), folder) and file.expanduser().exists()):
            where = "is relative: the job would read it in its copy of" if relative else "lies in"
            raise UserError(f"mutator.llm model {cfg.name!r}: api_key_file {file} {where} {folder}, the folder that "
                            f"travels to the cluster with the job, where Ray keeps its files: the key must not "
                            f"travel. Name the key file on the driver's node by an absolute path or one under ~/ "
                            f"(e.g. ~/.config/atoll/key), outside that folder")


@contextlib.contextmanager
def working_dir(config_path: Path | None, domain_path: str | None):
    """(the folder that travels as the job's working directory, the config's path in it).

    A config inside Atoll's checkout: the checkout, as it is. Otherwise a folder made for
    the job, removed once Ray has taken it: Atoll's packages (from wherever this Atoll runs,
    site-packages included) and the config's own folder as `job/`, which must hold the
    domain file a config names.
    """
    root = checkout()
    folder = travelling_folder(config_path) if config_path is not None else root
    if root is not None and folder == root:
        if domain_path and not _inside(Path(domain_path), root):
            raise UserError(f"domain.path {domain_path} lies outside {root}, the folder that travels to the cluster "
                            "as the job's working directory; put it inside that folder")
        yield root, str(config_path.resolve().relative_to(root)) if config_path else None
        return
    if folder is not None:
        if domain_path and not _inside(Path(domain_path), folder):
            raise UserError(f"domain.path {domain_path} lies outside {folder}, the config's folder, which travels to "
                            "the cluster with the job; put the domain file beside the config")
        if _folder_size(folder, JOB_FOLDER_MAX) > JOB_FOLDER_MAX:
            raise UserError(f"{folder} holds more than {JOB_FOLDER_MAX // 2**20} MiB: the config's folder travels to "
                            "the cluster with the job; put the config and its domain file in a folder of their own")
    with tempfile.TemporaryDirectory(prefix="atoll-job-") as temp:
        stage = Path(temp)
        for name in PACKAGES:
            shutil.copytree(project_root() / name, stage / name, ignore=shutil.ignore_patterns("__pycache__"))
        if folder is not None:
            _copy_job_folder(folder, stage / "job")
        yield stage, f"job/{config_path.name}" if config_path is not None else None


def _copy_job_folder(folder: Path, to: Path) -> None:
    """The config's folder into the job's (what `not_sent` names left out); a file that cannot be read is one line."""
    try:
        shutil.copytree(folder, to, ignore=not_sent)
    except OSError as exc:  # shutil.Error: [(source, copy, why naming the source), ...]
        why = exc.args[0][0][2] if isinstance(exc, shutil.Error) else str(exc)
        raise UserError(f"cannot send the config's folder {folder} with the job: {why}; make what it holds readable "
                        "by you, or put the config and its domain file in a folder of their own") from None


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _folder_size(folder: Path, enough: int) -> int:
    """Bytes under `folder`, what EXCLUDES leaves out not counted; the walk stops once past `enough`
    (a config in one's home folder would otherwise walk all of it)."""
    total = 0
    for base, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in not_sent(base, dirs)]
        for name in set(files) - not_sent(base, files):
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(base, name)).st_size
            if total > enough:
                return total
    return total


def entrypoint(args, config, shipped_config: str | None) -> tuple[str, str]:
    """(the job's command, its run directory) for `atoll submit CONFIG` or `atoll submit --resume DIR`."""
    if args.resume:
        run_dir = run_dir_for("", "", args.resume)
        words = ["python", "-m", "controller", "resume", shell_path(run_dir)]
        if args.from_backup:
            words.append("--from-backup")
        if isinstance(args.from_backup, str):  # a backup file on the driver's node, e.g. in controller.backup_dir
            words.append(shell_path(args.from_backup))
    else:
        run_dir = run_dir_for(config.run.name, args.storage_root or config.cluster.storage_root, args.run_dir)
        words = ["python", "-m", "controller", "run", shlex.quote(shipped_config), "--run-dir", shell_path(run_dir)]
    for item in args.set:
        words += ["--set", shlex.quote(item)]
    if args.no_report:
        words.append("--no-report")
    return " ".join(words), run_dir


def submit(args, config) -> tuple[str, str, str]:
    """Submit the job; returns (job id, run directory, the job server's address as Ray's command takes it)."""
    config_path = None if args.resume else Path(args.config)
    with working_dir(config_path, None if args.resume else config.domain.path) as (folder, shipped_config):
        command, run_dir = entrypoint(args, config, shipped_config)
        jobs = client(address_of(args.address))
        address = served_at(jobs, address_of(args.address))
        try:
            job_id = _submit_when_an_agent_is_up(
                jobs, entrypoint=command, submission_id=submission_id(run_dir),
                runtime_env={"working_dir": str(folder), "excludes": EXCLUDES,
                             "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(STOP_WAIT_S)}},
                metadata={METADATA_KEY: run_dir, "atoll_command": "resume" if args.resume else "run"})
        except Exception as exc:  # noqa: BLE001  the job server refused it (HTTP error text), one line
            raise UserError(f"the cluster at {address} refused the job: "
                            f"{(str(exc).strip().splitlines() or [type(exc).__name__])[-1]}") from None
    return job_id, run_dir, address


def submission_id(run_dir: str) -> str:
    """`atoll-NAME-XXXXXX`, NAME the run directory's name with every character but letters, digits, `.`,
    `_` and `-` made `_`: Ray puts the id in its URLs (a `?` or `#` cut it short there, and `ray job
    logs` then found no such job) and the printed hints put it in a shell command."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", PurePosixPath(run_dir).name)
    return f"atoll-{name}-{uuid.uuid4().hex[:6]}"


def _agent_not_up(exc: BaseException) -> bool:
    """The head answered but its job agent is not up yet (the first seconds after `ray start --head`)."""
    return "No available agent" in str(exc)


@tenacity.retry(retry=tenacity.retry_if_exception(_agent_not_up), wait=tenacity.wait_exponential(0.5, max=4),
                stop=tenacity.stop_after_delay(60), reraise=True)
def _submit_when_an_agent_is_up(jobs, **job) -> str:
    return jobs.submit_job(**job)


def follow(address: str, job_id: str) -> str:
    """Print the job's logs as they come until it ends; returns its final status.

    A job server lost meanwhile (its head stopped, the network cut) is one line: the job may be
    gone with it or still running, and the run directory keeps what was committed either way.
    """
    import asyncio

    jobs = client(address)

    async def tail():
        async for lines in jobs.tail_job_logs(job_id):
            print(lines, end="", flush=True)
    try:
        asyncio.run(tail())
        for _ in range(100):  # the log stream ends a moment before the status is final
            status = str(jobs.get_job_status(job_id).value)
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                return status
            time.sleep(0.1)
    except Exception as exc:  # noqa: BLE001  the SDK's RuntimeError, aiohttp's or requests' connection errors
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise UserError(f"lost the job server at {address} while following job {job_id} ({reason}); once it "
                        f"answers again, `atoll jobs --address {address}` says what became of the job "
                        "(what it committed stays in its run directory)") from None
    return status


def list_runs(address: str) -> list[tuple[str, str, str, str]]:
    """(job id, status, command, run directory) of every Atoll job the cluster knows, oldest first."""
    jobs = client(address)
    rows = []
    for job in sorted(jobs.list_jobs(), key=lambda j: j.start_time or 0):
        meta = job.metadata or {}
        if METADATA_KEY in meta:
            rows.append((job.submission_id or job.job_id, str(job.status.value), meta.get("atoll_command", ""),
                         meta[METADATA_KEY]))
    return rows


def in_ray_job() -> bool:
    """Whether this process is a Ray job's driver (`ray job submit`, `atoll submit`)."""
    return bool(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR"))


def resume_command(run_dir) -> str:
    """How to continue a run: as a Ray job again when this driver is one (`atoll submit`, `ray job submit`)."""
    if in_ray_job():
        return f"atoll submit --resume {run_dir} --address http://HEAD:8265 (the job server this job ran on)"
    return f"atoll resume {run_dir}"


def storage_root(config, given: str | None) -> Path:
    """Where `atoll run` puts a new run directory: runs/ here, but in a Ray job `cluster.storage_root`.

    A Ray job runs in Ray's unpacked copy of the working directory, deleted when the job
    ends: a run directory there would be lost, so a relative --run-dir is refused.
    """
    if not in_ray_job():
        return Path("runs")
    if given and not Path(given).expanduser().is_absolute():
        raise UserError(f"--run-dir {given}: in a Ray job a relative path lies in Ray's copy of the working "
                        "directory, which Ray deletes; give an absolute path (or none: cluster.storage_root)")
    return Path(config.cluster.storage_root).expanduser()


# --- the commands ---------------------------------------------------------------------------
def cmd_submit(args) -> int:
    from controller.read_commands import console
    from controller.config import load_config, parse_override
    from controller.resume_config import repoints_data

    if bool(args.config) == bool(args.resume):
        raise UserError("submit: give a CONFIG to start a run, or --resume RUN_DIR to continue one (not both)")
    if args.from_backup and not args.resume:
        raise UserError("submit: --from-backup goes with --resume RUN_DIR (a new run has no backup)")
    if isinstance(args.from_backup, str) and not args.from_backup.startswith(("/", "~/")):
        raise UserError(f"--from-backup {args.from_backup}: give the backup's absolute path on the driver's node "
                        "(or one under ~/), never a relative one: the job runs in a copy of the project")
    args.set = list(args.set) + ([f"run.max_evals={args.max_evals}"] if args.max_evals is not None else [])
    keys = [(item, parse_override(item)[0]) for item in args.set]  # a bad --set stops here too
    domain = [item for item, key in keys if key[0] == "domain" and not repoints_data(key)]  # the job checks those
    if args.resume and domain:  # the job's `atoll resume` would refuse it (controller.resume_config)
        raise UserError(f"--set {domain[0]}: a resume cannot change the domain or its options (the run's scores "
                        "so far were measured with them); submit a new run with the new value: atoll submit CONFIG "
                        "--set ...")
    config = None if args.resume else load_config(args.config, args.set)[0]  # a bad config stops here
    notes = [] if args.resume else check_data(Path(args.config), data_files(Path(args.config), args.set, config))
    if not args.resume:
        check_keys(Path(args.config), config)
    ray_cli = ray_command()
    quiet_packaging()
    job_id, run_dir, address = submit(args, config)
    for note in notes:
        console.print(note, soft_wrap=True)
    console.print(f"atoll submitted job {job_id} to {address}; its run directory on the driver's node: "
                  f"{run_dir}", soft_wrap=True)
    console.print(hints(job_id, run_dir, address, ray_cli), soft_wrap=True, markup=False)
    if not args.wait:
        return 0
    try:
        status = follow(address, job_id)
    except KeyboardInterrupt:  # the job is the cluster's: a Ctrl-C here stops only the printing
        print(f"atoll submit: stopped following job {job_id}, which goes on running on the cluster; follow it "
              "again or stop it as printed above", file=sys.stderr)
        return 130
    console.print(f"atoll job {job_id} {status}", soft_wrap=True)
    return 0 if status == "SUCCEEDED" else 1


def hints(job_id: str, run_dir: str, address: str, ray_cli: str) -> str:
    """How to follow, read, stop and continue the job, each a command to paste into a shell as printed.

    The run directory is quoted: `status` runs on the driver's node, where a leading ~/ is left for its
    shell to expand; `continue` runs here, where the driver's ~/ must travel as it is (this machine's
    shell would make it this user's home, which the driver's node need not have).
    """
    address = shlex.quote(address)
    return (f"  follow it:   {ray_cli} job logs -f {job_id} --address {address}\n"
            f"  status:      atoll status {shell_path(run_dir)}      (on the driver's node)\n"
            f"  stop it:     {ray_cli} job stop {job_id} --address {address}   (commits, then stops)\n"
            f"  continue:    atoll submit --resume {shlex.quote(run_dir)} --address {address}")


def cmd_jobs(args) -> int:
    from controller.read_commands import print_rows

    print_rows(("job", "status", "command", "run directory"), list_runs(address_of(args.address)), "")
    return 0
