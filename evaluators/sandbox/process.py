"""Trusted side of the sandbox: start a candidate's process and talk to it.

`PolicyProcess` is the only way candidate code runs. Each candidate gets a new
process, forked from a warm, trusted fork server (`server`: a Python started
with `-I` and a clean environment that has imported numpy, prepared the
candidates' allow-list root and never runs candidate code) and confined before
its code arrives; the two talk over private pipes in length-prefixed msgpack
frames (see `wire`). The candidate never sees scoring code or data; it answers
batches of states with actions.
Every way it can misbehave (crash, hang, exit, garbage, a reply larger than the
request calls for) becomes a `CandidateError` with a short, readable reason.
A domain that shows the program the same data again asks for a new process of
it first (`renew`), so no pass can remember the last.
"""
from __future__ import annotations

import os
import select
import signal
import time

import numpy as np

from evaluators._base import CandidateError
from evaluators.sandbox import replies, server, uids, wire
from evaluators.sandbox.allowlist import root_entries
from evaluators.sandbox.config import SandboxConfig
from store.records import Status

START_FRAME = 16 << 10  # the start-up reply: protections, or a load error
TEXT_CHARS = 4000  # a candidate's text (error, output) kept in a result
REAP_S = 5  # how long a process that closed its channel has to exit before it is killed


def reply_bounds(batches: list) -> tuple[list[int], int]:
    """Per batch, the most numbers its action array may hold; and the largest frame the reply may be.

    A reply holds at most 1024 numbers plus four per number of the batch's state,
    so what a candidate may send back follows from what it was asked.
    """
    return _bounds([_numbers(state) for state, _ in batches])


def _bounds(numbers: list[int]) -> tuple[list[int], int]:
    """`reply_bounds` from how many numbers each batch's state holds."""
    items = [1024 + 4 * n for n in numbers]
    return items, START_FRAME + sum(8 * n + 128 for n in items)


def _numbers(state) -> int:
    """How many numbers a state holds (a dict of arrays, or one array)."""
    values = state.values() if isinstance(state, dict) else (state,)
    return sum(v.size if type(v) is np.ndarray else 1 if type(v) in (int, float, bool) else int(np.size(v))
               for v in values)


def clip(text: str, limit: int = TEXT_CHARS) -> str:
    """A candidate's text cut to `limit` characters (its end kept: a traceback's last lines say most)."""
    return text if len(text) <= limit else f"[{len(text) - limit} characters cut]\n" + text[-limit:]


def _describe_exit(code: int, limits: SandboxConfig) -> tuple[Status, str]:
    if code >= 0:
        return Status.FAILED, f"the program exited with code {code} before answering"
    sig = -code
    if sig == signal.SIGXCPU:
        return Status.TIMEOUT, f"CPU-time limit of {limits.cpu_s} s exceeded"
    if sig == signal.SIGXFSZ:
        return Status.FAILED, f"file-size limit of {limits.file_mb} MiB exceeded"
    try:
        name = signal.Signals(sig).name
    except ValueError:  # a real-time signal has no name
        name = str(sig)
    return Status.FAILED, f"the program was killed by signal {name}"


class PolicyProcess:
    """One candidate program in its own sandboxed process, for one evaluation (a new process at each `renew`).

    `modules` are the top-level modules the program may import besides the
    standard library (a domain's `program_modules()`); `hide` lists paths that
    must stay unreadable even inside those (nothing else is visible anyway).
    """

    def __init__(self, code: str, entry_point: str, limits: SandboxConfig,
                 hide: tuple[str, ...] = (), modules: tuple[str, ...] = ("numpy",), spare: bool = True,
                 pipelined: bool = False):
        """`pipelined`: the first batch goes out right behind the code, before the start-up reply
        is read (one round trip less per candidate); call `confirm_started()` after the last use."""
        self.code, self.entry_point, self.limits = code, entry_point, limits
        self.hide, self.modules, self.spare, self.pipelined = tuple(hide), tuple(modules), spare, pipelined
        self._starting = False
        self.protections: list[str] = []
        self.missing: dict[str, str] = {}  # protection -> why it does not hold
        self.calls = 0
        self._seen = False  # the current process has been sent a batch
        self._retired = False  # its process was stopped by `retire`; the next `renew` or call starts one
        self._pid: int | None = None
        self._server: server.Zygote | None = None
        self._to_child = self._from_child = None  # our ends of the two pipes
        self._log = None  # the candidate's stdout and stderr
        self._buffer = bytearray()  # read from the candidate, not yet taken
        self._area = None  # the shared memory its requests' arrays go in (read-only to it)
        self._replies = replies.Replies()

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
        self._open(first=True)

    def renew(self) -> None:
        """Go on in a new process of the same program that has seen no batch (see `_base.renew`).

        It comes from the fork server (a spare made ready meanwhile, so it costs a few
        milliseconds); the evaluation's wall-clock deadline holds on, and its start-up, within
        that deadline, is checked like the first one's. A process that has been sent nothing
        since it started is kept: it knows nothing yet. `cpu_s` is each process's own limit.
        """
        if self._retired:
            self._retired = False
            self._open()
            return
        if not self._seen or self._to_child is None:
            return
        self.close()
        self._open()

    def retire(self) -> None:
        """Stop the program's process now; the next `renew` (or call) starts a new one (see `_base.retire`).

        Its start-up reply is read first, so a program that failed to load still says so.
        """
        if self._to_child is None:
            return
        self.confirm_started()
        self.close()
        self._retired = True

    @property
    def alive(self) -> bool:
        """Whether a process of the program is running (or loading) now."""
        return self._pid is not None

    def _open(self, first: bool = False) -> None:
        """Take a process from the fork server and send it the code; the evaluation's clock starts at the first."""
        spec = {"scratch_mb": self.limits.scratch_mb, "require": list(self.limits.require),
                "limits": self.limits.model_dump(include={"memory_mb", "cpu_s", "file_mb", "processes"})}
        key = self.server_key()
        ready = server.take(key, spec)
        self._pid, self._server, self._log = ready.pid, ready.server, ready.log
        self._to_child, self._from_child, self._area = ready.to_child, ready.from_child, ready.area
        self._buffer, self._replies, self._seen = bytearray(), replies.Replies(), False
        self._starting = False  # its code goes first, whole: the start-up reply is read only after it
        os.set_blocking(self._to_child, False)
        self._set_clocks(first)
        self._write(wire.pack({"code": self.code, "entry": self.entry_point}), self._startup,
                    self._startup_clock)
        self._starting = True
        if self.spare:  # the next candidates' processes confine themselves while this one runs
            server.prepare(key, spec)
        if not self.pipelined:
            self.confirm_started()

    def _set_clocks(self, first: bool) -> None:
        """Start the evaluation's wall clock (at the first process) and this process's start-up limit,
        which for a renewal ends at the evaluation's deadline at the latest (then named after it)."""
        now = time.monotonic()
        if first:
            self._deadline = now + self.limits.wall_s
        startup = now + self.limits.startup_s
        self._startup, self._startup_clock = ((startup, "start-up") if first or startup <= self._deadline
                                              else (self._deadline, "wall-clock"))

    def confirm_started(self) -> None:
        """Read the start-up reply, once: the protections in force, or why the program did not load."""
        if self._starting:
            self._starting = False
            self._started(self._receive(None, self._startup, self._startup_clock))

    def server_key(self) -> tuple:
        """Which fork server this program's process comes from: its root's entries and the claimed uid."""
        return root_entries(self.modules, self.hide), uids.evaluator_uid()

    def _started(self, reply: dict) -> None:
        if "unsafe" in reply:
            why = "; ".join(f"{name}: {reason}" for name, reason in reply["unsafe"].items())
            raise CandidateError(Status.FAILED, f"the sandbox cannot hold what evaluator.sandbox.require asks ({why})")
        if "error" in reply:
            raise CandidateError(Status.FAILED, "the program failed to load:\n" + clip(reply["error"], 3500))
        self.protections, self.missing = list(reply["ready"]), dict(reply.get("missing", {}))

    def __call__(self, batches: list) -> list:
        """Send a list of (state, params) batches; return the policy's action arrays."""
        if self._retired:
            self.renew()
        self.calls += 1
        self._seen = True
        if self._area is not None:
            self._area.reset()  # the last request has been answered: its arrays may go
        request = wire.flat_request(batches, self._area)
        if request is None:
            data, bounds = wire.pack({"batches": batches}), reply_bounds(batches)
        else:
            data, bounds = wire.pack(request[0]), _bounds(request[1])
        if self._starting:  # behind the code: a process that fails to load never reads it
            sent = self._write(data, self._deadline, "wall-clock", early=True)
            self.confirm_started()
            if not sent:
                self._died()
        else:
            self._write(data, self._deadline, "wall-clock")
        reply = self._receive(bounds, self._deadline, "wall-clock")
        if "error" in reply:
            raise CandidateError(Status.FAILED, "the policy raised:\n" + clip(reply["error"], 3500))
        actions = reply["actions"]
        if len(actions) != len(batches):
            raise CandidateError(Status.INVALID, "the policy's reply is not one action array per batch")
        return actions

    def _receive(self, bounds: tuple | None, deadline: float, clock: str) -> dict:
        """The next reply, within `bounds` (`reply_bounds` of the request; None: the start-up reply)."""
        items, limit = bounds if bounds is not None else (None, START_FRAME)
        try:
            length = wire.frame_length(self._read(4, deadline, clock), limit)
            body = self._read(length, deadline, clock)
            return self._replies.read(body, items) if items is not None else replies.read_reply(body)
        except wire.WireError as exc:
            self.close()
            raise CandidateError(Status.INVALID, f"malformed reply from the program: {exc}") from None

    def _write(self, data: bytes, deadline: float, clock: str, early: bool = False) -> bool:
        """Write all of `data`; False if the process had closed its end and `early` (else it died: raises).

        A process still loading its code reads nothing more until it has sent its start-up reply: on a
        full pipe that reply is read first, under the start-up limit, and only then the rest is written.
        """
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._to_child, view):]  # non-blocking: select only when the pipe is full
            except BlockingIOError:
                if self._starting:
                    self.confirm_started()
                    continue
                self._wait(self._to_child, deadline, clock, write=True)
            except BrokenPipeError:
                if early:
                    return False
                self._died()
        return True

    def _read(self, n: int, deadline: float, clock: str) -> bytes:
        """`n` bytes of the reply; one read usually brings a whole frame, the rest waits in the buffer."""
        while len(self._buffer) < n:
            self._wait(self._from_child, deadline, clock)
            chunk = os.read(self._from_child, max(n - len(self._buffer), 1 << 16))
            if not chunk:
                self._died()
            self._buffer += chunk
        data = bytes(self._buffer[:n])
        del self._buffer[:n]  # in place: a bytearray drops its front without copying the rest
        return data

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
        """The process closed its end of a pipe: it exited (say how), or it goes on without its channel."""
        code, lingered = self._reap(self._pid)
        self._pid = None
        if lingered:
            status, reason = Status.FAILED, f"the program closed its channel and did not exit (killed after {REAP_S} s)"
        else:
            status, reason = _describe_exit(code, self.limits)
        tail = self.output_tail()
        self.close()
        raise CandidateError(status, reason + (f"\noutput:\n{tail}" if tail else ""))

    def _reap(self, pid: int) -> tuple[int, bool]:
        return self._server.wait(pid, timeout=REAP_S)

    def output_tail(self, limit: int = 1500) -> str:
        self._log.flush()
        size = self._log.seek(0, os.SEEK_END)
        self._log.seek(max(0, size - limit))
        return self._log.read().decode(errors="replace").strip()

    def close(self) -> None:
        """Kill the candidate's process group; its pid namespace takes every process it left (idempotent).

        The fork server reaps it later, so closing costs the evaluator one message.
        """
        for fd in (self._to_child, self._from_child):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._to_child = self._from_child = None
        pid, self._pid = self._pid, None
        if pid is not None:
            self._server.kill(pid)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._area is not None:
            self._area.close()
            self._area = None
