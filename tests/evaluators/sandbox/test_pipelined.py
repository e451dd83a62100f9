"""The first batch sent right behind the code: load failures and start-up limits still name themselves."""
import numpy as np
import pytest

from evaluators._base import CandidateError
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.process import PolicyProcess
from store.records import Status

LIMITS = SandboxConfig(wall_s=20, startup_s=3, memory_mb=1024)
SMALL = [({"x": np.arange(3.0)}, {})]
LARGE = [({"x": np.arange(40_000.0)}, {})]  # 320 KB: more than a pipe holds
HUGE = [({"x": np.arange(600_000.0)}, {})]  # 4.8 MB: more than the shared area holds, so on the pipe


@pytest.mark.parametrize("batch", [SMALL, LARGE, HUGE], ids=["small", "larger than a pipe", "larger than the area"])
def test_a_program_that_fails_to_load_says_so(batch):
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess("raise ValueError('no')\ndef policy(s, p):\n    return 0", "policy", LIMITS,
                          pipelined=True) as proc:
        proc(batch)
    assert caught.value.status == Status.FAILED and "failed to load" in caught.value.reason
    assert "ValueError: no" in caught.value.reason


@pytest.mark.parametrize("batch", [SMALL, HUGE], ids=["small", "larger than the area and a pipe"])
def test_a_program_that_hangs_at_load_meets_the_start_up_limit(batch):
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess("import time\ntime.sleep(60)\ndef policy(s, p):\n    return 0", "policy", LIMITS,
                          pipelined=True) as proc:
        proc(batch)
    assert caught.value.status == Status.TIMEOUT and "start-up limit" in caught.value.reason, caught.value.reason


def test_answers_and_protections_are_those_of_the_plain_path():
    code = "def policy(s, p):\n    return s['x'] * 2"
    with PolicyProcess(code, "policy", LIMITS, pipelined=True) as proc:
        first = proc(HUGE)[0]  # its start-up reply read while the batch is written
        second = proc(SMALL)[0]
        proc.confirm_started()
    with PolicyProcess(code, "policy", LIMITS) as plain:
        plain(SMALL)
    assert np.array_equal(first, HUGE[0][0]["x"] * 2) and np.array_equal(second, [0.0, 2.0, 4.0])
    assert proc.protections == plain.protections and proc.missing == plain.missing


def test_a_program_that_is_never_asked_is_still_checked():
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess("def other(s, p):\n    return 0", "policy", LIMITS, pipelined=True) as proc:
        proc.confirm_started()
    assert "failed to load" in caught.value.reason and "no function named 'policy'" in caught.value.reason


# Answers how many calls its process has had; prints each call, and dies when x is negative.
COUNTING = ("import os, sys\nCALLS = []\ndef policy(s, p):\n    CALLS.append(1)\n"
            "    print('call', len(CALLS), 'x', s['x'][0])\n    sys.stdout.flush()\n"
            "    if s['x'][0] < 0:\n        os._exit(3)\n    return s['x'] * 0 + len(CALLS)")


def _ask(proc, x: float) -> float:
    return float(proc([({"x": np.array([x])}, {})])[0][0])


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "plain"])
def test_a_renewed_program_remembers_nothing_of_its_last_process(pipelined):
    with PolicyProcess(COUNTING, "policy", LIMITS, pipelined=pipelined) as proc:
        proc.renew()  # sent nothing yet: the same process goes on
        counts = [_ask(proc, 1.0), _ask(proc, 1.0)]
        proc.renew()
        counts += [_ask(proc, 1.0)]
        proc.confirm_started()
    assert counts == [1.0, 2.0, 1.0] and proc.protections


def test_a_retired_program_runs_nothing_until_renewed_or_asked():
    with PolicyProcess(COUNTING, "policy", LIMITS, pipelined=True) as proc:
        counts = [_ask(proc, 1.0), _ask(proc, 1.0)]
        proc.retire()
        assert not proc.alive
        proc.renew()
        assert proc.alive
        counts.append(_ask(proc, 1.0))
        proc.retire()
        counts.append(_ask(proc, 1.0))  # asked without a renewal: a new process all the same
        proc.confirm_started()
    assert counts == [1.0, 2.0, 1.0, 1.0]
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess("raise ValueError('no')\ndef policy(s, p):\n    return 0", "policy", LIMITS,
                          pipelined=True) as proc:
        proc.retire()  # never asked: its start-up reply is read before it goes
    assert "failed to load" in caught.value.reason


def test_a_renewed_program_keeps_the_evaluation_deadline_and_reports_its_own_output():
    limits = SandboxConfig(wall_s=2, startup_s=3, memory_mb=1024)
    with PolicyProcess(COUNTING, "policy", limits, pipelined=True) as proc:
        _ask(proc, 7.0)
        proc.renew()
        with pytest.raises(CandidateError) as died:
            _ask(proc, -1.0)
        assert "exited with code 3" in died.value.reason and "call 1 x -1.0" in died.value.reason
        assert "x 7.0" not in died.value.reason  # the output is the dead process's, not the last one's
    slow = "import time\ntime.sleep(0.8)\ndef policy(s, p):\n    return s['x']"
    with pytest.raises(CandidateError) as caught, PolicyProcess(slow, "policy", limits, pipelined=True) as proc:
        for _ in range(4):  # 0.8 s to load each process: the third load runs past the evaluation's 2 s
            _ask(proc, 1.0)
            proc.renew()
    assert caught.value.status == Status.TIMEOUT and "wall-clock limit of 2 s exceeded" in caught.value.reason
