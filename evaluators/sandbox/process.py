"""Trusted side of the sandbox: start a candidate's process and talk to it.

`PolicyProcess` is the only way candidate code runs. Each candidate gets a new
process, forked in its own session from a warm, trusted fork server (a Python
started with `-I` and a clean environment that has imported numpy and never
runs candidate code), and talks to it over two private pipes with
length-prefixed msgpack frames (see `wire`). The candidate never sees scoring
code or data; it answers batches of states with actions. Every way it can misbehave (crash,
hang, exit, garbage) becomes a `CandidateError` with a readable reason.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from evaluators.sandbox import wire
from evaluators._base import CandidateError
from evaluators.sandbox.config import SandboxConfig
from store.records import Status

_CHILD = Path(__file__).with_name("_child.py")
_PACKAGES = ("controller", "workers", "islands", "evaluators", "store")
_PASS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG")
SANDBOX_UID_BASE = 61000


def sandbox_uid() -> int:
    """A uid of this evaluator's own, so limits and clean-up touch only its processes."""
    return SANDBOX_UID_BASE + os.getpid() % 2000


def hidden_paths(extra: tuple[str, ...] = ()) -> list[str]:
    """Paths the candidate must not read: the project, run files, home, Atoll's packages."""
    import importlib

    root = str(Path(__file__).resolve().parents[2])
    pkgs = [str(Path(importlib.import_module(p).__file__).resolve().parent) for p in _PACKAGES]
    return [root, os.path.expanduser("~"), *extra, *pkgs]


def kept_paths() -> list[str]:
    """The interpreter and its libraries, which the candidate needs to run."""
    import numpy

    spots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(numpy.__file__).parents[1])}
    return sorted(s for s in spots if s)


def _clean_env() -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONHASHSEED": "0",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.update({k: os.environ[k] for k in _PASS_ENV if k in os.environ})
    return env


def _describe_exit(code: int, limits: SandboxConfig) -> tuple[Status, str]:
    if code >= 0:
        return Status.FAILED, f"the program exited with code {code} before answering"
    sig = -code
    if sig == signal.SIGXCPU:
        return Status.TIMEOUT, f"CPU-time limit of {limits.cpu_s} s exceeded"
    if sig == signal.SIGXFSZ:
        return Status.FAILED, f"file-size limit of {limits.file_mb} MiB exceeded"
    return Status.FAILED, f"the program was killed by signal {signal.Signals(sig).name}"


class PolicyProcess:
    """One candidate program in its own sandboxed process, for one evaluation."""

    def __init__(self, code: str, entry_point: str, limits: SandboxConfig,
                 hide: tuple[str, ...] = ()):
        self.code, self.entry_point, self.limits = code, entry_point, limits
        self.hide = hide
        self.protections: list[str] = []
        self.calls = 0
        self._pid: int | None = None
        self._to_child = self._from_child = None  # our ends of the two pipes
        self._log = None  # the candidate's stdout and stderr

    def __enter__(self) -> "PolicyProcess":
        try:
            self.start()
        except BaseException:
            self.close()  # __exit__ does not run when __enter__ raises
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()
        self._log = tempfile.TemporaryFile()
        spec = {"uid": sandbox_uid(), "hide": hidden_paths(self.hide), "keep": kept_paths(),
                "scratch_mb": self.limits.scratch_mb,
                "limits": self.limits.model_dump(include={"memory_mb", "cpu_s", "file_mb", "processes"})}
        try:
            fds = [to_child_r, from_child_w, self._log.fileno()]
            try:
                self._pid = _zygote().spawn(spec, fds)
            except (OSError, RuntimeError, ValueError):  # the fork server died under us: one fresh try
                self._pid = _zygote(fresh=True).spawn(spec, fds)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._deadline = time.monotonic() + self.limits.wall_s
        reply = self._exchange({"code": self.code, "entry": self.entry_point},
                               time.monotonic() + self.limits.startup_s)
        if "ready" not in reply:
            raise CandidateError(Status.FAILED, "the program failed to load:\n" + reply.get("error", "?"))
        self.protections = list(reply["ready"])

    def __call__(self, batches: list) -> list:
        """Send a list of (state, params) batches; return the policy's action arrays."""
        self.calls += 1
        reply = self._exchange({"batches": batches}, self._deadline)
        if "error" in reply:
            raise CandidateError(Status.FAILED, "the policy raised:\n" + str(reply["error"]))
        actions = reply.get("actions")
        if not isinstance(actions, list) or len(actions) != len(batches):
            raise CandidateError(Status.INVALID, "the policy's reply is not one action array per batch")
        return actions

    def _exchange(self, message, deadline: float) -> dict:
        try:
            self._write(wire.pack(message), deadline)
            header = self._read(4, deadline)
            reply = wire.unpack(self._read(wire.frame_length(header), deadline))
        except wire.WireError as exc:
            self.close()
            raise CandidateError(Status.INVALID, f"malformed reply from the program: {exc}") from None
        if not isinstance(reply, dict):
            raise CandidateError(Status.INVALID, "the program's reply is not a message")
        return reply

    def _write(self, data: bytes, deadline: float) -> None:
        while data:
            self._wait(self._to_child, deadline, write=True)
            try:
                data = data[os.write(self._to_child, data):]
            except BrokenPipeError:
                self._died()

    def _read(self, n: int, deadline: float) -> bytes:
        chunks = []
        while n:
            self._wait(self._from_child, deadline)
            chunk = os.read(self._from_child, min(n, 1 << 20))
            if not chunk:
                self._died()
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _wait(self, fd: int, deadline: float, write: bool = False) -> None:
        left = deadline - time.monotonic()
        ready = select.select([], [fd], [], max(left, 0))[1] if write else \
            select.select([fd], [], [], max(left, 0))[0]
        if not ready:
            self.close()
            raise CandidateError(Status.TIMEOUT, f"wall-clock limit of {self.limits.wall_s:g} s exceeded")

    def _died(self):
        code = _zygote().wait(self._pid, timeout=5)
        self._pid = None
        status, reason = _describe_exit(code, self.limits)
        tail = self.output_tail()
        self.close()
        raise CandidateError(status, reason + (f"\noutput:\n{tail}" if tail else ""))

    def output_tail(self, limit: int = 1500) -> str:
        self._log.flush()
        size = self._log.seek(0, os.SEEK_END)
        self._log.seek(max(0, size - limit))
        return self._log.read().decode(errors="replace").strip()

    def close(self) -> None:
        """Kill the process group and every process left under the sandbox uid (idempotent)."""
        for fd in (self._to_child, self._from_child):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to_child = self._from_child = None
        pid, self._pid = self._pid, None
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            _zygote().wait(pid, timeout=5)
        if self._log is not None:
            kill_uid(sandbox_uid())
            self._log.close()
            self._log = None


class _Zygote:
    """The evaluator's warm fork server (`_child.py --zygote`), started on first use.

    Trusted: it only forks. One per evaluator process; restarted if it dies.
    """

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(_CHILD), "--zygote", str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=_clean_env(), cwd="/", pass_fds=(theirs.fileno(),), start_new_session=True, close_fds=True)
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def _call(self, request: dict, fds: list[int] = ()) -> dict:
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
            reply = self._sock.recv(1 << 16)
        if not reply:
            raise RuntimeError("the sandbox's fork server died")
        return json.loads(reply)

    def spawn(self, spec: dict, fds: list[int]) -> int:
        return self._call({"op": "spawn", "spec": spec}, fds)["pid"]

    def wait(self, pid: int, timeout: float) -> int:
        return self._call({"op": "wait", "pid": pid, "timeout": timeout})["code"]


_ZYGOTE: _Zygote | None = None
_ZYGOTE_PID = 0


def _zygote(fresh: bool = False) -> _Zygote:
    global _ZYGOTE, _ZYGOTE_PID
    if fresh or _ZYGOTE is None or not _ZYGOTE.alive() or _ZYGOTE_PID != os.getpid():
        _ZYGOTE, _ZYGOTE_PID = _Zygote(), os.getpid()
    return _ZYGOTE


def kill_uid(uid: int, settle_s: float = 2.0) -> int:
    """SIGKILL every process owned by `uid` (stragglers that left the group).

    A fork bomb may still be forking while the first pass runs, so passes repeat
    until no process of `uid` is left (killed ones included, until reaped).
    """
    if os.geteuid() != 0:
        return 0
    killed, deadline = 0, time.monotonic() + settle_s
    while True:
        found = 0
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if entry.stat().st_uid == uid:
                        found += 1
                        os.kill(int(entry.name), signal.SIGKILL)
                        killed += 1
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    pass
        if not found or time.monotonic() > deadline:
            return killed
        time.sleep(0.01)
