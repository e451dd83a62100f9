"""The bridge between the control plane's threads and the run loop.

The run loop is the only thread that touches the search and the archive. A gRPC
thread that wants something (a status, a pause, a budget change) puts a `Command`
with a future on a thread-safe queue and waits; the loop takes the queue at its
tick (at most half a second apart) and answers. Events go the other way: the loop
publishes them as it commits, and each subscriber (an `Events` stream) has a
bounded queue of its own, so a slow watcher never holds the loop up; it loses its
oldest events instead. When the search ends, queued commands fail with `Ended` and
every stream gets a last "ended" event.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

ANSWER_TIMEOUT_S = 30.0
EVENTS_KEPT = 2000  # per subscriber; older ones are dropped for a watcher that reads too slowly


class Refused(Exception):
    """A command the run cannot take (a bad key or value); the message is one line naming it."""


class Ended(Exception):
    """The search has ended, so its control plane takes no more commands."""


@dataclass(frozen=True)
class Command:
    """What a control-plane caller asks of the loop: status, pause, resume, stop or set (key=value)."""

    kind: str
    key: str = ""
    value: str = ""


@dataclass(frozen=True)
class Event:
    """Something that happened in the run, as committed; `detail` is plain JSON-able data."""

    time: float
    kind: str
    detail: dict = field(default_factory=dict)


class Steering:
    """Thread-safe: callers `ask` and `subscribe` from any thread; the loop `take`s, `publish`es and `end`s."""

    def __init__(self):
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._subscribers: set[queue.Queue] = set()
        self._ended: Event | None = None

    # --- the control plane's threads ---------------------------------------------------
    def ask(self, command: Command, timeout_s: float = ANSWER_TIMEOUT_S):
        """The loop's answer; raises Refused, Ended, or TimeoutError when the loop does not take the command
        in time, and then never carries it out (a stop the caller was told had failed stopped the run later)."""
        future: Future = Future()
        with self._lock:
            if self._ended is not None:
                raise Ended(f"the search has ended ({self._ended.detail.get('status')})")
            self._commands.put((command, future))
        try:
            return future.result(timeout_s)
        except TimeoutError:
            if future.cancel():
                raise
            return future.result()  # the loop took it just now: its answer comes

    def subscribe(self) -> queue.Queue:
        """A queue of the events from now on, closed by None after the "ended" event."""
        events: queue.Queue = queue.Queue(maxsize=EVENTS_KEPT)
        with self._lock:
            if self._ended is not None:
                events.put(self._ended)
                events.put(None)
            else:
                self._subscribers.add(events)
        return events

    def unsubscribe(self, events: queue.Queue) -> None:
        with self._lock:
            self._subscribers.discard(events)

    # --- the loop's thread -------------------------------------------------------------
    def take(self) -> list[tuple[Command, Future]]:
        """The commands asked since the last take and still awaited (never blocks)."""
        taken = []
        while True:
            try:
                command, future = self._commands.get_nowait()
            except queue.Empty:
                return taken
            if future.set_running_or_notify_cancel():  # False: its caller gave up waiting
                taken.append((command, future))

    def publish(self, kind: str, detail: dict | None = None) -> None:
        event = Event(time.time(), kind, detail or {})
        with self._lock:
            for events in self._subscribers:
                _put(events, event)

    def end(self, status: str) -> None:
        """The search ended: refuse what is still queued, send "ended" and close every stream."""
        with self._lock:
            if self._ended is not None:
                return
            self._ended = Event(time.time(), "ended", {"status": status})
            for events in self._subscribers:
                _put(events, self._ended)
                _put(events, None)
            self._subscribers.clear()
        for _, future in self.take():
            future.set_exception(Ended(f"the search has ended ({status})"))


def _put(events: queue.Queue, item) -> None:
    """Add without blocking; a full queue drops its oldest event."""
    while True:
        try:
            events.put_nowait(item)
            return
        except queue.Full:
            try:
                events.get_nowait()
            except queue.Empty:
                pass
