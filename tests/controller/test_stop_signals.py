"""The handlers `atoll run`, `resume`, `report` and `baselines` put on Ctrl-C and SIGTERM."""
import gc
import os
import signal
import sys
import time

import pytest

from controller import commands
from store import signals


@pytest.fixture()
def stop_handlers():
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    hook = sys.unraisablehook
    commands.stop_on_signals()
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)
    sys.unraisablehook = hook


class _Swallows:
    """Ctrl-C arriving in a destructor: Python prints 'Exception ignored' and goes on (as in an at-fork handler)."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, inside __del__


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_lost_where_python_ignores_exceptions_leaves_a_later_signal_to_stop(stop_handlers, signum,
                                                                                     monkeypatch, capsys):
    """One more signal soon after the first is one line (the first is on its way to its catcher); a
    later one stops. A handler that began the stop itself had a run whose first Ctrl-C fell into a
    fork's handler run on to its end, saying it was stopping."""
    # the grace is set, not waited out: on a loaded machine a wait of half a second was sometimes
    # longer than the grace, and the "within the grace" signal stopped the test's own process
    monkeypatch.setattr(commands, "STOP_GRACE_S", 600.0)
    monkeypatch.setattr(signals, "_SAID", [])
    _Swallows()
    gc.collect()
    os.kill(os.getpid(), signum)  # within the grace: the line, no KeyboardInterrupt
    time.sleep(0.1)
    err = capsys.readouterr().err
    assert "atoll: still stopping" in err and "Exception ignored" not in err  # the lost one said nothing
    monkeypatch.setattr(commands, "STOP_GRACE_S", 0.0)  # the grace is over
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signum)
        time.sleep(1)


_CTRL_C_AT_IMPORT = """
import builtins, os, signal, sys, tomllib
entry = tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"]["atoll"]  # what `atoll` runs
module, name = entry.split(":")
real, target = builtins.__import__, sys.argv[1]

def importing(what, globals=None, locals=None, fromlist=(), level=0):
    named = [what] + [f"{what}.{name}" for name in fromlist or ()]  # `from controller import commands` too
    if target in named and target not in sys.modules:  # Ctrl-C arrives while that module loads
        os.kill(os.getpid(), signal.SIGINT)
    return real(what, globals, locals, fromlist, level)

builtins.__import__ = importing
sys.argv = ["atoll", "status", sys.argv[2]]
raise SystemExit(getattr(__import__(module, fromlist=[name]), name)())
"""


@pytest.mark.parametrize("module", ["controller.config", "controller.commands"])
def test_ctrl_c_while_atolls_modules_load_is_one_line(tmp_path, module):
    """A Ctrl-C in a command's first second, while its modules load, printed a traceback through
    pydantic or tomllib; it is one line, exit 130, from the entry point `atoll` runs."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", _CTRL_C_AT_IMPORT, module, str(tmp_path)], cwd=root,
                         capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in out.stderr and out.returncode == 130, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "stopped (Ctrl-C" in out.stderr, out.stderr
    # `status` only reads: "what was committed before stays" spoke of commits it never makes
    assert "committed" not in out.stderr, out.stderr
