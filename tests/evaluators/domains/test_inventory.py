"""The inventory domain: exact figures, common random numbers, tuning, validation, splits."""
import re

import numpy as np
import pytest

from evaluators.domains.inventory import dp as inventory_dp
from evaluators._base import CandidateError, DoesNotHoldUp
from evaluators.check import Checker
from evaluators.sandbox.config import SandboxConfig
from evaluators.evaluator import Evaluator
from evaluators.domains.inventory.domain import BASELINES, Block, InstanceSpec, base_stock_policy
from evaluators.params import read_params
from evaluators.registry import DomainConfig, get_domain
from evaluators.secrets import RunSecrets
from store.records import Status

POISSON_L1 = {"lead_time": 1, "penalty": 4, "demand": "poisson"}
POISSON_L2 = {"lead_time": 2, "penalty": 4, "demand": "poisson"}
TINY = {"search_instances": [POISSON_L1, {"lead_time": 2, "penalty": 19, "demand": "poisson"}],
        "heldout_instances": [{"lead_time": 3, "penalty": 9, "demand": "geometric"}],
        "search_periods": 60, "heldout_periods": 100, "warmup": 20, "search_trajectories": 2,
        "heldout_trajectories": 4, "tune_trials": 4, "tune_batch": 2}
TINY_VALIDATION = 4  # validation_trajectories' default


def in_process(code):
    """Run a trusted test program directly (the domain only ever sees a PolicyFn)."""
    namespace = {}
    exec(code, namespace)
    fn = namespace["policy"]
    return lambda batches: [fn(state, params) for state, params in batches]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("lead, optimum, base_stock, levels", [
    (1, 4.04, 4.161, range(10, 15)), (2, 4.40, 4.637, range(14, 19))])
def test_dp_reproduces_zipkin_poisson_p4(lead, optimum, base_stock, levels):
    assert inventory_dp.solve("poisson", 5.0, lead, 4.0).cost == pytest.approx(optimum, abs=0.006)
    best = min(inventory_dp.base_stock_cost("poisson", 5.0, lead, 4.0, s) for s in levels)
    assert best == pytest.approx(base_stock, abs=0.003)


@pytest.mark.parametrize("spec, level", [(POISSON_L1, 12), (POISSON_L2, 16)])
def test_simulator_agrees_with_the_exact_chain(spec, level):
    domain = get_domain("inventory", warmup=100)
    inst = InstanceSpec(**spec)
    demand = np.random.default_rng(3).poisson(5.0, size=(64, 2100))
    block = Block(inst, demand, {"level": np.full(64, float(level))})
    cost = domain.simulator.run(base_stock_policy, [block], warmup=100)[0].cost
    exact = inventory_dp.base_stock_cost("poisson", 5.0, inst.lead_time, 4.0, level)
    assert abs(cost.mean() - exact) < 4 * cost.std(ddof=1) / np.sqrt(len(cost))


def test_dp_is_cached_on_disk(tmp_path):
    first = inventory_dp.cached_solve("poisson", 5.0, 1, 9.0)
    files = list((tmp_path / "cache" / "inventory_dp").glob("*.json"))
    assert len(files) == 1 and "poisson-mu5-L1-p9" in files[0].name
    assert inventory_dp.cached_solve("poisson", 5.0, 1, 9.0) == first
    with pytest.raises(ValueError, match="lead times"):
        inventory_dp.solve("poisson", 5.0, inventory_dp.MAX_LEAD + 1, 4.0)


def test_same_policy_twice_costs_exactly_the_same():
    domain = get_domain("inventory", **TINY)
    code = BASELINES["capped base-stock"]
    first = domain.evaluate(in_process(code), read_params(code), "search")
    second = domain.evaluate(in_process(code), read_params(code), "search")
    assert first.metrics == second.metrics and first.score == second.score


def test_every_policy_sees_the_same_demand():
    domain = get_domain("inventory", **TINY)
    spec = domain.instances("search")[0]
    assert np.array_equal(domain.tuning_demand(spec), domain.tuning_demand(spec))
    assert np.array_equal(domain.measure_demand(spec, "search"), domain.measure_demand(spec, "search"))
    zero = domain.evaluate(in_process("def policy(state, params):\n    return 0"), {}, "search")
    lost_all = zero.metrics["instances"][spec.key]
    assert lost_all["fill_rate"] == 0.0
    # scored on the split's measurement trajectories, never on the tuning ones its rounds replay
    assert lost_all["cost"] == pytest.approx(spec.penalty * domain.measure_demand(spec, "search")[:, 20:].mean())
    assert domain.measure_demand(spec, "search").shape == domain.tuning_demand(spec).shape
    assert not np.array_equal(domain.measure_demand(spec, "search"), domain.tuning_demand(spec))


def test_tuned_capped_base_stock_beats_optimized_base_stock():
    # fixed data: how close the tuner gets to capped base-stock's optimum varies with the demand drawn
    # (-0.93 to -1.04 over replay seeds 0-7 at this budget)
    domain = get_domain("inventory", search_instances=[{"lead_time": 4, "penalty": 4, "demand": "poisson"}],
                        search_periods=300, tune_trials=96, tune_batch=32, secrets=RunSecrets.fixed(1))
    scores = {name: domain.evaluate(in_process(BASELINES[name]), read_params(BASELINES[name]), "search").score
              for name in ("optimized base-stock", "capped base-stock")}
    assert scores["optimized base-stock"] == pytest.approx(-1.0, abs=0.01)
    assert scores["capped base-stock"] < 0 and scores["capped base-stock"] > scores["optimized base-stock"] + 0.02


def test_the_search_score_measures_the_tuned_values_on_trajectories_the_tuning_never_replayed():
    domain = get_domain("inventory", **dict(TINY, tune_trials=6, tune_batch=4))  # rounds of 4, then 2
    code = BASELINES["capped base-stock"]
    out = domain.evaluate(in_process(code), read_params(code), "search")
    specs = domain.instances("search")
    blocks = [Block(s, domain.measure_demand(s, "search"),
                    {n: np.full(TINY["search_trajectories"], v) for n, v in out.metrics["instances"][s.key]["params"].items()})
              for s in specs]
    again = domain.simulator.run(in_process(code), blocks, TINY["warmup"])
    for spec, stats in zip(specs, again):  # measured within the last round's pass: as a pass of its own would
        assert out.metrics["instances"][spec.key]["trajectory_costs"] == [float(c) for c in stats.cost]


@pytest.mark.parametrize("body, needle", [
    ("return np.full(state['on_hand'].shape, np.nan)", "not finite"),
    ("return -np.ones(state['on_hand'].shape)", ">= 0"),
    ("return np.ones(len(state['on_hand']) + 1)", "expected"),
    ("return np.ones((len(state['on_hand']), 2))", "shape"),
])
def test_bad_orders_are_invalid_with_a_reason(body, needle):
    domain = get_domain("inventory", **TINY)
    code = f"import numpy as np\ndef policy(state, params):\n    {body}"
    with pytest.raises(CandidateError) as caught:
        domain.evaluate(in_process(code), {}, "search")
    assert caught.value.status == Status.INVALID and needle in caught.value.reason
    assert "instance poisson-L1-p4, period 0" in caught.value.reason


SHIFTED = """import numpy as np
PARAMS = {"level": (15.0, 0.0, 80.0), "shift": (-3.0, -20.0, 20.0)}
def policy(state, params):
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    return np.maximum(params["level"] - position, 0) + params["shift"]
"""


def test_a_trial_whose_parameters_order_below_zero_fails_alone_and_the_program_keeps_its_best_trial():
    # the written defaults (shift -3) and much of the tuner's range order below zero: those trials
    # fail, the others are scored, and the program is scored by its best feasible trial
    domain = get_domain("inventory", **dict(TINY, tune_trials=8, tune_batch=4))
    tells = []
    real = domain.tuner._tell
    domain.tuner._tell = lambda study, trials, *rest: tells.append(study) or real(study, trials, *rest)
    out = domain.evaluate(in_process(SHIFTED), read_params(SHIFTED), "search")
    assert np.isfinite(out.score) and set(out.metrics["instances"]) == {s.key for s in domain.instances("search")}
    states = [t.state.name for study in set(tells) for t in study.trials]
    assert states.count("FAIL") >= 1 and states.count("COMPLETE") >= 1  # the defaults trial failed alone
    assert out.metrics["tune_out_of_range"] == states.count("FAIL")  # stored with the evaluation
    assert out.metrics["tune_trials"] == len(states) == 8 * len(domain.instances("search"))
    assert sum(i["tune_out_of_range"] for i in out.metrics["instances"].values()) == states.count("FAIL")
    for key, instance in out.metrics["instances"].items():  # each kept trial's own orders stayed in range
        assert instance["params"]["shift"] >= -instance["params"]["level"] and instance["mean_order"] >= 0


@pytest.mark.parametrize(("options", "heldout"), [({}, 16), ({"heldout_tune_trials": 6}, 6)])
def test_held_out_instances_are_tuned_with_more_trials_than_search_ones(options, heldout):
    """A held-out verdict compares a program's class with base-stock searched over every level:
    its PARAMS get four times the search's trials there (or heldout_tune_trials)."""
    domain = get_domain("inventory", **dict(TINY, **options))
    asked = []
    real = domain.tuner._tell
    domain.tuner._tell = lambda study, trials, *rest: asked.append((study, len(trials))) or real(study, trials, *rest)
    for split in ("search", "heldout"):
        asked.clear()
        out = domain.evaluate(in_process(domain.seed_program), read_params(domain.seed_program), split)
        per_study = {}
        for study, n in asked:
            per_study[id(study)] = per_study.get(id(study), 0) + n
        trials = TINY["tune_trials"] if split == "search" else heldout
        assert set(per_study.values()) == {trials} and len(per_study) == len(domain.instances(split))
        assert out.metrics["tune_trials"] == trials * len(domain.instances(split))
    assert f"{heldout} optuna trials" in " ".join(domain.heldout_table({}, {})[2])  # the report's notes say so


def test_a_program_no_trial_of_which_orders_in_range_is_invalid_with_the_first_reason():
    code = "PARAMS = {'x': (1.0, 0.0, 5.0)}\ndef policy(state, params):\n    return -1.0 - params['x']"
    domain = get_domain("inventory", **TINY)
    with pytest.raises(CandidateError) as caught:
        domain.evaluate(in_process(code), read_params(code), "search")
    assert caught.value.status == Status.INVALID
    assert caught.value.reason.startswith("instance poisson-L1-p4, period 0: orders must be >= 0, got -")
    assert caught.value.reason.endswith("; every one of the 4 tuning trials of its PARAMS ordered out of range")


def test_the_held_out_measurement_still_fails_a_program_whose_tuned_orders_leave_the_range():
    # tuning runs 80 periods, where every order is in range; the held-out measurement runs 120
    code = ("PARAMS = {'level': (15.0, 0.0, 40.0)}\ndef policy(state, params):\n"
            "    return params['level'] * 0.5 if state['period'] < 100 else -1.0")
    domain = get_domain("inventory", **TINY)
    assert np.isfinite(domain.evaluate(in_process(code), read_params(code), "search").score)
    with pytest.raises(CandidateError) as caught:
        domain.evaluate(in_process(code), read_params(code), "heldout")
    assert caught.value.status == Status.INVALID and "period 100: orders must be >= 0" in caught.value.reason


def test_orders_are_rounded_and_clipped():
    domain = get_domain("inventory", **dict(TINY, max_order=7))
    huge = domain.evaluate(in_process("def policy(state, params):\n    return 1e12"), {}, "search")
    assert all(v["mean_order"] == 7.0 for v in huge.metrics["instances"].values())
    half = domain.evaluate(in_process("def policy(state, params):\n    return 4.6"), {}, "search")
    assert all(v["mean_order"] == 5.0 for v in half.metrics["instances"].values())


def test_heldout_uses_other_instances_and_fresh_seeds(monkeypatch):
    domain = get_domain("inventory")
    search, heldout = domain.instances("search"), domain.instances("heldout")
    assert not {s.key for s in search} & {s.key for s in heldout}
    assert {s.lead_time for s in heldout} - {s.lead_time for s in search}
    assert {s.demand for s in heldout} - {s.demand for s in search}
    tiny = get_domain("inventory", **TINY)
    spec = tiny.instances("heldout")[0]
    fresh, tuning = tiny.heldout_demand(spec), tiny.tuning_demand(spec, "heldout")
    assert not np.array_equal(fresh[:, :tuning.shape[1]][:len(tuning)], tuning)
    calls = []
    real = type(tiny).heldout_demand
    monkeypatch.setattr(type(tiny), "heldout_demand", lambda self, s: calls.append(s.key) or real(self, s))
    code = BASELINES["optimized base-stock"]
    out = tiny.evaluate(in_process(code), read_params(code), "search")
    assert calls == [] and set(out.metrics["instances"]) == {s.key for s in tiny.instances("search")}
    out = tiny.evaluate(in_process(code), read_params(code), "heldout")
    assert spec.key in calls and set(out.metrics["instances"]) == {spec.key}


def test_demand_streams_derive_from_the_secret_of_their_split():
    secrets = RunSecrets.fixed(11)
    domain, twin = get_domain("inventory", **TINY, secrets=secrets), get_domain("inventory", **TINY, secrets=secrets)
    spec = domain.instances("search")[0]
    streams = {split: domain.tuning_demand(spec, split) for split in ("search", "validation", "heldout")}
    assert all(np.array_equal(twin.tuning_demand(spec, split), d) for split, d in streams.items())  # one run: CRN
    assert streams["validation"].shape[0] == TINY_VALIDATION and streams["search"].shape[0] == 2
    rows = min(len(d) for d in streams.values())
    assert not np.array_equal(streams["search"][:rows], streams["validation"][:rows])
    assert not np.array_equal(streams["search"][:rows], streams["heldout"][:rows])
    other = get_domain("inventory", **TINY)  # drawn secrets: another run's demand
    assert not np.array_equal(other.tuning_demand(spec), streams["search"])
    # a held-out secret of its own: changing it changes held-out data only
    moved = get_domain("inventory", **TINY, secrets=RunSecrets(secrets.search, secrets.validation, secrets.heldout + 1))
    assert np.array_equal(moved.tuning_demand(spec), streams["search"])
    assert not np.array_equal(moved.heldout_demand(spec), domain.heldout_demand(spec))
    with pytest.raises(ValueError, match="search_seed"):
        get_domain("inventory", search_seed=0)  # the old public seed options are gone


def test_validation_split_scores_like_search_on_its_own_demand():
    domain = get_domain("inventory", **dict(TINY, tune_trials=32, tune_batch=16), secrets=RunSecrets.fixed(5))
    code = BASELINES["optimized base-stock"]
    search = domain.evaluate(in_process(code), read_params(code), "search")
    validation = domain.evaluate(in_process(code), read_params(code), "validation")
    assert set(validation.metrics["instances"]) == set(search.metrics["instances"])
    for out in (search, validation):  # the same scale: tuned base-stock against the exhaustive one, about -1
        assert out.score == pytest.approx(-1.0, abs=0.02)
    assert len(validation.metrics["instances"]["poisson-L1-p4"]["trajectory_costs"]) == TINY_VALIDATION
    assert validation.metrics != search.metrics
    with pytest.raises(ValueError, match="held-out instances"):
        get_domain("inventory", validation_instances=TINY["heldout_instances"], **{
            k: v for k, v in TINY.items() if k != "validation_instances"})


def test_seed_program_through_the_real_evaluator_and_sandbox():
    evaluator = Evaluator("inventory", TINY, SandboxConfig(wall_s=60), secrets=RunSecrets.fixed(5))
    domain = evaluator.domain
    result = evaluator.evaluate("seed", domain.seed_program, "search")
    assert result.status == Status.OK, result.error
    direct = domain.evaluate(in_process(domain.seed_program), read_params(domain.seed_program), "search")
    assert result.score == direct.score and result.metrics == direct.metrics
    assert -2.0 < result.score <= -0.95
    assert set(result.tuned_params) == {"level"} and len(result.descriptors) == 2
    assert len(result.instance_scores) == 2
    inst = result.metrics["instances"]["poisson-L1-p4"]
    assert len(inst["trajectory_costs"]) == 2 and 0 < inst["fill_rate"] <= 1
    held = evaluator.evaluate("seed", domain.seed_program, "heldout")
    assert held.status == Status.OK and len(held.metrics["instances"]["geometric-L3-p9"]["trajectory_costs"]) == 4


def test_every_motif_applied_to_the_seed_gives_a_runnable_policy():
    from workers.ast_ops import Motif, OpContext, insert_motif

    domain = get_domain("inventory", **TINY)
    for name, template, params in domain.motifs():
        ctx = OpContext("policy", np.random.default_rng(0), motifs=(Motif(name, template, params),))
        child = insert_motif(domain.seed_program, ctx)
        out = domain.evaluate(in_process(child), read_params(child), "search")
        assert np.isfinite(out.score) and out.score < 0, name
        assert set(out.tuned_params) == set(read_params(child)), name


def test_a_parameter_with_an_empty_range_is_simply_held():
    domain = get_domain("inventory", **TINY)
    code = 'import numpy as np\nPARAMS = {"level": (14.0, 14.0, 14.0)}\n' + \
        'def policy(state, params):\n    return np.maximum(params["level"] - state["on_hand"] - state["pipeline"].sum(axis=1), 0)\n'
    out = domain.evaluate(in_process(code), read_params(code), "search")
    assert out.tuned_params == {"level": 14.0}


def test_an_instance_listed_twice_is_refused_not_counted_twice():
    """A repeated instance (or validation, or held-out one) weighed twice in the score, as nobody asked."""
    twice = [{"lead_time": 2, "penalty": 9, "demand": "poisson"}, {"lead_time": 4, "penalty": 9, "demand": "poisson"},
             {"lead_time": 2, "penalty": 9.0, "demand": "poisson"}]
    for field in ("search_instances", "validation_instances", "heldout_instances"):
        with pytest.raises(ValueError, match=rf"{field}\n.*'poisson-L2-p9' is listed twice"):
            get_domain("inventory", **{field: twice})


# The seed's base-stock while the stock is below 90 (it never reaches it from an empty system: the
# level is 80 at most), else one unit over the mean demand every period: from a high stock it never
# comes back.
GATED = """import numpy as np
PARAMS = {"level": (15.0, 0.0, 80.0)}
def policy(state, params):
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    steady = np.full(position.shape, state["mean_demand"] + 1)
    return np.where(state["on_hand"] < 90, np.maximum(params["level"] - position, 0), steady)
"""
# The seed's base-stock for the search's horizon (warm-up 20 + 60 periods), then twice the mean demand
# (from the disturbed start too: its on-hand stock would fall to the level, then climb).
LATE = """import numpy as np
PARAMS = {"level": (15.0, 0.0, 80.0)}
def policy(state, params):
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    if state["period"] >= 90:
        return np.full(position.shape, 2 * state["mean_demand"])
    return np.maximum(params["level"] - position, 0)
"""


# GATED: a warm-up whose demand's half reaches the gate (the disturbance is half the warm-up's demand, at most
# max_order); LATE: the tests' warm-up, and a validation horizon past its turn
@pytest.mark.parametrize("code, options", [(GATED, {"warmup": 400}), (LATE, {"validation_periods": 100})],
                         ids=["runs-away-from-a-high-stock", "runs-away-after-the-horizon"])
def test_a_policy_that_runs_away_past_the_search_horizon_is_invalid_on_the_validation_split(code, options):
    """Scored like base-stock on the search split, whose trajectories are short and start empty; the
    validation split measures from a start with max_order on hand (and, with validation_periods, over a
    longer horizon), and says why it fails there (the report then does not crown it, `controller.crowning`)."""
    evaluator = Evaluator("inventory", dict(TINY, **options), SandboxConfig(wall_s=60), secrets=RunSecrets.fixed(5))
    seed = evaluator.domain.seed_program
    search = evaluator.evaluate("runaway", code, "search")
    assert search.status == Status.OK and search.score == evaluator.evaluate("seed", seed, "search").score
    validation = evaluator.evaluate("runaway", code, "validation")
    assert validation.status == Status.INVALID, validation
    periods = options.get("validation_periods", TINY["search_periods"])
    start = 100 if code == GATED else r"\d\d"  # the warm-up's 20 periods of demand 5: about 50
    assert re.search(rf"of {periods} periods, starting with {start} units on hand, the tuned policy cost", validation.error)
    assert "runs away" in validation.error
    assert evaluator.evaluate("seed", seed, "validation").status == Status.OK


def test_atoll_check_passes_the_constant_order_baseline_that_does_not_hold_up_on_validation_saying_so():
    """Constant order ignores its stock, so it works off the validation's disturbed start only as fast as its
    rate falls short of the demand: the runaway check refuses it there (`atoll check configs/inventory.toml`
    failed on poisson-L1-p19, 6.5 times base-stock's, and exited 1 for the domain's own baseline). The check
    now passes it and says why; any other failure of a baseline still fails."""
    options = dict(TINY, search_instances=[{"lead_time": 1, "penalty": 19, "demand": "poisson"}])
    checker = Checker(DomainConfig(name="inventory", options=options), SandboxConfig(wall_s=60))
    checks = {check.name: check for check in checker.baselines_score()}
    constant = checker.baselines["constant order"]
    assert constant["validation"].status == Status.INVALID and DoesNotHoldUp.marks(constant["validation"].error)
    assert "runs away" in constant["validation"].error
    check = checks["baseline 'constant order' scores OK on every split"]
    assert check.passed and "validation: does not hold up, so it would not be crowned" in check.detail, check
    assert all(check.passed for check in checks.values()), checks
