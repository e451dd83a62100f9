"""Each embedded operator changes the program and keeps it valid."""
import ast

import numpy as np
import pytest

from evaluators.params import entry_point_ok, read_params
from workers.ast_ops import OPERATORS, Motif, OpContext

PROGRAM = '''import numpy as np

PARAMS = {"S": (12.0, 0.0, 60.0)}

def policy(state, params):
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    return np.maximum(params["S"] - position, 0.0)
'''

BRANCHY = '''import numpy as np

PARAMS = {"S": (12.0, 0.0, 60.0), "t": (5.0, 0.0, 10.0)}

def policy(state, params):
    position = state["on_hand"] * 2.0
    if position.sum() > 3:
        position = position - 1
    return np.where(position < params["t"], params["S"] - position, 0.0)
'''

DONOR = '''import numpy as np

PARAMS = {"S": (12.0, 0.0, 60.0), "beta": (0.5, 0.0, 1.0)}

def policy(state, params):
    position = state["on_hand"]
    return params["beta"] * (params["S"] - position)
'''

CAP = Motif("cap", 'np.minimum({expr}, params["{p0}"])', (("cap", 20.0, 0.0, 80.0),))


def _ctx(seed, **kw):
    return OpContext("policy", np.random.default_rng(seed), inspirations=(DONOR,), motifs=(CAP,), **kw)


def _norm(code):
    return ast.unparse(ast.parse(code))


@pytest.mark.parametrize("name", sorted(OPERATORS))
@pytest.mark.parametrize("parent", [PROGRAM, BRANCHY])
def test_operator_changes_program_and_keeps_entry_point(name, parent):
    children = [OPERATORS[name](parent, _ctx(seed)) for seed in range(10)]
    applied = [c for c in children if c is not None]
    if name == "remove_branch" and parent is PROGRAM:
        assert not applied  # nothing to remove
        return
    assert applied, f"{name} never applied"
    for child in applied:
        assert entry_point_ok(child, "policy")
        read_params(child)
    assert any(_norm(c) != _norm(parent) for c in applied)


def test_perturb_const_touches_literals_or_params_only():
    seen = set()
    for seed in range(30):
        child = OPERATORS["perturb_const"](PROGRAM, _ctx(seed))
        spec = read_params(child)["S"]
        seen.add("params" if (spec.default, spec.low, spec.high) != (12.0, 0.0, 60.0) else "literal")
        assert "axis=1" in child  # keyword values are never perturbed
    assert seen == {"params", "literal"}


def test_swap_operator_never_introduces_division_by_a_variable():
    code = PROGRAM.replace('params["S"] - position', 'params["S"] * position')
    for seed in range(20):
        child = OPERATORS["swap_operator"](code, _ctx(seed))
        assert "/ position" not in child


def test_wrap_clip_and_add_branch_declare_new_params():
    clipped = OPERATORS["wrap_clip"](PROGRAM, _ctx(1))
    assert set(read_params(clipped)) - {"S"} <= {"cap", "floor"}
    assert len(read_params(clipped)) == 2
    branched = OPERATORS["add_branch"](PROGRAM, _ctx(1))
    assert "np.where(" in branched
    assert {"gate", "alt"} <= set(read_params(branched))


def test_remove_branch_drops_if_or_collapses_where():
    results = {OPERATORS["remove_branch"](BRANCHY, _ctx(seed)) for seed in range(20)}
    assert any("if " not in r for r in results)
    assert any("np.where" not in r for r in results)


def test_crossover_takes_code_and_params_from_the_inspiration():
    children = [OPERATORS["crossover"](PROGRAM, _ctx(seed)) for seed in range(10)]
    borrowed = [c for c in children if c and "beta" in c]
    assert borrowed
    assert all(read_params(c)["beta"].default == 0.5 for c in borrowed)
    assert OPERATORS["crossover"](PROGRAM, OpContext("policy", np.random.default_rng(0))) is None


def test_insert_motif_adds_its_params():
    child = OPERATORS["insert_motif"](PROGRAM, _ctx(0))
    assert read_params(child)["cap"].default == 20.0
    assert "np.minimum(np.maximum(" in child
    again = OPERATORS["insert_motif"](child, _ctx(0))
    assert {"cap", "cap_2"} <= set(read_params(again))

