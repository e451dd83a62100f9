"""The embedded mutator: seeded, weighted, and its children still run."""
import contextlib

import numpy as np
import pytest
from pydantic import ValidationError

from evaluators.params import read_params
from store.records import MutationRequest
from workers._base import MutationFailed, Mutator
from workers.ast_ops import OPERATORS, Motif
from workers.config import EmbeddedMutatorConfig
from workers.embedded import EmbeddedMutator

PROGRAM = '''import numpy as np

PARAMS = {"S": (12.0, 0.0, 60.0)}

def policy(state, params):
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    return np.maximum(params["S"] - position, 0.0)
'''
DONOR = PROGRAM.replace('params["S"] - position', '0.5 * params["S"] - position')
CAP = Motif("cap", 'np.minimum({expr}, params["{p0}"])', (("cap", 20.0, 0.0, 80.0),))


def _mutator(**config):
    return EmbeddedMutator(EmbeddedMutatorConfig(**config), "policy", [CAP])


def _request(seed=0, weights=(), code=PROGRAM):
    return MutationRequest("run", 0, 1, "p0", code, inspirations=(("d", DONOR),),
                           operator_weights=tuple(weights), seed=seed)


def _only(name):
    return [(op, 1.0 if op == name else 0.0) for op in OPERATORS]


def test_is_a_mutator_and_names_the_operator():
    from workers.normal_form import normal_form

    proposal = _mutator().propose(_request())
    assert isinstance(_mutator(), Mutator)
    assert proposal.operator.removeprefix("embedded:") in OPERATORS
    assert proposal.code != PROGRAM
    assert proposal.form == normal_form(proposal.code) != normal_form(PROGRAM)  # the driver's dedup key, made here


def test_same_request_same_child_different_seeds_vary():
    mutator = _mutator()
    assert mutator.propose(_request(7)) == mutator.propose(_request(7))
    children = {mutator.propose(_request(seed)).code for seed in range(8)}
    assert len(children) >= 5


def test_weights_bias_and_zero_disables():
    mutator = _mutator()
    ops = [mutator.propose(_request(s, _only("insert_motif"))).operator for s in range(10)]
    assert set(ops) == {"embedded:insert_motif"}
    biased = [(name, 50.0 if name == "swap_operator" else 1.0) for name in OPERATORS]
    counts = [mutator.propose(_request(s, biased)).operator for s in range(40)]
    assert counts.count("embedded:swap_operator") > 20
    no_swap = [("embedded:swap_operator", 0.0)]
    assert all(mutator.propose(_request(s, no_swap)).operator != "embedded:swap_operator"
               for s in range(40))


def test_crossover_uses_the_inspiration():
    child = _mutator().propose(_request(0, _only("crossover"))).code
    assert "0.5 * params" in child


def test_crossover_never_drops_an_assignment_that_is_read_later():
    from evaluators.domains.milp.programs import SEED_PROGRAM
    from evaluators.params import read_params

    donor = SEED_PROGRAM.replace('gain_down = np.maximum(state["ps_down"] * f, params["eps"])',
                                 'gain_up = np.maximum(state["ps_down"] * f, 0.5 * params["eps"])')
    children = []
    for seed in range(40):
        request = MutationRequest("run", 0, 1, "p0", SEED_PROGRAM, inspirations=(("d", donor),),
                                  operator_weights=tuple(_only("crossover")), seed=seed)
        try:
            children.append(_mutator().propose(request).code)
        except MutationFailed:
            pass
    assert children
    for child in children:
        namespace = {}
        exec(child, namespace)
        f = np.array([0.3, 0.6])
        state = {"frac": f, "ps_down": np.ones(2), "ps_up": np.ones(2)}
        values = {k: spec.default for k, spec in read_params(child).items()}
        assert np.all(np.isfinite(namespace["policy"](state, values)))


def test_fails_when_nothing_applies():
    with pytest.raises(MutationFailed):
        _mutator().propose(_request(0, _only("remove_branch")))
    with pytest.raises(MutationFailed):
        _mutator().propose(_request(0, [(op, 0.0) for op in OPERATORS]))
    with pytest.raises(MutationFailed):
        _mutator().propose(_request(0, code="def other(:\n"))


def test_a_long_flat_sum_gets_a_child_or_a_mutation_failure_never_an_error():
    # 300 terms parse as a tree 300 levels deep: deep-copying a part of it passes Python's recursion limit
    code = "def policy(state, params):\n    return " + " + ".join(f'state["x"] * {i}.5' for i in range(300)) + "\n"
    only_copying = [(op, 1.0 if op in ("wrap_clip", "add_branch") else 0.0) for op in OPERATORS]
    for seed in range(6):
        with contextlib.suppress(MutationFailed):  # no child: fine; any other exception fails the test
            assert _mutator().propose(_request(seed, only_copying, code=code)).code != code


def test_disabled_operator_in_config_is_never_used():
    mutator = _mutator(operators=["perturb_const"])
    assert {mutator.propose(_request(s)).operator for s in range(10)} == {"embedded:perturb_const"}


def test_config_is_strict():
    with pytest.raises(ValidationError, match="unknown operators"):
        EmbeddedMutatorConfig(operators=["teleport"])
    with pytest.raises(ValidationError):
        EmbeddedMutatorConfig(max_attemps=3)
    with pytest.raises(ValidationError):
        EmbeddedMutatorConfig(const_scale=-1.0)


def test_bad_motif_is_rejected_at_construction():
    with pytest.raises(ValueError, match="broken"):
        EmbeddedMutator(EmbeddedMutatorConfig(), "policy", [Motif("broken", "np.minimum({expr}, {p3})")])


def _run_trusted(code, batch=16):
    """Execute a child IN THE TEST ONLY (tests are trusted code; the mutator never runs it)."""
    namespace = {}
    exec(compile(code, "<child>", "exec"), namespace)  # noqa: S102
    rng = np.random.default_rng(0)
    state = {"on_hand": rng.uniform(0, 20, batch), "pipeline": rng.uniform(0, 5, (batch, 3))}
    specs = namespace.get("PARAMS", {})
    params = {name: np.full(batch, float(spec[0])) for name, spec in specs.items()}
    return np.asarray(namespace["policy"](state, params))


def test_crossover_never_brings_a_loop_that_reads_what_the_parent_no_longer_assigns():
    """Inventory's myopic policy carries `stock` through a loop (stock = np.maximum(stock + ...));
    a child whose `stock = ...` before the loop was swapped for another assignment raised
    UnboundLocalError in every evaluation."""
    from evaluators.registry import get_domain

    programs = get_domain("inventory").baselines()
    myopic = programs.pop("myopic")
    mutator = _mutator(operators=["crossover"])
    state = {"on_hand": np.full(8, 5.0), "pipeline": np.ones((8, 2)), "mean_demand": np.full(8, 4.0),
             "lead_time": 2, "period": 3}
    for parent, donor in [(myopic, other) for other in programs.values()] + [(o, myopic) for o in programs.values()]:
        for seed in range(8):
            request = MutationRequest("run", 0, 1, "p0", parent, inspirations=(("d", donor),), seed=seed)
            with contextlib.suppress(MutationFailed):
                child = mutator.propose(request).code
                namespace = {}
                exec(compile(child, "<child>", "exec"), namespace)  # noqa: S102  trusted test code
                namespace["policy"](state, {k: spec.default for k, spec in read_params(child).items()})


def test_children_still_return_actions_of_the_right_shape():
    mutator, good = _mutator(), 0
    for seed in range(50):
        child = mutator.propose(_request(seed)).code
        try:
            out = _run_trusted(child)
            good += out.shape == (16,) and out.dtype.kind in "fiu"
        except Exception:  # noqa: BLE001  a broken child is what this counts
            pass
    assert good >= 45


GATED = '''import numpy as np

PARAMS = {"S": (12.0, 0.0, 60.0), "gate": (3.0, -10.0, 10.0), "alt": (1.5, 0.0, 3.0)}


def policy(state, params):
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    base = np.maximum(params["S"] - position, 0.0)
    return np.where(state["on_hand"] < params["gate"], base, base * params["alt"])
'''


def test_a_child_declares_no_parameter_its_policy_no_longer_reads():
    """Removing the branch leaves its gate's parameters unread: the child drops them, so tuning
    spends no trial on them. A program that may read its params another way keeps them all."""
    from evaluators.params import read_params
    from workers.embedded import without_unread_params

    removed = GATED.replace('np.where(state["on_hand"] < params["gate"], base, base * params["alt"])', "base")
    assert list(read_params(without_unread_params(removed, "policy"))) == ["S"]
    assert without_unread_params(GATED, "policy") == GATED  # every one read: the text as it was
    for other in ('    helper = params\n', '    extra = params.get("alt", 1.0)\n', '    extra = PARAMS["alt"]\n',
                  '    params["alt"] = 2.0\n'):
        code = removed.replace("    base = ", other + "    base = ")
        assert without_unread_params(code, "policy") == code, other
    mutator = _mutator(operators=["remove_branch"])
    for seed in range(5):  # either arm of the branch may stay; the gate's parameter goes
        child = mutator.propose(_request(seed, code=GATED)).code
        declared = list(read_params(child))
        assert "gate" not in declared and all(f"params['{key}']" in child or f'params["{key}"]' in child
                                              for key in declared), child


@pytest.mark.parametrize(("name", "options", "bounds"), [("inventory", {}, (0.0, None)),
                                                         ("trading", {"market": "synthetic"}, (-1.0, 1.0))])
def test_a_domains_mutator_keeps_a_returned_constant_inside_what_the_domain_accepts(name, options, bounds):
    """Inventory refuses orders below zero and trading positions outside [-1, 1]: add_branch's
    constant level, the value a branch returns, gets its range inside those bounds."""
    from evaluators.registry import get_domain

    domain = get_domain(name, **options)
    mutator = EmbeddedMutator.for_domain(EmbeddedMutatorConfig(), domain)
    assert mutator.bounds == bounds
    lo, hi = bounds[0] if bounds[0] is not None else -np.inf, bounds[1] if bounds[1] is not None else np.inf
    levels = []
    for seed in range(30):
        child = mutator.propose(_request(seed, _only("add_branch"), code=domain.seed_program)).code
        levels += [spec for key, spec in read_params(child).items()
                   if key.startswith("alt") and (spec.low, spec.high) != (0.0, 3.0)]  # not a scale factor
    assert levels and all(lo <= spec.low <= spec.default <= spec.high <= hi for spec in levels), levels


@pytest.mark.parametrize("name", ["milp", "inventory"])
def test_a_nudged_default_is_a_new_program_only_where_the_domain_does_not_tune_it(name):
    """MILP runs the written PARAMS defaults (tune_trials = 0): each nudge of one is a program the
    driver must evaluate. Inventory tunes them: a child that changes only a default is its parent
    to the driver's duplicate check, so the mutator makes another child instead."""
    from controller.dedup import Dedup
    from evaluators.registry import get_domain
    from workers.normal_form import normal_form

    domain = get_domain(name)
    mutator = EmbeddedMutator.for_domain(EmbeddedMutatorConfig(operators=["perturb_const"]), domain)
    children = [mutator.propose(_request(seed, code=domain.seed_program)) for seed in range(24)]
    defaults_only = [c for c in children if normal_form(c.code) == normal_form(domain.seed_program)]  # tuned alike
    assert len(defaults_only) >= 3 if name == "milp" else not defaults_only
    dedup = Dedup(tuned=domain.tunes_params())  # as the run's driver builds it
    dedup.add(domain.seed_program)
    assert all(dedup.check(c.code, c.form or None) is None for c in children)  # none is dropped as the seed
