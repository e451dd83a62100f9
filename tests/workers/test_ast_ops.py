"""Each embedded operator changes the program and keeps it valid."""
import ast

import numpy as np
import pytest

from evaluators.domains.trading.programs import SEED_PROGRAM as TRADING_SEED
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


def test_perturb_const_keeps_an_integer_index_or_shape_an_integer():
    # control's baselines read obs[:, 2]; trading's close[:, -22]: a float index raises IndexError
    code = ('import numpy as np\n\ndef policy(state, params):\n    obs = state["obs"]\n'
            '    pad = np.zeros((len(obs), 2))\n    return 1.5 * obs[:, 2] - obs[:, -1] + obs[:, 1 + 1] + pad[:, 0]\n')
    for seed in range(30):
        child = OPERATORS["perturb_const"](code, _ctx(seed))
        assert all(part in child for part in ("obs[:, 2]", "obs[:, -1]", "obs[:, 1 + 1]", "(len(obs), 2)")), child


MATRIX_STATES = [  # trading's seed and baselines read a matrix of close prices (a row of bars per asset)
    '    close = state["close"]\n    return np.sign(close[:, -1] - close[:, -5])\n',
    '    close = state["close"].astype(np.float64)\n    return (close[:, -50:].mean(axis=1) > 1.0).astype(float)\n',
    '    return np.ones(len(state["close"]))\n',
    '    w = np.arange(1.0, state["close"].shape[1] + 1)\n    return np.tanh(state["close"] @ w)\n',
    '    scores = [state["close"][:, i] for i in range(3)]\n    return np.argmax(np.stack(scores, axis=1), axis=1)\n',
]


@pytest.mark.parametrize("body", MATRIX_STATES)
def test_add_branch_gates_on_one_value_per_row_never_on_a_matrix_list_or_comprehension_variable(body):
    code = "import numpy as np\n\ndef policy(state, params):\n" + body
    state = {"close": np.random.default_rng(0).uniform(50, 150, (12, 260))}
    for seed in range(12):
        child = OPERATORS["add_branch"](code, _ctx(seed))
        if child is None:  # nothing per row to gate on
            continue
        namespace = {}
        exec(compile(child, "<child>", "exec"), namespace)  # noqa: S102  trusted test code, the mutator never runs it
        params = {key: spec.default for key, spec in read_params(child).items()}
        assert np.shape(namespace["policy"](state, params)) == (12,), child


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


def test_a_new_parameter_that_is_returned_gets_a_range_inside_the_domains_bounds():
    """add_branch's constant level, and wrap_clip's bound of the whole return or of what the return's
    np.maximum passes through, are values the program returns as they are: with the domain's bounds,
    their ranges stay inside them. Any other new parameter (a gate, a bound of a part) keeps the
    range it has without bounds."""
    def returned(child):  # the parameters of the calls that the return passes through as they are
        ret = ast.parse(child).body[-1].body[-1].value
        through = [ret, *(ret.args[1:] if ret.func.attr == "where" else ret.args)]
        return {arg.slice.value for call in through if isinstance(call, ast.Call) for arg in call.args
                if isinstance(arg, ast.Subscript) and arg.value.id == "params"}

    bounded_kinds, inner = set(), 0
    for seed in range(40):
        for op in ("add_branch", "wrap_clip"):
            free, bounded = OPERATORS[op](PROGRAM, _ctx(seed)), OPERATORS[op](PROGRAM, _ctx(seed, bounds=(0.0, 50.0)))
            free_specs, specs = read_params(free), read_params(bounded)
            assert specs.keys() == free_specs.keys()
            for name in specs.keys() - {"S"}:
                spec = specs[name]
                assert spec.low <= spec.default <= spec.high
                if name in returned(bounded):
                    assert 0.0 <= spec.low and spec.high <= 50.0, (seed, bounded)
                    assert free_specs[name].low < 0.0  # the same child without bounds spans zero
                    bounded_kinds.add(name)
                    inner += 'np.maximum(np.m' in bounded  # a bound of the part np.maximum passes through
                else:
                    assert spec == free_specs[name]
    assert bounded_kinds == {"alt", "cap", "floor"}  # each kind came up returned
    assert inner >= 3


def test_perturb_const_keeps_a_returned_number_inside_the_domains_bounds():
    """The 0.0 of np.maximum(..., 0.0) and the range of a parameter passed through np.where are
    returned as they are: nudged with bounds (0, None) they stay at or above zero; a number
    inside an expression moves on both sides as before."""
    branchy = BRANCHY.replace('"S": (12.0, 0.0, 60.0)', '"S": (12.0, 0.0, 60.0), "alt": (2.0, 0.0, 9.0)').replace(
        'params["S"] - position, 0.0)', 'params["S"] - position, params["alt"])')

    def clamp(child):
        ret = ast.parse(child).body[-1].body[-1].value
        try:
            return ast.literal_eval(ret.args[1])  # -0.4 is parsed as -(0.4)
        except ValueError:
            return None

    free = [OPERATORS["perturb_const"](PROGRAM, _ctx(seed)) for seed in range(80)]
    bounded = [OPERATORS["perturb_const"](PROGRAM, _ctx(seed, bounds=(0.0, None))) for seed in range(80)]
    assert any(clamp(c) is not None and clamp(c) < 0 for c in free)
    assert all(clamp(c) is None or clamp(c) >= 0 for c in bounded)
    assert any(clamp(c) is not None and clamp(c) > 0 for c in bounded)  # a minimum order is still tried
    ranges = [read_params(OPERATORS["perturb_const"](branchy, _ctx(seed, bounds=(0.0, None))))["alt"]
              for seed in range(200)]
    free_ranges = [read_params(OPERATORS["perturb_const"](branchy, _ctx(seed)))["alt"] for seed in range(200)]
    assert min(spec.low for spec in free_ranges) < 0.0 <= min(spec.low for spec in ranges)
    assert {spec.low for spec in ranges} != {0.0}  # the range still moves
    t_ranges = {read_params(OPERATORS["perturb_const"](branchy, _ctx(seed, bounds=(0.0, None))))["t"].low
                for seed in range(200)}
    assert min(t_ranges) < 0.0  # "t" is compared, not returned: unbounded


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



PIPELINE_WEIGHTED = '''import numpy as np

PARAMS = {"level": (17.0, 0.0, 80.0), "pipe_weight": (1.0, 0.5, 1.5)}

def policy(state, params):
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    decay = 1.0 - np.reshape(params["pipe_weight"], (-1, 1)) ** np.arange(state["pipeline"].shape[1], 0, -1)
    return np.maximum(params["level"] - position + (state["pipeline"] * decay).sum(axis=1), 0.0)
'''

CASH = '''import numpy as np

def policy(state, params):
    return np.zeros(len(state["close"]))
'''


def _run(code: str, state: dict) -> np.ndarray:
    """The child's policy on one batch of 5 rows, each row's params a value of its own (as tuning sends)."""
    namespace: dict = {}
    exec(compile(code, "<child>", "exec"), namespace)  # noqa: S102 (a test's own program, edited by the operator)
    params = {name: np.linspace(spec.low, spec.high, 5) for name, spec in read_params(code).items()}
    return np.asarray(namespace["policy"](state, params))


@pytest.mark.parametrize("program, state", [
    (PIPELINE_WEIGHTED, {"on_hand": np.arange(5.0), "pipeline": np.ones((5, 3))}),
    (CASH, {"close": np.ones((5, 60))}),
])
def test_wrap_clip_bounds_no_row_of_values_and_no_count(program, state):
    """A parameter is one value a row: bounding a (rows, lead time) expression with it cannot broadcast,
    and bounding a count (len, a size) makes it a float no array takes; such children failed when run
    (inventory's pipeline motif: 7 of 24 wrap_clip children; trading's cash baseline: every one)."""
    for seed in range(40):
        child = OPERATORS["wrap_clip"](program, _ctx(seed))
        assert child is None or _run(child, state).shape == (5,), child


def test_perturb_const_keeps_an_integer_inside_an_index_argument_an_integer():
    """Trading's seed computes the column it reads (`close.shape[1] - 1 - n`) inside take_along_axis's
    indices: nudging that 1 to 1.23 made every such child fail with 'indices must be an integer array'."""
    state = {"close": np.cumsum(np.ones((5, 60)), axis=1)}
    for seed in range(30):
        child = OPERATORS["perturb_const"](TRADING_SEED, _ctx(seed))
        assert _run(child, state).shape == (5,), child
