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
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from evaluators.sandbox.area import StateArea

_CHILD = Path(__file__).with_name("_child.py")
_PASS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "LANG")


def _clean_env() -> dict[str, str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONHASHSEED": "0",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.update({k: os.environ[k] for k in _PASS_ENV if k in os.environ})
    return env


class ForkServerFailed(RuntimeError):
    """The fork server ended before it was ready; the message is one line saying why."""


class Zygote:
    """The warm fork server for one allow-list root and uid. Trusted: it prepares the root once, then only forks."""

    def __init__(self, entries: tuple, uid: int | None):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._errors = tempfile.TemporaryFile()  # noqa: SIM115  its stderr while it lives: only a crash writes
        self.proc = subprocess.Popen(
            [sys.executable, "-I", str(_CHILD), "--zygote", str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._errors,
            env=_clean_env(), cwd="/", pass_fds=(theirs.fileno(),), start_new_session=True, close_fds=True)
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._slots: deque = deque()  # one per request sent and not answered yet, oldest first
        setup = {"op": "setup", "uid": uid, "entries": [{"kind": k, "src": s, "dst": d} for k, s, d in entries]}
        try:
            self.missing = self._call(setup)["missing"]
        except (OSError, RuntimeError, ValueError):
            self._sock.close()
            raise ForkServerFailed(self._why_not_started()) from None

    def _why_not_started(self) -> str:
        """One line: the last line the fork server wrote before it ended (an import it could not make)."""
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._errors.seek(0)
        lines = self._errors.read()[-4000:].decode(errors="replace").strip().splitlines()
        return (f"the sandbox's fork server ({sys.executable} -I, which ignores PYTHONPATH and user "
                f"site-packages) did not start: {lines[-1] if lines else f'exit status {self.proc.returncode}'}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _call(self, request: dict, fds: list[int] = ()) -> dict:
        return self.answer(self.send(request, fds))

    def send(self, request: dict, fds: list[int] = ()) -> list:
        """Send a request without waiting; its answer fills the returned slot (see `answer`).

        The server answers in order, so replies that nobody waits for (a kill's) are read
        and dropped by the next call that waits: the caller's clock never pays for them.
        """
        slot: list = []
        with self._lock:
            socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
            self._slots.append(slot)
        return slot

    def answer(self, slot: list) -> dict:
        with self._lock:
            while not slot:
                reply = self._sock.recv(1 << 16)
                if not reply:
                    raise RuntimeError("the sandbox's fork server died")
                self._slots.popleft().append(json.loads(reply))
        return slot[0]

    def spawn(self, spec: dict, fds: list[int]) -> list:
        """Fork a process for `spec`; returns the slot its pid arrives in."""
        return self.send({"op": "spawn", "spec": spec}, fds)

    def wait(self, pid: int, timeout: float) -> tuple[int, bool]:
        """(the exit code of `pid` as `Popen` gives it, whether it still ran at `timeout`): its group
        is killed past `timeout`."""
        try:
            reply = self._call({"op": "wait", "pid": pid, "timeout": timeout})
        except (OSError, RuntimeError, ValueError):  # a dead fork server took its children with it
            return -signal.SIGKILL, False
        return reply["code"], reply["lingered"]

    def kill(self, pid: int) -> None:
        """Kill `pid`'s process group (and so its pid namespace); neither the kill nor the exit is waited for."""
        try:
            self.send({"op": "kill", "pid": pid})
        except (OSError, RuntimeError, ValueError):  # a dead fork server took its children with it
            pass

    def stop(self) -> None:
        self._sock.close()  # the server kills its children and exits when its socket closes
        self.proc.wait(timeout=30)
        self._errors.close()


@dataclass
class Spawned:
    """An isolated process that waits for its code: its server, our pipe ends, its output, the shared
    memory its requests' states go in, and its pid (which arrives from the server when first asked
    for, so making a spare never waits)."""

    server: Zygote
    to_child: int
    from_child: int
    log: object
    area: StateArea | None
    slot: list = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.server.answer(self.slot)["pid"]

    def waiting(self) -> bool:
        """Alive and silent: a ready process writes nothing before it has its code."""
        try:
            self.server.answer(self.slot)
        except (OSError, RuntimeError, ValueError):
            return False
        return self.server.alive() and not select.select([self.from_child], [], [], 0)[0]

    def discard(self) -> None:
        for fd in (self.to_child, self.from_child):
            os.close(fd)
        self.log.close()
        if self.area is not None:
            self.area.close()
        try:
            self.server.kill(self.pid)
        except (OSError, RuntimeError, ValueError):  # its server is gone, and it with it
            pass


SPARES = 2  # processes made ready ahead per root and spec: each gets a whole candidate's time to confine itself
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


def spawn(key: tuple, spec: dict, wait: bool = True) -> Spawned:
    """A new process for `spec`; with `wait`, its pid is known on return (one fresh server on failure)."""
    to_child_r, to_child = os.pipe()
    from_child, from_child_w = os.pipe()
    log = tempfile.TemporaryFile()
    area = _area()
    fds = [to_child_r, from_child_w, log.fileno()] + ([area.fd] if area is not None else [])
    try:
        try:
            server = zygote(key)
            ready = Spawned(server, to_child, from_child, log, area, server.spawn(spec, fds))
            if wait:
                server.answer(ready.slot)
        except (OSError, RuntimeError, ValueError):  # the fork server died under us: one fresh try
            server = zygote(key, fresh=True)
            ready = Spawned(server, to_child, from_child, log, area, server.spawn(spec, fds))
            server.answer(ready.slot)
    except BaseException:
        for fd in (to_child, from_child):
            os.close(fd)
        log.close()
        if area is not None:
            area.close()
        raise
    finally:
        os.close(to_child_r)
        os.close(from_child_w)
        if area is not None:
            area.close_fd()
    return ready


def _area() -> StateArea | None:
    """Shared memory for the process's states, or None where this kernel cannot seal it (then they go on
    the pipe: nothing a candidate could write is ever shared)."""
    try:
        return StateArea()
    except OSError:
        return None


def take(key: tuple, spec: dict) -> Spawned:
    """A process for a candidate: the oldest spare made ready earlier if it still waits, else a new one."""
    zygote(key)  # (forgets another process's spares)
    spares = _SPARES.get((key, json.dumps(spec, sort_keys=True)), [])
    while spares:
        ready = spares.pop(0)
        if ready.waiting():
            return ready
        ready.discard()
    return spawn(key, spec)


def prepare(key: tuple, spec: dict) -> None:
    """Make the next candidates' processes ready now, while this one runs (`SPARES` per root and spec)."""
    spares = _SPARES.setdefault((key, json.dumps(spec, sort_keys=True)), [])
    while len(spares) < SPARES:
        spares.append(spawn(key, spec, wait=False))


def stop(key: tuple) -> None:
    """Stop `key`'s fork server and its spares (a probe's, so nothing stays behind in the driver)."""
    for spare_key in [k for k in _SPARES if k[0] == key]:
        for spare in _SPARES.pop(spare_key):
            spare.discard()
    server = _ZYGOTES.pop(key, None)
    if server is not None and server.alive():
        server.stop()
