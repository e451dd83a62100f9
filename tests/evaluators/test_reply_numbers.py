"""Every domain's reply check starts the same way (`evaluators._base.numeric_reply`): whatever is not
an array of numbers is INVALID with a reason that names the place, and a scalar reply is spread
over the rows where the domain allows it. Each domain's checker is exercised here on the trusted
side alone; the integrity tests send the same replies through a real sandbox."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from evaluators._base import CandidateError
from evaluators.domains.control.simulation import EnvSpec, check_actions
from evaluators.domains.inventory.simulation import check_orders
from evaluators.domains.milp.scip import check_scores
from evaluators.domains.trading.simulate import check_positions
from store.records import Status

DISCRETE = EnvSpec("CartPole-v1", 4, True, 2, None, None, 500)
CHECKERS = {
    "inventory": (lambda reply: check_orders(reply, 3, (SimpleNamespace(key="s1"), 7), 50), "instance s1, period 7",
                  "orders"),
    "control": (lambda reply: check_actions(reply, 3, DISCRETE, 7), "step 7", "actions"),
    "trading": (lambda reply: check_positions(reply, 3, "bar 7"), "bar 7", "positions"),
    "milp": (lambda reply: check_scores(reply, 3, "node 7"), "node 7", "scores"),
}


@pytest.mark.parametrize("domain", sorted(CHECKERS))
@pytest.mark.parametrize("reply, reason", [
    ([[1, 2], [3]], "the policy's reply is not an array of numbers"),  # ragged
    ({"a": 1}, "the policy's reply is not an array of numbers"),
    (np.array(["1", "2", "3"]), "must be numbers, got dtype <U1"),
    (np.array([1 + 2j, 0, 0]), "must be numbers, got dtype complex128"),
    (np.array([1, None, 0], dtype=object), "must be numbers, got dtype object"),
])
def test_a_reply_that_is_not_numbers_is_invalid_and_says_where(domain, reply, reason):
    check, where, noun = CHECKERS[domain]
    with pytest.raises(CandidateError) as caught:
        check(reply)
    assert caught.value.status == Status.INVALID
    assert caught.value.reason.startswith(f"{where}: ")
    assert reason in caught.value.reason
    if "dtype" in reason:
        assert caught.value.reason == f"{where}: {noun} {reason}"
    assert caught.value.__context__ is None  # no parsing traceback rides along with the reason


@pytest.mark.parametrize("domain, expected", [("inventory", [1, 1, 1]), ("control", [1, 1, 1]),
                                              ("trading", [0.5, 0.5, 0.5])])
@pytest.mark.parametrize("shape", [(), (1,)])
def test_a_scalar_reply_is_spread_over_the_rows(domain, expected, shape):
    check = CHECKERS[domain][0]
    value = 0.5 if domain == "trading" else 1
    assert check(np.full(shape, value)).tolist() == expected


def test_scores_for_a_branching_decision_are_one_per_candidate():
    check, where, _ = CHECKERS["milp"]
    with pytest.raises(CandidateError, match=r"^INVALID: node 7: scores have shape \(\); expected \(3,\)"):
        check(np.float64(1.0))
    assert check([1, 2, 3]).tolist() == [1.0, 2.0, 3.0]
