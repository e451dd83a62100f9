"""Ctrl-C, SIGTERM and a hangup (SIGHUP) wait for a transaction to end.

Python raises KeyboardInterrupt wherever the main thread is when Ctrl-C arrives, and
DuckDB turns one that arrives during a query into `RuntimeError: Query interrupted`.
Inside a transaction either one rolls the batch back and escapes the caller's
`except KeyboardInterrupt`, so a stop pressed during a commit ended the run with a
traceback and lost the batch. `held()` notes the signals that arrive in its block and
delivers them, each once, to the handlers that were there before, once the block ends.
A transaction lasts milliseconds to seconds; kill -9 still quits at once. A hangup (the
terminal or the ssh session behind it went away) stops a run as Ctrl-C does, unless the
run was started to outlive it (`nohup`, which ignores SIGHUP: that stays as it is); what
is printed after it goes nowhere, since writing to a hung-up terminal fails.
"""
from __future__ import annotations

import os
import signal
import stat
import sys
import threading
from contextlib import contextmanager

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOPPED_BY: list[str] = []  # the signal that began this process's stop, named for the archive's "stopping" event
# (set by controller.commands; an `atoll stop` archives its own event, controller.helm)


@contextmanager
def held():
    """Defer Ctrl-C, SIGTERM and SIGHUP until the block ends (main thread only: others never get signals)."""
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
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # started under nohup: it stays ignored
        signal.signal(signal.SIGHUP, still_stopping)


def still_stopping(signum=None, frame=None) -> None:
    """Say what is left of a stop and how to quit at once, once a process (a signal handler: it
    imports nothing, as a signal may come in the middle of an import). A hangup says nothing: the
    terminal is gone."""
    if signum == signal.SIGHUP:
        off_the_terminal()
        return
    if not _SAID:
        _SAID.append(signum)
        try:
            print(f"atoll: still stopping: committing what finished, then stopping Ray (seconds). kill -9 "
                  f"{os.getpid()} quits at once; a resume then redoes the last seconds' work.", file=sys.stderr,
                  flush=True)
        except OSError:  # nowhere to say it (a terminal that hung up): the stop goes on
            pass


_SAID: list = []


def stop_done() -> None:
    """The stop's last step is done; only the interpreter's own exit is left. Python puts a signal's
    default action back as it exits, so a late Ctrl-C there killed the process (exit -2, what it still
    held for stdout lost); one now is ignored. Outside a stop this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _SIGNALS:
        if signal.getsignal(signum) is still_stopping:
            signal.signal(signum, signal.SIG_IGN)


def off_the_terminal() -> None:
    """After a hangup, whatever is printed to the terminal goes nowhere instead of failing (a hung-up
    terminal answers every write with EIO, which would break the stop off). Output to a file or a
    pipe stays where it is. A signal handler's: it imports nothing."""
    discard(fd for fd in (1, 2) if _is_terminal(fd))


def _is_terminal(fd: int) -> bool:
    try:
        return stat.S_ISCHR(os.fstat(fd).st_mode)  # a hung-up terminal may no longer say it is a tty
    except OSError:
        return False


def discard(fds) -> None:
    """Point each of the descriptors `fds` at /dev/null: what is written there later goes nowhere
    (a hung-up terminal, a pipe whose reader left)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for fd in fds:
        try:
            os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)
