"""Score integrity: hostile candidates for the trading domain, each through the real Evaluator.

Every hostile program's honest behaviour is buy & hold, so none of them may
score better than honest buy & hold; each either gets exactly that honest
score or a status with a readable reason.
"""
import os

import pytest

from evaluators.sandbox.config import SandboxConfig
from evaluators.evaluator import Evaluator
from evaluators.domains.trading.data import skfolio_data_dir
from store.records import Status
from tests.evaluators.hostile import (HUGE_REASON, SNOOP_PRELUDE, WRONG_READY_REASON, assert_outcome,
                                     forge_frame, remember_prelude, huge_reply, wrong_ready)

OPTIONS = {"assets": ["SP500", "KO", "XOM"], "tune_bars": 60, "test_bars": 40, "holdout_bars": 60,
           "max_folds": 3, "tune_trials": 2}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = str(skfolio_data_dir())
HOLD = "import numpy as np\n\ndef policy(state, params):\n    return np.ones(len(state['close']))\n"

PATCH_SCORING = HOLD + '''
def _patch():
    import sys, builtins
    try:
        import evaluators.domains.trading.domain as tr
        tr.Trading.evaluate = lambda *a, **k: None
        tr.check_positions = lambda *a, **k: None
        import evaluators.domains.trading.stats as st
        st.sharpe = lambda *a, **k: 99.0
    except Exception:
        pass
    sys.modules["evaluators.domains.trading.domain"] = None
    builtins.abs = lambda *a, **k: 0
    builtins.max = lambda *a, **k: 0
_patch()
'''

PATCH_NUMPY = '''\
import numpy as np
np.mean = lambda *a, **k: 99.0
np.std = lambda *a, **k: 1e-9
np.isfinite = lambda a, *r, **k: True

def policy(state, params):
    np.prod = lambda *a, **k: 99.0
    return np.ones(len(state["close"]))
'''

FORGE_FRAME = forge_frame("policy(state, params)", 'np.ones(len(state["close"]))',
                          {"score": 99.0, "status": "OK", "actions": [], "metrics": {"sharpe": 99.0}})

# Reads the package's price file and, if it can, finds each row's bar by its last closes
# and goes long only before rises: perfect foresight. Honest fallback: buy & hold.
LOOK_AHEAD = '''\
import gzip
import numpy as np

def _load():
    rows = []
    for name in ("sp500_dataset.csv.gz", "sp500_index.csv.gz"):
        try:
            with gzip.open(DATA + "/" + name, "rt") as f:
                lines = f.read().split()[1:]
        except OSError:
            return None
        rows.append(np.array([[float(v) for v in line.split(",")[1:]] for line in lines]))
    return np.concatenate(rows, axis=1).T

PRICES = _load()

def policy(state, params):
    close = state["close"]
    if PRICES is None:
        return np.ones(len(close))
    ratio = (PRICES[:, :-1] / PRICES[:, 1:]).astype(np.float32)
    out = np.ones(len(close))
    for i, row in enumerate(close):
        for asset, k in np.argwhere(ratio == row[-2]):  # ratio[:, k] = close k / close k + 1
            d = k + 1
            if d + 2 < PRICES.shape[1] and np.allclose(PRICES[asset, d - 5:d + 1] / PRICES[asset, d], row[-6:], rtol=1e-6):
                out[i] = 1.0 if PRICES[asset, d + 2] > PRICES[asset, d + 1] else 0.0
                break
    return out
'''

SNOOP = SNOOP_PRELUDE + '''
def policy(state, params):
    _snoop_processes()
    _snoop_packages()
    _try("project", lambda: os.listdir(PROJECT))
    _try("price files", lambda: os.listdir(DATA))
    _try("skfolio import", lambda: __import__("skfolio.datasets").datasets.load_sp500_index())
    raise RuntimeError("snooped: " + " | ".join(FOUND))
'''

REMEMBER = remember_prelude(' + [DATA + "/atoll_note"]') + '''
def policy(state, params):
    return np.zeros(len(state["close"])) if REMEMBERED else np.ones(len(state["close"]))
'''


def _fill(code):
    return code.replace("PROJECT", repr(ROOT)).replace("DATA", repr(DATA))


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator("trading", OPTIONS, SandboxConfig(wall_s=60, startup_s=10))


@pytest.fixture(scope="module")
def honest(evaluator):
    """Honest buy & hold's score per split (the bar no hostile program may beat)."""
    scores = {}
    for split in ("search", "heldout"):
        result = evaluator.evaluate("hold", HOLD, split)
        assert result.status == Status.OK and result.score != 0.0
        scores[split] = result.score
    return scores



@pytest.mark.parametrize("name, code", [("patch scoring", PATCH_SCORING), ("patch numpy", PATCH_NUMPY)])
@pytest.mark.parametrize("split", ["search", "heldout"])
def test_patching_the_candidate_process_changes_nothing_trusted(evaluator, honest, name, code, split):
    assert_outcome(evaluator.evaluate(name, code, split), Status.OK, score=honest[split])


def test_forged_frames_are_rejected(evaluator, honest):
    result = evaluator.evaluate("forge", FORGE_FRAME, "search")
    assert_outcome(result, Status.INVALID, "malformed reply from the program: the reply has 4 fields")


@pytest.mark.parametrize("split", ["search", "heldout"])
def test_reading_future_prices_from_the_package_is_impossible(evaluator, honest, split):
    result = evaluator.evaluate("look-ahead", _fill(LOOK_AHEAD), split)
    assert result.status == Status.OK and result.score == pytest.approx(honest[split], abs=1e-12)


def test_the_look_ahead_program_would_win_if_it_could_read_the_file():
    """The control for the test above: on the trusted side the same program sees the future."""
    from evaluators.registry import get_domain

    namespace = {}
    exec(_fill(LOOK_AHEAD), namespace)
    assert namespace["PRICES"] is not None
    fn = namespace["policy"]
    domain = get_domain("trading", **dict(OPTIONS, assets=["KO"], max_folds=1))
    cheat = domain.evaluate(lambda b: [fn(s, p) for s, p in b], {}, "search")
    hold = domain.evaluate(lambda b: [1.0 for _ in b], {}, "search")
    assert cheat.score > hold.score + 3


def test_process_parent_project_and_data_are_out_of_reach(evaluator, honest):
    result = evaluator.evaluate("snoop", _fill(SNOOP), "heldout")
    assert result.status == Status.FAILED and "snooped:" in result.error
    for leak in ("environ:", "memory:", "maps:", "project:", "price files:", "skfolio import:", "packages:",
                 "imported "):
        assert leak not in result.error, result.error


def test_nothing_written_in_one_evaluation_is_seen_by_the_next(evaluator, honest):
    first = evaluator.evaluate("remember", _fill(REMEMBER), "search")
    second = evaluator.evaluate("remember", _fill(REMEMBER), "search")
    assert_outcome(first, Status.OK, score=honest["search"])
    assert_outcome(second, Status.OK, score=honest["search"])
    assert not os.path.exists(os.path.join(ROOT, "atoll_note")) and not os.path.exists(DATA + "/atoll_note")


@pytest.mark.parametrize("code, needle", [
    ("import numpy as np\ndef policy(state, params):\n    return np.full(len(state['close']), np.nan)\n", "not finite"),
    ("import numpy as np\ndef policy(state, params):\n    return np.full(len(state['close']), np.inf)\n", "not finite"),
    ("import numpy as np\ndef policy(state, params):\n    return 2 * np.ones(len(state['close']))\n", "[-1, 1]"),
    ("import numpy as np\ndef policy(state, params):\n    return np.ones((len(state['close']), 2))\n", "shape"),
])
def test_bad_positions_are_invalid_with_a_reason(evaluator, code, needle):
    result = evaluator.evaluate("bad", code, "search")
    assert result.status == Status.INVALID and needle in result.error and "bar " in result.error


def test_a_reply_that_is_not_numbers_fails_with_a_reason(evaluator):
    result = evaluator.evaluate("words", "def policy(state, params):\n    return 'long'\n", "search")
    assert result.status == Status.FAILED and "numbers" in result.error


def test_zero_trades_score_zero_with_the_gate(evaluator):
    result = evaluator.evaluate("cash", "def policy(state, params):\n    return 0.0\n", "search")
    assert result.status == Status.OK and result.score == 0.0 and "zero trades" in result.metrics["gate"]


ANSWER = ('policy(state, params)', 'np.ones(len(state["close"]))')
REPLIES = {"16 MiB reply": (huge_reply(*ANSWER), HUGE_REASON), "wrong ready": (wrong_ready(*ANSWER), WRONG_READY_REASON)}


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_replies_that_could_hurt_the_evaluator_are_invalid(evaluator, name):
    code, reason = REPLIES[name]
    assert_outcome(evaluator.evaluate("reply", code, "search"), Status.INVALID, reason)
