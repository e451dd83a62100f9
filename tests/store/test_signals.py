"""Ctrl-C and SIGTERM during a commit: the batch is committed whole, then the stop happens.

Before, a Ctrl-C that arrived inside a transaction rolled the batch back; one that arrived
during DuckDB's COMMIT came out as `RuntimeError: Query interrupted`, which the search's
`except KeyboardInterrupt` never saw (a traceback instead of a clean stop)."""
import os
import signal
import subprocess
import sys
import threading
import time

import duckdb
import pytest

from store import signals
from store.duckdb_archive import DuckDBArchive
from store.library import Library
from tests.conftest import ROOT
from tests.store.test_archive import cand, ok


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt in these tests, as it does in `atoll` (`controller.cli._stoppable`),
    even in a suite started with SIGINT ignored or blocked: a background job of a non-interactive shell
    inherits it ignored, and these tests' Ctrl-C then never arrived."""
    before = signal.getsignal(signal.SIGINT)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _ctrl_c():
    os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_inside_a_commit_waits_for_it(tmp_path):
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        archive.create_run("r1", {"run": {"name": "t"}}, "")
        with pytest.raises(KeyboardInterrupt):
            archive.write("r1", pairs=[(cand("a"), ok("a", 1.0))], also=_ctrl_c)
        assert archive.count_evaluations("r1", "search") == 1
        archive.write("r1", pairs=[(cand("b", ("a",)), ok("b", 2.0))])  # the writer's count moved with it
        assert archive.count_evaluations("r1", "search") == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_inside_a_library_transaction_waits_for_it(tmp_path):
    library = Library(tmp_path / "library.duckdb")
    library.ensure()

    def work(con):
        con.execute("CREATE TABLE t AS SELECT 1 AS x")
        _ctrl_c()
    with pytest.raises(KeyboardInterrupt):
        library.transaction(work)
    assert library.transaction(lambda con: con.execute("SELECT x FROM t").fetchall()) == [(1,)]


def test_held_signals_reach_the_handler_before_once_each_after_the_block():
    got = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        with signals.held():
            for _ in range(3):
                os.kill(os.getpid(), signal.SIGTERM)
            assert got == []
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_ctrl_c_during_a_query_outside_a_transaction_comes_out_as_one():
    """DuckDB turns the Ctrl-C into `RuntimeError: Query interrupted` when it sees it during the query
    (not always: then Python raises it once the query returns); either way a KeyboardInterrupt."""
    con = duckdb.connect()
    timer = threading.Timer(0.2, _ctrl_c)
    timer.start()
    with pytest.raises(KeyboardInterrupt), signals.ctrl_c_as_such():  # a second or so of work, bounded
        con.execute("SELECT count(*) FROM range(300000000) t(i) WHERE i % 7 = 3").fetchall()
        time.sleep(5)  # the Ctrl-C arrives here if the query was faster than the timer
    timer.join()
    with pytest.raises(RuntimeError, match="other"), signals.ctrl_c_as_such():
        raise RuntimeError("other")


def test_duckdbs_answer_to_a_ctrl_c_is_told_from_other_errors():
    assert signals.interrupted(RuntimeError("Query interrupted"))
    assert not signals.interrupted(RuntimeError("Query interrupted by a bug elsewhere"))
    assert not signals.interrupted(ValueError("Query interrupted"))


_AT_EXIT = """
import signal, sys
sys.path.insert(0, sys.argv[1])
from store import signals
if sys.argv[2] == "stopping":
    signals.stopping()
signals.stop_done()
print([signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)])
"""


@pytest.mark.parametrize("state", ["stopping", "not stopping"])
def test_once_a_stop_is_done_a_late_signal_is_ignored_not_the_default_that_kills(state):
    """Python puts each signal's default action back as it exits, and a Ctrl-C there killed a stopped
    run (exit -2, its buffered output lost); `atoll` calls stop_done last at exit. Outside a stop the
    handlers stay as they were."""
    proc = subprocess.run([sys.executable, "-c", _AT_EXIT, str(ROOT), state], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([state == "stopping"] * 3)
