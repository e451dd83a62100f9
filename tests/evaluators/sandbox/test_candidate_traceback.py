"""A candidate's failure reads as its own traceback: its lines shown, the sandbox's frames left out.

The text goes into the archive, `atoll query` and the next LLM prompt on that parent, where
the sandbox's own frames (and the path Atoll is installed at) would only take room.
"""
import numpy as np
import pytest

from evaluators._base import CandidateError
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.process import PolicyProcess
from store.records import Status

LIMITS = SandboxConfig(wall_s=20, startup_s=5, memory_mb=1024)
BATCH = [({"x": np.arange(3.0)}, {})]

RAISES = """import numpy as np


def helper(x):
    return x[7]


def policy(state, params):
    scale = 2.0
    return helper(state["x"]) * scale
"""


def _reason(code: str) -> str:
    with pytest.raises(CandidateError) as caught, PolicyProcess(code, "policy", LIMITS) as proc:
        proc(BATCH)
    assert caught.value.status == Status.FAILED
    return caught.value.reason


def test_a_raising_policy_shows_its_own_lines_from_its_first_frame():
    reason = _reason(RAISES)
    assert reason.startswith("the policy raised:\nTraceback (most recent call last):\n"
                             '  File "<candidate>", line 10, in policy\n'
                             '    return helper(state["x"]) * scale\n'), reason
    assert '  File "<candidate>", line 5, in helper\n    return x[7]\n' in reason
    assert reason.rstrip().endswith("IndexError: index 7 is out of bounds for axis 0 with size 3")
    assert "_child.py" not in reason


def test_a_library_frame_below_the_candidate_stays():
    code = "import numpy as np\n\n\ndef policy(state, params):\n    return np.take_along_axis(state['x'], 5, 0)\n"
    reason = _reason(code)
    assert '  File "<candidate>", line 5, in policy\n' in reason and "numpy" in reason
    assert "_child.py" not in reason


def test_a_program_that_fails_at_load_shows_the_line_it_failed_on():
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess("x = 1\ny = x / 0\n\n\ndef policy(s, p):\n    return 0\n", "policy", LIMITS) as proc:
        proc(BATCH)
    reason = caught.value.reason
    assert reason.startswith("the program failed to load:\nTraceback (most recent call last):\n"
                             '  File "<candidate>", line 2, in <module>\n    y = x / 0\n'), reason
    assert reason.rstrip().endswith("ZeroDivisionError: division by zero") and "_child.py" not in reason


def test_a_syntax_error_is_the_error_alone():
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess("def policy(s, p:\n    return 0\n", "policy", LIMITS) as proc:
        proc(BATCH)
    reason = caught.value.reason
    assert reason.startswith('the program failed to load:\n  File "<candidate>", line 1\n'), reason
    assert "SyntaxError" in reason and "Traceback" not in reason and "_child.py" not in reason
