"""Score integrity: hostile candidates for the inventory domain, each through the real Evaluator.

Every hostile program's honest behaviour is to order nothing, so none of them may
score better than the honest do-nothing policy; each either gets exactly that
honest score or a status with a readable reason.
"""
import os

import pytest

from evaluators.sandbox.config import SandboxConfig
from evaluators.evaluator import Evaluator
from store.records import Status
from tests.evaluators.hostile import (HUGE_REASON, SNOOP_PRELUDE, WRONG_READY_REASON, assert_outcome,
                                     forge_frame, remember_prelude, huge_reply, wrong_ready)

OPTIONS = {"search_instances": [{"lead_time": 1, "penalty": 4, "demand": "poisson"},
                                {"lead_time": 2, "penalty": 19, "demand": "poisson"}],
           "heldout_instances": [{"lead_time": 3, "penalty": 9, "demand": "geometric"}],
           "search_periods": 60, "heldout_periods": 80, "warmup": 20, "search_trajectories": 2,
           "heldout_trajectories": 3, "tune_trials": 4, "tune_batch": 2}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZERO = "import numpy as np\n\ndef policy(state, params):\n    return np.zeros(len(state['on_hand']))\n"
GOOD = ("import numpy as np\n\ndef policy(state, params):\n"
        "    return np.maximum(12 + 5 * state['lead_time'] - state['on_hand'] - state['pipeline'].sum(axis=1), 0)\n")

PATCH_SCORING = ZERO + '''
def _patch():
    import sys, builtins
    try:
        import evaluators.domains.inventory.domain as inv
        inv.Inventory.evaluate = lambda *a, **k: None
        inv.check_orders = lambda *a, **k: None
    except Exception:
        pass
    sys.modules["evaluators.domains.inventory.domain"] = None
    builtins.min = lambda *a, **k: 0
    builtins.sum = lambda *a, **k: 0
_patch()
'''

PATCH_NUMPY = '''\
import numpy as np
np.mean = lambda *a, **k: 0.0
np.minimum = lambda a, b, *r, **k: 0 * a
np.isfinite = lambda a, *r, **k: True

def policy(state, params):
    np.add = lambda *a, **k: 0
    return np.zeros(len(state["on_hand"]))
'''

FORGE_FRAME = forge_frame("policy(state, params)", 'np.zeros(len(state["on_hand"]))',
                          {"score": 0.0, "status": "OK", "actions": [], "metrics": {"mean_cost": 0.0}})

SNOOP = SNOOP_PRELUDE + '''
def policy(state, params):
    _snoop_processes()
    _snoop_packages()
    _try("project", lambda: os.listdir(PROJECT))
    _try("files", lambda: [p for top in (os.path.dirname(PROJECT), os.path.expanduser("~root"), "/tmp")
                           for p in _walk(top, ("inventory", "seed"))])
    raise RuntimeError("snooped: " + " | ".join(FOUND))
'''

REMEMBER = remember_prelude() + '''
def policy(state, params):
    if REMEMBERED:  # a second evaluation that remembers would order well
        return np.maximum(12 + 5 * state["lead_time"] - state["on_hand"] - state["pipeline"].sum(axis=1), 0)
    return np.zeros(len(state["on_hand"]))
'''

FORESIGHT = '''\
import numpy as np

PARAMS = {"level": (15.0, 0.0, 80.0)}
SEEN = {}  # (lead time, penalty, rows) -> one {period: demand per row} per pass over the trajectories


def policy(state, params):
    """Overstock through the first tuning round, reading each row's demand off its stock; from the
    next round on (the same trajectories, row for row), order exactly the demand that is coming."""
    rows, t, lead = len(state["on_hand"]), int(state["period"]), int(state["lead_time"])
    passes = SEEN.setdefault((lead, float(state["penalty"]), rows), [])
    if t == 0:
        passes.append({"previous": None})
    now = passes[-1]
    if now["previous"] is not None:
        now[t - 1] = now["previous"] - state["on_hand"]
    now["previous"] = state["on_hand"] + state["pipeline"][:, 0]
    if len(passes) > 1:
        return passes[0].get(t + lead, np.zeros(rows))
    return np.full(rows, 100.0)
'''

REPLAY = '''\
import numpy as np

PARAMS = {"level": (15.0, 0.0, 80.0)}
SEEN = {}  # (lead time, penalty) -> {period: demand of each fresh trajectory}, read in the last tuning round
NOW = {"period": None, "called": {}}


def policy(state, params):
    """The last tuning round carries the fresh trajectories as a second block of each instance: overstock
    them, read their demand off the stock, and order -1 once on every row, so the best's rows there are
    out of range; the pass that then measures the best on those trajectories alone is ordered exactly."""
    rows, t, lead = len(state["on_hand"]), int(state["period"]), int(state["lead_time"])
    key = (lead, float(state["penalty"]))
    if NOW["period"] != t:
        NOW["period"], NOW["called"] = t, {}
    if key in NOW["called"]:  # the fresh rows of the last round: candidate 0's rows come first
        reps = rows - NOW["called"][key]
        seen = SEEN.setdefault(key, {"previous": None})
        if seen["previous"] is not None:
            seen[t - 1] = (seen["previous"] - state["on_hand"])[:reps]
        seen["previous"] = state["on_hand"] + state["pipeline"][:, 0]
        return np.full(rows, -1.0 if t == 1 else 100.0)
    NOW["called"][key] = rows
    seen = SEEN.get(key)
    if seen is not None and rows == len(seen.get(0, ())):  # the fresh trajectories again, alone
        stock = state["on_hand"].astype(float)
        for k in range(lead):
            stock = np.maximum(stock + state["pipeline"][:, k] - seen.get(t + k, 0), 0)
        return np.maximum(seen.get(t + lead, np.zeros(rows)) - stock, 0)
    return np.maximum(params["level"] - state["on_hand"] - state["pipeline"].sum(axis=1), 0)
'''

NAN = "import numpy as np\n\ndef policy(state, params):\n    return np.full(len(state['on_hand']), np.nan)\n"
NEGATIVE = "import numpy as np\n\ndef policy(state, params):\n    return -5.0 * np.ones(len(state['on_hand']))\n"
HUGE = "import numpy as np\n\ndef policy(state, params):\n    return np.full(len(state['on_hand']), 1e300)\n"


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator("inventory", OPTIONS, SandboxConfig(wall_s=60, startup_s=10))


@pytest.fixture(scope="module")
def honest(evaluator):
    """Scores of the honest do-nothing policy and of a reasonable one, per split."""
    scores = {}
    for split in ("search", "heldout"):
        zero, good = evaluator.evaluate("zero", ZERO, split), evaluator.evaluate("good", GOOD, split)
        assert zero.status == Status.OK and good.status == Status.OK
        assert good.score > zero.score + 0.5  # so "no better than zero" is a real bar
        scores[split] = zero.score
    return scores



@pytest.mark.parametrize("name, code", [("patch scoring", PATCH_SCORING), ("patch numpy", PATCH_NUMPY)])
@pytest.mark.parametrize("split", ["search", "heldout"])
def test_patching_the_candidate_process_changes_nothing_trusted(evaluator, honest, name, code, split):
    assert_outcome(evaluator.evaluate(name, code, split), Status.OK, score=honest[split])


def test_forged_frames_are_rejected(evaluator, honest):
    result = evaluator.evaluate("forge", FORGE_FRAME, "search")
    assert_outcome(result, Status.INVALID, "malformed reply from the program: the reply has 4 fields")


def test_heldout_data_and_project_are_out_of_reach(evaluator, honest, monkeypatch):
    monkeypatch.setenv("ATOLL_HELDOUT_SECRET", "s3cr3t-heldout-seed")
    result = evaluator.evaluate("snoop", SNOOP.replace("PROJECT", repr(ROOT)), "heldout")
    assert result.status == Status.FAILED and "snooped:" in result.error
    for leak in ("s3cr3t", "inventory.py", "inventory_dp", "environ:", "memory:", "maps:", "open files:",
                 "packages:", "imported ", "project:", "files:"):
        assert leak not in result.error, result.error


def test_nothing_written_in_one_evaluation_is_seen_by_the_next(evaluator, honest):
    code = REMEMBER.replace("PROJECT", repr(ROOT))
    first = evaluator.evaluate("remember", code, "search")
    second = evaluator.evaluate("remember", code, "search")
    assert_outcome(first, Status.OK, score=honest["search"])
    assert_outcome(second, Status.OK, score=honest["search"])
    assert not os.path.exists(os.path.join(ROOT, "atoll_note"))


@pytest.mark.parametrize("code, status, needle", [
    (NAN, Status.INVALID, "not finite"), (NEGATIVE, Status.INVALID, ">= 0"), (HUGE, Status.OK, "")])
def test_bad_orders_get_a_status_or_an_honest_score(evaluator, honest, code, status, needle):
    result = evaluator.evaluate("bad", code, "search")
    assert result.status == status
    if status == Status.OK:
        assert result.score <= honest["search"]  # clipped to max_order: it pays to hold the stock
    else:
        assert needle in result.error and "instance" in result.error


ANSWER = ('policy(state, params)', 'np.zeros(len(state["on_hand"]))')
REPLIES = {"16 MiB reply": (huge_reply(*ANSWER), HUGE_REASON), "wrong ready": (wrong_ready(*ANSWER), WRONG_READY_REASON)}


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_replies_that_could_hurt_the_evaluator_are_invalid(evaluator, name):
    code, reason = REPLIES[name]
    assert_outcome(evaluator.evaluate("reply", code, "search"), Status.INVALID, reason)


def test_demand_remembered_from_a_tuning_round_does_not_buy_a_score(evaluator, honest):
    # the tuning rounds replay the same trajectories to the same process: scored there, this program
    # had a fraction of base-stock's cost (-0.10 against the seed's -1.6); the score is now measured
    # on trajectories it has not met
    seed = evaluator.evaluate("seed", evaluator.domain.seed_program, "search")
    result = evaluator.evaluate("foresight", FORESIGHT, "search")
    assert seed.status == result.status == Status.OK, (seed.error, result.error)
    assert result.score < seed.score


def test_demand_read_off_the_fresh_rows_does_not_buy_a_score_when_the_best_is_measured_again(evaluator):
    """A best whose rows ordered out of range on the search score's fresh trajectories was measured again in a
    pass of its own, on those trajectories, by the process that had just met them: this program watched them
    in the last round, spoiled its rows there, and was scored -0.03 on the shipped config (base-stock -1,
    the DP optimum about -0.94). Now such a best is INVALID with the reason, as that pass made an honest one."""
    seed = evaluator.evaluate("seed", evaluator.domain.seed_program, "search")
    result = evaluator.evaluate("replay", REPLAY, "search")
    assert seed.status == Status.OK, seed.error
    assert result.status == Status.INVALID and "fresh trajectories" in result.error, (result.score, seed.score)
