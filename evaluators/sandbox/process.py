"""Trusted side of the sandbox: start a candidate's process and talk to it.

`PolicyProcess` is the only way candidate code runs. Each candidate gets a new
process, forked from a warm, trusted fork server (a Python started with `-I`
and a clean environment that has imported numpy, prepared the candidates'
allow-list root and never runs candidate code), and talks to it over two
private pipes with length-prefixed msgpack frames (see `wire`). The candidate
never sees scoring code or data; it answers batches of states with actions.
Every way it can misbehave (crash, hang, exit, garbage, a reply larger than the
request calls for) becomes a `CandidateError` with a short, readable reason.
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

import numpy as np

from evaluators._base import CandidateError
from evaluators.sandbox import uids, wire
from evaluators.sandbox.allowlist import root_entries
from evaluators.sandbox.config import SandboxConfig
from store.records import Status

_CHILD = Path(__file__).with_name("_child.py")
_PASS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG")
START_FRAME = 16 << 10  # the start-up reply: protections, or a load error
TEXT_CHARS = 4000  # a candidate's text (error, output) kept in a result


def reply_bounds(batches: list) -> tuple[list[int], int]:
    """Per batch, the most numbers its action array may hold; and the largest frame the reply may be.

    A reply holds at most 1024 numbers plus four per number of the batch's state,
    so what a candidate may send back follows from what it was asked.
    """
    items = [1024 + 4 * _numbers(state) for state, _ in batches]
    return items, START_FRAME + sum(8 * n + 128 for n in items)


def _numbers(state) -> int:
    """How many numbers a state holds (a dict of arrays, or one array)."""
    values = state.values() if isinstance(state, dict) else (state,)
    return sum(int(np.size(v)) for v in values)


def clip(text: str, limit: int = TEXT_CHARS) -> str:
    """A candidate's text cut to `limit` characters (its end kept: a traceback's last lines say most)."""
    return text if len(text) <= limit else f"[{len(text) - limit} characters cut]\n" + text[-limit:]


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
    """One candidate program in its own sandboxed process, for one evaluation.

    `modules` are the top-level modules the program may import besides the
    standard library (a domain's `program_modules()`); `hide` lists paths that
    must stay unreadable even inside those (nothing else is visible anyway).
    """

    def __init__(self, code: str, entry_point: str, limits: SandboxConfig,
                 hide: tuple[str, ...] = (), modules: tuple[str, ...] = ("numpy",)):
        self.code, self.entry_point, self.limits = code, entry_point, limits
        self.hide, self.modules = tuple(hide), tuple(modules)
        self.protections: list[str] = []
        self.missing: dict[str, str] = {}  # protection -> why it does not hold
        self.calls = 0
        self._pid: int | None = None
        self._server: _Zygote | None = None
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
        spec = {"scratch_mb": self.limits.scratch_mb, "require": list(self.limits.require),
                "limits": self.limits.model_dump(include={"memory_mb", "cpu_s", "file_mb", "processes"})}
        key = (root_entries(self.modules, self.hide), uids.evaluator_uid())
        try:
            fds = [to_child_r, from_child_w, self._log.fileno()]
            try:
                self._server = _zygote(key)
                self._pid = self._server.spawn(spec, fds)
            except (OSError, RuntimeError, ValueError):  # the fork server died under us: one fresh try
                self._server = _zygote(key, fresh=True)
                self._pid = self._server.spawn(spec, fds)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._deadline = time.monotonic() + self.limits.wall_s
        reply = self._exchange({"code": self.code, "entry": self.entry_point}, None, "start-up")
        self._started(reply)

    def _started(self, reply: dict) -> None:
        if "unsafe" in reply:
            why = "; ".join(f"{name}: {reason}" for name, reason in reply["unsafe"].items())
            raise CandidateError(Status.FAILED, f"the sandbox cannot hold what evaluator.sandbox.require asks ({why})")
        if "error" in reply:
            raise CandidateError(Status.FAILED, "the program failed to load:\n" + clip(reply["error"]))
        self.protections, self.missing = list(reply["ready"]), dict(reply.get("missing", {}))

    def __call__(self, batches: list) -> list:
        """Send a list of (state, params) batches; return the policy's action arrays."""
        self.calls += 1
        reply = self._exchange({"batches": batches}, batches, "wall-clock")
        if "error" in reply:
            raise CandidateError(Status.FAILED, "the policy raised:\n" + clip(reply["error"]))
        actions = reply["actions"]
        if len(actions) != len(batches):
            raise CandidateError(Status.INVALID, "the policy's reply is not one action array per batch")
        return actions

    def _exchange(self, message, batches: list | None, clock: str) -> dict:
        """Send `message`; read the reply, bounded by what `batches` asked for (None: start-up)."""
        items, limit = reply_bounds(batches) if batches is not None else (None, START_FRAME)
        deadline = time.monotonic() + self.limits.startup_s if batches is None else self._deadline
        try:
            self._write(wire.pack(message), deadline, clock)
            length = wire.frame_length(self._read(4, deadline, clock), limit)
            return wire.read_reply(self._read(length, deadline, clock), items)
        except wire.WireError as exc:
            self.close()
            raise CandidateError(Status.INVALID, f"malformed reply from the program: {exc}") from None

    def _write(self, data: bytes, deadline: float, clock: str) -> None:
        while data:
            self._wait(self._to_child, deadline, clock, write=True)
            try:
                data = data[os.write(self._to_child, data):]
            except BrokenPipeError:
                self._died()

    def _read(self, n: int, deadline: float, clock: str) -> bytes:
        chunks = []
        while n:
            self._wait(self._from_child, deadline, clock)
            chunk = os.read(self._from_child, min(n, 1 << 20))
            if not chunk:
                self._died()
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _wait(self, fd: int, deadline: float, clock: str, write: bool = False) -> None:
        left = max(deadline - time.monotonic(), 0)
        ready = select.select([], [fd], [], left)[1] if write else select.select([fd], [], [], left)[0]
        if not ready:
            self.close()
            if clock == "start-up":
                raise CandidateError(Status.TIMEOUT, f"start-up limit of {self.limits.startup_s:g} s exceeded "
                                                     "(starting the process and loading the program)")
            raise CandidateError(Status.TIMEOUT, f"wall-clock limit of {self.limits.wall_s:g} s exceeded")

    def _died(self):
        code = self._reap(self._pid)
        self._pid = None
        status, reason = _describe_exit(code, self.limits)
        tail = self.output_tail()
        self.close()
        raise CandidateError(status, reason + (f"\noutput:\n{tail}" if tail else ""))

    def _reap(self, pid: int) -> int:
        """The exit code of `pid` (as `Popen` gives it); a dead fork server took its children with it."""
        try:
            return self._server.wait(pid, timeout=5)
        except (OSError, RuntimeError, ValueError):
            return -signal.SIGKILL

    def output_tail(self, limit: int = 1500) -> str:
        self._log.flush()
        size = self._log.seek(0, os.SEEK_END)
        self._log.seek(max(0, size - limit))
        return self._log.read().decode(errors="replace").strip()

    def close(self) -> None:
        """Kill the candidate's process group; its pid namespace takes every process it left (idempotent)."""
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
            self._reap(pid)
        if self._log is not None:
            self._log.close()
            self._log = None


class _Zygote:
    """The evaluator's warm fork server (`_child.py --zygote`) for one allow-list, started on first use.

    Trusted: it prepares the candidates' root once, then only forks. Restarted if it dies.
    """

    def __init__(self, entries: tuple, uid: int | None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(_CHILD), "--zygote", str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=_clean_env(), cwd="/", pass_fds=(theirs.fileno(),), start_new_session=True, close_fds=True)
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        setup = {"op": "setup", "uid": uid, "entries": [{"kind": k, "src": s, "dst": d} for k, s, d in entries]}
        self.missing = self._call(setup)["missing"]

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


_ZYGOTES: dict = {}
_ZYGOTES_PID = 0


def _zygote(key: tuple, fresh: bool = False) -> _Zygote:
    """The fork server for `key` (root entries, claimed uid), started or replaced as needed."""
    global _ZYGOTES_PID
    if _ZYGOTES_PID != os.getpid():  # a forked evaluator starts its own
        _ZYGOTES.clear()
        _ZYGOTES_PID = os.getpid()
    zygote = _ZYGOTES.get(key)
    if fresh or zygote is None or not zygote.alive():
        zygote = _ZYGOTES[key] = _Zygote(*key)
    return zygote
