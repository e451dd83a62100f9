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


@pytest.mark.parametrize("batch", [SMALL, LARGE], ids=["small", "larger than a pipe"])
def test_a_program_that_fails_to_load_says_so(batch):
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess("raise ValueError('no')\ndef policy(s, p):\n    return 0", "policy", LIMITS,
                          pipelined=True) as proc:
        proc(batch)
    assert caught.value.status == Status.FAILED and "failed to load" in caught.value.reason
    assert "ValueError: no" in caught.value.reason


def test_a_program_that_hangs_at_load_meets_the_start_up_limit():
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess("import time\ntime.sleep(60)\ndef policy(s, p):\n    return 0", "policy", LIMITS,
                          pipelined=True) as proc:
        proc(SMALL)
    assert caught.value.status == Status.TIMEOUT and "start-up limit" in caught.value.reason


def test_answers_and_protections_are_those_of_the_plain_path():
    code = "def policy(s, p):\n    return s['x'] * 2"
    with PolicyProcess(code, "policy", LIMITS, pipelined=True) as proc:
        first = proc(LARGE)[0]
        second = proc(SMALL)[0]
        proc.confirm_started()
    with PolicyProcess(code, "policy", LIMITS) as plain:
        plain(SMALL)
    assert np.array_equal(first, LARGE[0][0]["x"] * 2) and np.array_equal(second, [0.0, 2.0, 4.0])
    assert proc.protections == plain.protections and proc.missing == plain.missing


def test_a_program_that_is_never_asked_is_still_checked():
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess("def other(s, p):\n    return 0", "policy", LIMITS, pipelined=True) as proc:
        proc.confirm_started()
    assert "failed to load" in caught.value.reason and "no function named 'policy'" in caught.value.reason
