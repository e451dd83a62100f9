"""The evaluator's side of the fork server, and the next candidate's process made ready in advance.

One warm fork server (`_child.py --zygote`) per allow-list root and claimed
uid, started on first use and replaced if it dies. `take()` hands out an
isolated process that waits for its code: the one made ready while the last
candidate ran when it is still alive, else a new one; either way it then asks
for the next, so a candidate's fork and confinement happen off its own clock.
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
from dataclasses import dataclass
from pathlib import Path

_CHILD = Path(__file__).with_name("_child.py")
_PASS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG")


def _clean_env() -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONHASHSEED": "0",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.update({k: os.environ[k] for k in _PASS_ENV if k in os.environ})
    return env


class Zygote:
    """The warm fork server for one allow-list root and uid. Trusted: it prepares the root once, then only forks."""

    def __init__(self, entries: tuple, uid: int | None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(_CHILD), "--zygote", str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=_clean_env(), cwd="/", pass_fds=(theirs.fileno(),), start_new_session=True, close_fds=True)
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        setup = {"op": "setup", "uid": uid, "entries": [{"kind": k, "src": s, "dst": d} for k, s, d in entries]}
        self.missing = self._call(setup)["missing"]

    def alive(self) -> bool:
        return self.proc.poll() is None

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
        """The exit code of `pid` (as `Popen` gives it); its group is killed past `timeout`."""
        try:
            return self._call({"op": "wait", "pid": pid, "timeout": timeout})["code"]
        except (OSError, RuntimeError, ValueError):  # a dead fork server took its children with it
            return -signal.SIGKILL

    def kill(self, pid: int) -> None:
        """Kill `pid`'s process group (and so its pid namespace) without waiting for the exit."""
        try:
            self._call({"op": "kill", "pid": pid})
        except (OSError, RuntimeError, ValueError):  # a dead fork server took its children with it
            pass

    def stop(self) -> None:
        self._sock.close()  # the server kills its children and exits when its socket closes
        self.proc.wait(timeout=30)


@dataclass
class Spawned:
    """An isolated process that waits for its code: its pid, its server, our pipe ends, its output."""

    pid: int
    server: Zygote
    to_child: int
    from_child: int
    log: object

    def waiting(self) -> bool:
        """Alive and silent: a ready process writes nothing before it has its code."""
        return self.server.alive() and not select.select([self.from_child], [], [], 0)[0]

    def discard(self) -> None:
        for fd in (self.to_child, self.from_child):
            os.close(fd)
        self.log.close()
        self.server.kill(self.pid)


_ZYGOTES: dict = {}
_SPARES: dict = {}
_OWNER = 0  # the pid these belong to: a forked evaluator starts its own


def zygote(key: tuple, fresh: bool = False) -> Zygote:
    """The fork server for `key` (root entries, claimed uid), started or replaced as needed."""
    global _OWNER
    if _OWNER != os.getpid():
        _ZYGOTES.clear()
        _SPARES.clear()
        _OWNER = os.getpid()
    server = _ZYGOTES.get(key)
    if fresh or server is None or not server.alive():
        server = _ZYGOTES[key] = Zygote(*key)
    return server


def spawn(key: tuple, spec: dict) -> Spawned:
    to_child_r, to_child = os.pipe()
    from_child, from_child_w = os.pipe()
    log = tempfile.TemporaryFile()
    fds = [to_child_r, from_child_w, log.fileno()]
    try:
        try:
            server = zygote(key)
            pid = server.spawn(spec, fds)
        except (OSError, RuntimeError, ValueError):  # the fork server died under us: one fresh try
            server = zygote(key, fresh=True)
            pid = server.spawn(spec, fds)
    except BaseException:
        for fd in (to_child, from_child):
            os.close(fd)
        log.close()
        raise
    finally:
        os.close(to_child_r)
        os.close(from_child_w)
    return Spawned(pid, server, to_child, from_child, log)


def take(key: tuple, spec: dict) -> Spawned:
    """A process for a candidate: the spare made ready earlier if it still waits, else a new one."""
    zygote(key)  # (forgets another process's spares)
    ready = _SPARES.pop((key, json.dumps(spec, sort_keys=True)), None)
    if ready is not None and not ready.waiting():
        ready.discard()
        ready = None
    return ready or spawn(key, spec)


def prepare(key: tuple, spec: dict) -> None:
    """Make the next candidate's process ready now, while this one runs (one spare per root and spec)."""
    name = (key, json.dumps(spec, sort_keys=True))
    if name not in _SPARES:
        _SPARES[name] = spawn(key, spec)


def stop(key: tuple) -> None:
    """Stop `key`'s fork server and its spares (a probe's, so nothing stays behind in the driver)."""
    for spare_key in [k for k in _SPARES if k[0] == key]:
        _SPARES.pop(spare_key).discard()
    server = _ZYGOTES.pop(key, None)
    if server is not None and server.alive():
        server.stop()
