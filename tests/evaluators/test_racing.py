"""Racing (evaluators/racing.py): real SCIP on tiny set cover instances, and a deterministic simple domain."""
import numpy as np
import pydantic
import pytest

from evaluators.domains.milp.programs import SEED_PROGRAM
from evaluators.evaluator import Evaluator
from evaluators.racing import Race, RaceSpec, RaceStopped, RacingConfig
from evaluators.registry import DomainConfig
from evaluators.sandbox.config import SandboxConfig
from evaluators.secrets import RunSecrets
from store.records import Status

ON = RacingConfig(enabled=True, alpha=0.05, min_instances=4)
# Set cover, replay seed 2024, search instances 4-9: each branches (3 to 61 policy calls with the seed), so a
# program that sleeps 0.5 s at every call takes 3 to 7 times SCIP default's time on every one of them (the
# 2 s limit caps it); SCIP default measured once (cached). Looks after 4 and 5 instances, each at 0.025.
MILP = {"search_size": "fast", "search_instances": 6, "search_offset": 4, "scip_seeds": 1, "time_limit_s": 2,
        "search_default": "cached", "reference_rules": ["scip default"]}
SLOW = SEED_PROGRAM.replace("import numpy as np\n", "import time\n\nimport numpy as np\n").replace(
    "def policy(state, params):\n", "def policy(state, params):\n    time.sleep(0.5)\n")


@pytest.fixture(scope="module")
def milp(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("ATOLL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    evaluator = Evaluator("milp", MILP, SandboxConfig(wall_s=60), secrets=RunSecrets.fixed(2024))
    seed = evaluator.evaluate("seed", SEED_PROGRAM, "search")
    assert seed.status == Status.OK and len(seed.instance_scores) == 6
    yield evaluator, seed
    mp.undo()


def test_a_clearly_worse_milp_candidate_is_stopped_early_with_its_reason_and_the_instances_seen(milp):
    evaluator, seed = milp
    raced = evaluator.evaluate("slow", SLOW, "search", RaceSpec(ON, "seed", seed.instance_scores, seed.score))
    assert raced.status == Status.RACED and raced.score is None
    # stopped at the first look (4) or, where a loaded machine made the seed's own times vary, the second (5)
    seen = raced.metrics["instances_seen"]
    assert raced.metrics["raced"] is True and seen in (4, 5) and raced.metrics["instances"] == 6
    assert len(raced.instance_scores) == seen and raced.metrics["partial_mean"] < -2.0  # at least twice default's time
    assert raced.metrics["p_value"] < 0.025 and f"clearly worse than parent seed after {seen} of 6 instances" in raced.error
    assert raced.error == raced.metrics["reason"]


def test_a_better_milp_candidate_is_evaluated_in_full(milp):
    evaluator, seed = milp
    # the parent's stored per-instance scores: three times SCIP default's time on every instance
    parent = tuple(-3.0 for _ in seed.instance_scores)
    child = evaluator.evaluate("child", SEED_PROGRAM, "search", RaceSpec(ON, "slow", parent, -3.0))
    assert child.status == Status.OK and len(child.instance_scores) == 6 and "raced" not in child.metrics
    # raced in the race's order, kept in the runs' order: the same program's nodes, run by run
    assert [(r["instance"], r["nodes"]) for r in child.metrics["per_run"]] == \
        [(r["instance"], r["nodes"]) for r in seed.metrics["per_run"]]


def test_held_out_evaluations_never_race(milp):
    evaluator, seed = milp
    assert Race(RaceSpec(ON, "seed", seed.instance_scores)).looks(6) == 2
    from evaluators.racing import race_for
    assert race_for(RaceSpec(ON, "seed", seed.instance_scores), "heldout") is None
    assert race_for(RaceSpec(RacingConfig(), "seed", seed.instance_scores), "search") is None  # off by default


# A deterministic simple domain: eight instances, each a target x; the score is -(action - x)^2.
TARGETS = '''\
from evaluators.simple import SimpleDomain

SEED = "def act(state, params):\\n    return state['x']\\n"


class Targets(SimpleDomain):
    name = "targets"
    entry_point = "act"
    seed_program = SEED
    baseline_programs = {"seed": SEED}
    action_shape = ()

    def instances(self, split, rng):
        return [float(x) for x in rng.uniform(-1, 1, size=8)]

    def simulate(self, instances, policy):
        return [-(float(a) - x) ** 2 for a, x in zip(policy([{"x": x} for x in instances]), instances)]
'''
EXACT = "def act(state, params):\n    return state['x']\n"
OFF = "def act(state, params):\n    return state['x'] + 0.5 + 0.1 * state['x']\n"
TUNED_OFF = "PARAMS = {'b': (0.5, 0.0, 1.0)}\n\ndef act(state, params):\n    return state['x'] + params['b']\n"


@pytest.fixture(scope="module")
def simple():
    return Evaluator(DomainConfig(source=TARGETS), {}, SandboxConfig(wall_s=30), secrets=RunSecrets.fixed(7))


def test_a_simple_domain_races_without_tuning_and_an_equal_candidate_runs_in_full(simple):
    parent = simple.evaluate("p", EXACT, "search")
    spec = RaceSpec(ON, "p", parent.instance_scores, parent.score)
    equal = simple.evaluate("c", EXACT, "search", spec)
    assert equal.status == Status.OK and equal.score == parent.score
    assert equal.instance_scores == parent.instance_scores and equal.descriptors == pytest.approx(parent.descriptors)
    worse = simple.evaluate("w", OFF, "search", spec)
    assert worse.status == Status.RACED and worse.metrics["instances_seen"] == 4 and worse.score is None


def test_a_tuned_simple_search_score_is_the_best_trial_so_it_is_never_raced(simple):
    parent = simple.evaluate("p", EXACT, "search")
    tuned = simple.evaluate("t", TUNED_OFF, "search", RaceSpec(ON, "p", parent.instance_scores, parent.score))
    assert tuned.status == Status.OK and len(tuned.instance_scores) == 8


def test_without_per_instance_scores_the_parent_score_is_the_bar():
    race = Race(RaceSpec(ON, "p", (), threshold=-0.1))
    race.look([-0.1, -0.12], 8)  # too few instances: no look
    with pytest.raises(Exception, match="parent p's score -0.1 after 4 of 8"):
        race.look([-1.0, -1.1, -0.9, -1.2], 8)
    race.look([-0.05, -0.2, -0.1, -0.12], 8)  # not clearly worse


def test_the_racing_config_is_validated():
    with pytest.raises(pydantic.ValidationError, match="alpha"):
        RacingConfig(alpha=0.7)
    with pytest.raises(pydantic.ValidationError, match="min_instances"):
        RacingConfig(min_instances=1)
    with pytest.raises(pydantic.ValidationError, match="unknown|Extra"):
        RacingConfig(alfa=0.1)
    assert not RacingConfig().enabled and Race(RaceSpec(ON, "p")).looks(3) == 0
    assert np.isclose(Race(RaceSpec(RacingConfig(min_instances=3, chunk=2), "p")).looks(8), 3)


# Instances listed small first, then large (a natural order for a user's domain): the parent plays 0, the child
# misses each small target by 0.2 more but each large one (ten times the weight) by 0.1 at most.
SIZED = '''\
from evaluators.simple import SimpleDomain

SEED = "def act(state, params):\\n    return 0.0\\n"


class Sized(SimpleDomain):
    name = "sized"
    entry_point = "act"
    seed_program = SEED
    baseline_programs = {"seed": SEED}
    action_shape = ()

    def instances(self, split, rng):
        return [{"size": s, "x": float(rng.uniform(0.9, 1.1))} for s in (1,) * 6 + (10,) * 6]

    def simulate(self, instances, policy):
        acts = policy([dict(i) for i in instances])
        return [-abs(float(a) - i["x"]) * i["size"] for a, i in zip(acts, instances)]
'''
BETTER_ON_LARGE = "def act(state, params):\n    return 0.9 if state['size'] > 1 else -0.2\n"
WORSE = "def act(state, params):\n    return -1.0\n"


def test_a_child_better_on_average_but_worse_on_the_first_listed_instances_is_not_stopped():
    """The race scores the instances in an order drawn from the run's secret, not the domain's sorted one."""
    evaluator = Evaluator(DomainConfig(source=SIZED), {}, SandboxConfig(wall_s=30), secrets=RunSecrets.fixed(3))
    parent = evaluator.evaluate("p", "def act(state, params):\n    return 0.0\n", "search")
    full = evaluator.evaluate("c", BETTER_ON_LARGE, "search")
    assert full.score > parent.score + 4.0  # five times closer on average
    spec = RaceSpec(RacingConfig(enabled=True), "p", parent.instance_scores, parent.score)
    raced = evaluator.evaluate("c", BETTER_ON_LARGE, "search", spec)
    assert raced.status == Status.OK, raced.error
    assert raced.score == pytest.approx(full.score) and raced.instance_scores == pytest.approx(full.instance_scores)
    worse = evaluator.evaluate("w", WORSE, "search", spec)  # stopped: what it saw, with the instances it was
    unraced = evaluator.evaluate("w", WORSE, "search")
    seen = worse.metrics["seen_instances"]
    assert worse.status == Status.RACED and len(seen) == len(worse.instance_scores) < 12 and seen != sorted(seen)
    assert worse.instance_scores == pytest.approx([unraced.instance_scores[i] for i in seen])
    again = Race(spec)
    assert again.shuffle(12, RunSecrets.fixed(3)) == seen + [i for i in again.order if i not in seen]


LABELLED = '''\
from evaluators.simple import SimpleDomain

SEED = "def act(state, params):\\n    return 0.0\\n"


class Labelled(SimpleDomain):
    name = "labelled"
    entry_point = "act"
    seed_program = SEED
    baseline_programs = {"seed": SEED}
    action_shape = ()
    action_bounds = (-1.0, 1.0)

    def instances(self, split, rng):
        return [{"k": k} for k in range(8)]

    def label(self, instance, index):
        return f"k{instance['k']} at {index}"

    def simulate(self, instances, policy):
        return [-abs(float(a)) for a in policy([dict(i) for i in instances])]
'''


def test_a_raced_evaluations_bad_action_names_the_instance_by_its_place_in_the_split():
    evaluator = Evaluator(DomainConfig(source=LABELLED), {}, SandboxConfig(wall_s=30), secrets=RunSecrets.fixed(3))
    parent = evaluator.evaluate("p", "def act(state, params):\n    return 0.0\n", "search")
    bad = "def act(state, params):\n    return 5.0 if state['k'] == 6 else 0.0\n"
    raced = evaluator.evaluate("b", bad, "search", RaceSpec(ON, "p", parent.instance_scores, parent.score))
    assert raced.error == evaluator.evaluate("b", bad, "search").error  # not its place in a chunk
    assert raced.error.startswith("instance k6 at 6, step 1: the action 5.0 is outside"), raced.error


def test_a_child_better_on_average_is_stopped_at_most_alpha_of_the_time_whatever_the_runs_order():
    """Half the instances small (the child 0.2 worse, exactly), half large (it gains about 9): on the runs'
    orders whose first instances are all small the t-test sees no spread, which is no evidence, not p = 0."""
    stops, runs = 0, 200
    rng = np.random.default_rng(0)
    for k in range(runs):
        x, size = rng.uniform(0.9, 1.1, 12), np.array([1] * 6 + [10] * 6)
        parent, child = -x * size, -np.abs(np.where(size > 1, 0.9, -0.2) - x) * size
        race = Race(RaceSpec(RacingConfig(enabled=True), "p", tuple(parent)))
        order = race.shuffle(12, RunSecrets.fixed(k + 1))
        try:
            for n in range(1, 13):
                race.look([child[i] for i in order[:n]], 12)
        except RaceStopped:
            stops += 1
    assert stops <= 0.05 * runs
    same_gap = Race(RaceSpec(RacingConfig(enabled=True), "p", (), threshold=0.0))
    same_gap.look([-0.3, -0.3, -0.3], 8)  # no spread against the parent's score either: no stop
    with pytest.raises(RaceStopped):
        same_gap.look([-0.3, -0.31, -0.29, -0.3], 8)
