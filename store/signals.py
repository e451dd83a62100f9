"""Ctrl-C and SIGTERM wait for a transaction to end.

Python raises KeyboardInterrupt wherever the main thread is when Ctrl-C arrives, and
DuckDB turns one that arrives during a query into `RuntimeError: Query interrupted`.
Inside a transaction either one rolls the batch back and escapes the caller's
`except KeyboardInterrupt`, so a stop pressed during a commit ended the run with a
traceback and lost the batch. `held()` notes the signals that arrive in its block and
delivers them, each once, to the handlers that were there before, once the block ends.
A transaction lasts milliseconds to seconds; kill -9 still quits at once.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def held():
    """Defer Ctrl-C and SIGTERM until the block ends (main thread only: others never get signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def note(signum, frame):
        caught.append(signum)
    before = {signum: signal.signal(signum, note) for signum in _SIGNALS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(caught):
            _deliver(signum, before[signum])


def _deliver(signum: int, handler) -> None:
    if callable(handler):
        handler(signum, None)  # Python's own for SIGINT raises KeyboardInterrupt
    elif handler != signal.SIG_IGN:  # the default action (or one set outside Python): send it again
        os.kill(os.getpid(), signum)


@contextmanager
def ctrl_c_as_such():
    """A Ctrl-C that arrived during a query outside `held` comes out of DuckDB as `RuntimeError:
    Query interrupted`; raise it as the KeyboardInterrupt it is, for the caller's stop to see."""
    try:
        yield
    except RuntimeError as exc:
        if not interrupted(exc):
            raise
        raise KeyboardInterrupt from None


def interrupted(exc: BaseException) -> bool:
    """Whether `exc` is DuckDB's answer to a Ctrl-C."""
    return isinstance(exc, RuntimeError) and str(exc).strip() == "Query interrupted"


def stopping() -> None:
    """Once a stop began (Ctrl-C, SIGTERM, `atoll stop`), what remains takes seconds: the last commit,
    the run's end in the archive and the library, Ray's shutdown. A second Ctrl-C would break those
    off halfway; from now on Ctrl-C and SIGTERM say once what is left and how to quit at once, and are
    otherwise ignored. Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, still_stopping)
    signal.signal(signal.SIGTERM, still_stopping)


def still_stopping(signum=None, frame=None) -> None:
    """Say what is left of a stop and how to quit at once, once a process (a signal handler: it
    imports nothing, as a signal may come in the middle of an import)."""
    if not _SAID:
        _SAID.append(signum)
        print(f"atoll: still stopping: committing what finished, then stopping Ray (seconds). kill -9 "
              f"{os.getpid()} quits at once; a resume then redoes the last seconds' work.", file=sys.stderr,
              flush=True)


_SAID: list = []
