"""A domain of the user's own: loading it from a file or by name, the shorter form's rules, what a candidate sees."""
import os
import tempfile
import tomllib
from pathlib import Path

import pytest

from controller.config import ConfigError, load_config
from controller.scaffold import write_domain
from evaluators.check import Checker
from evaluators.evaluator import Evaluator
from evaluators.racing import RaceSpec, RacingConfig
from evaluators.registry import (DomainConfig, DomainLoadError, declared, domain_folders, domain_names, get_domain,
                                 get_domain_class)
from evaluators.sandbox.config import SandboxConfig
from evaluators.secrets import RunSecrets
from store.records import Status

ROOT = Path(__file__).resolve().parents[2]
LIMITS = SandboxConfig(wall_s=30)

# A complete small domain in the shorter form: move a point to a target in five steps, each move
# slowed by the instance's drag (unknown to the policy).
REACH = '''\
import numpy as np
from evaluators.simple import SimpleDomain

SEED = """PARAMS = {"gain": (0.3, 0.0, 2.0)}


def act(state, params):
    return params["gain"] * (state["target"] - state["position"])
"""


class Reach(SimpleDomain):
    name = "reach"
    entry_point = "act"
    seed_program = SEED
    baseline_programs = {"proportional": SEED}
    action_shape = ()
    action_bounds = (-10.0, 10.0)

    def instances(self, split, rng):
        return [(float(t), float(d)) for t, d in zip(rng.uniform(-5, 5, size=4), rng.uniform(0.5, 1.0, size=4))]

    def simulate(self, instances, policy):
        targets, drags = (np.array(column) for column in zip(*instances))
        position = np.zeros(len(targets))
        for _ in range(5):
            moves = policy([{"position": float(p), "target": float(t)} for p, t in zip(position, targets)])
            position = position + drags * np.array(moves)
        return -np.abs(position - targets)
'''

# The same domain, with a simulator that catches every exception around the policy's calls.
SWALLOWING = REACH.replace('''            moves = policy([{"position": float(p), "target": float(t)} for p, t in zip(position, targets)])''', '''\
            try:
                moves = policy([{"position": float(p), "target": float(t)} for p, t in zip(position, targets)])
            except Exception:
                moves = np.zeros(len(targets))''')


def _config(tmp_path, text=REACH, extra="") -> DomainConfig:
    (tmp_path / "reach.py").write_text(text)
    (tmp_path / "reach.toml").write_text(f'[domain]\npath = "reach.py"\n{extra}')
    return load_config(tmp_path / "reach.toml")[0].domain


def _evaluate(domain, code, split="search", secrets=None):
    return Evaluator(domain, {}, LIMITS, secrets=secrets or RunSecrets.fixed(1)).evaluate("p", code, split)


def test_a_file_domain_runs_from_its_text_even_after_the_file_is_gone(tmp_path):
    domain = _config(tmp_path)
    assert domain.path == str(tmp_path / "reach.py") and domain.source == REACH
    (tmp_path / "reach.py").unlink()  # what a resume on another node, or after the file moved, meets
    result = _evaluate(domain, get_domain(domain).seed_program)
    assert result.status == Status.OK, result.error
    assert result.score > -0.2 and result.tuned_params["gain"] > 0.8  # the written gain 0.3 scores about -0.7
    assert len(result.instance_scores) == 4 and len(result.metrics["instances"]) == 4
    assert len(result.descriptors) == 2 and result.metrics["tune_trials"] == 24
    assert get_domain(domain).output_bounds() == (-10.0, 10.0)  # its action_bounds, for the embedded mutator


def test_the_same_text_in_two_folders_hides_each_folder(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    folders = [domain_folders(get_domain(_config(folder))) for folder in (first, second)]
    assert folders == [(str(first),), (str(second),)]


def test_every_split_is_scored_and_held_out_data_differs_from_search(tmp_path):
    domain = _config(tmp_path)
    seed = get_domain(domain).seed_program
    scores = {split: _evaluate(domain, seed, split).instance_scores for split in ("search", "heldout")}
    assert scores["search"] != scores["heldout"] and all(len(s) == 4 for s in scores.values())


def test_a_split_without_instances_says_so_every_time_it_is_asked(tmp_path):
    """An empty list from instances() is never kept: the evaluator's second program (a baseline after
    the seed) got the same line, not an error from deep in the tuning about an empty sequence."""
    domain = get_domain(_config(tmp_path, REACH.replace("        return [(float(t), float(d))",
                                                        "        return [] and [(float(t), float(d))")))
    for _ in range(2):
        with pytest.raises(ValueError, match=r"^Reach.instances\('search'\) returned no instances$"):
            domain.split_instances("search")


def test_instances_come_from_the_run_secrets_of_each_split(tmp_path):
    domain = _config(tmp_path)
    one, same, other = (get_domain(domain, secrets=RunSecrets.fixed(s)) for s in (5, 5, 6))
    assert one.split_instances("search") == same.split_instances("search")
    assert one.split_instances("search") != other.split_instances("search")
    assert one.split_instances("search") != one.split_instances("heldout")


@pytest.mark.parametrize("answer, status, needle", [
    ("float('nan')", Status.INVALID, "not finite"),
    ("100.0", Status.INVALID, "outside [-10, 10]"),
    ("[1.0, 2.0]", Status.INVALID, "shape (2,)"),
    ("'up'", Status.FAILED, "not numbers"),
])
def test_actions_are_checked_before_the_simulator_sees_them(tmp_path, answer, status, needle):
    result = _evaluate(_config(tmp_path), f"def act(state, params):\n    return {answer}\n")
    assert result.status == status and needle in result.error, result.error


def test_a_tuning_trial_that_acts_out_of_range_fails_alone_and_the_program_keeps_its_best_trial(tmp_path):
    # most of this gain's range moves the point by more than the bounds allow; those trials fail,
    # the written 0.3 and the others in range are scored, and the best of them is the program's
    code = ('PARAMS = {"gain": (0.3, 0.0, 50.0)}\n\n\n'
            'def act(state, params):\n    return params["gain"] * (state["target"] - state["position"])\n')
    result = _evaluate(_config(tmp_path), code)
    assert result.status == Status.OK, result.error
    assert result.score > -0.2 and 0.8 < result.tuned_params["gain"] <= 2.0  # in range for a target up to 5
    assert 0 < result.metrics["tune_out_of_range"] < result.metrics["tune_trials"]


def test_a_program_no_tuning_trial_of_which_acts_in_range_is_invalid_with_the_first_reason(tmp_path):
    code = 'PARAMS = {"push": (20.0, 15.0, 30.0)}\n\n\ndef act(state, params):\n    return params["push"]\n'
    result = _evaluate(_config(tmp_path), code)
    assert result.status == Status.INVALID, result.error
    assert result.error.startswith("instance 0, step 1: the action 20.0 is outside [-10, 10]")
    assert result.error.endswith("; every one of the 24 tuning trials of its PARAMS acted out of range")


def test_a_simulator_that_catches_every_error_cannot_hide_a_bad_action(tmp_path):
    assert "except Exception" in SWALLOWING
    result = _evaluate(_config(tmp_path, SWALLOWING), "def act(state, params):\n    return float('nan')\n")
    assert result.status == Status.INVALID and "not finite" in result.error


@pytest.mark.parametrize("text, needle", [
    ("import numpy\nX = 1\n", "defines no domain: expected a class deriving from SimpleDomain"),
    ("def broken(:\n    pass\n", "failed to load: SyntaxError"),
    ("import numpy\n\nx = undefined_name\n", "failed to load: NameError: name 'undefined_name' is not defined "
                                            "(line 3)"),
    (REACH.replace("    def simulate(", "    def simulate_(", 1), "defines Reach but it lacks simulate"),
    ("from pydantic import BaseModel\n\n\nclass M(BaseModel):\n    x: int\n\n\nM(x='abc')\n",
     ("failed to load: ValidationError: M.x: Input should be a valid integer, unable to parse string as an "
      "integer (line 8)")),
    ('raise ValueError("the table is empty:\\n    add a row")\n',
     "failed to load: ValueError: the table is empty: add a row (line 1)"),
    ("import sys\n\nsys.exit(3)\n", "failed to load: SystemExit(3): the file exits as it is imported (line 3)"),
    (REACH + "\n\nclass Other(Reach):\n    name = 'other'\n", "defines several domains (other, reach); choose"),
    (REACH + "\n\nclass Longer(Reach):\n    horizon = 40\n",  # kept its parent's name: domain.name cannot choose
     "defines several domains named 'reach' (Reach, Longer): give each class its own `name`, then choose one"),
])
def test_a_file_that_defines_no_usable_domain_is_one_clear_line(tmp_path, text, needle):
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path, text)
    assert needle in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("domain.path: ")


def test_a_module_beside_the_file_is_not_importable_and_the_error_says_why(tmp_path):
    (tmp_path / "helpers.py").write_text("GAIN = 0.3\n")
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path, "import helpers\n" + REACH)
    assert str(caught.value).endswith("No module named 'helpers' (line 1); helpers lies beside the file, but a "
                                      "domain file is one self-contained module (its text travels with the run): "
                                      "put that code in the file, or make the domain an installed package")


def test_a_file_with_several_domains_picks_one_by_name(tmp_path):
    text = REACH + "\n\nclass Other(Reach):\n    name = 'other'\n"
    assert get_domain_class(_config(tmp_path, text, 'name = "other"\n')).name == "other"
    with pytest.raises(ConfigError, match="defines no domain named 'nope'"):
        _config(tmp_path, text, 'name = "nope"\n')
    with pytest.raises(ConfigError, match="several domains named 'reach' \\(Reach, Longer\\)"):
        _config(tmp_path, REACH + "\n\nclass Longer(Reach):\n    horizon = 40\n", 'name = "reach"\n')


def test_a_domain_whose_evaluate_returns_no_outcome_says_so(tmp_path):
    """A `Domain` written by hand that returns its score alone (a float) is told what to return."""
    text = REACH + ("\n\nclass Bare(Reach):\n    name = 'bare'\n\n"
                    "    def evaluate(self, policy, params, split, race=None):\n        return 0.5\n")
    domain = _config(tmp_path, text, 'name = "bare"\n')
    with pytest.raises(TypeError, match=r"^Bare.evaluate returned float, not an Outcome \(evaluators._base"):
        _evaluate(domain, "def act(state, params):\n    return 0.0\n")


@pytest.mark.parametrize("toml, needle", [
    ('[domain]\npath = "absent.py"\n', "absent.py does not exist"),
    ('[domain]\npath = "reach.py"\n[domain.options]\ntune_trials = 0\n',
     "domain.options.tune_trials: Input should be greater than or equal to 1"),
    ('[domain]\npath = "reach.py"\n[domain.options]\ncolour = 1\n', "domain.options.colour: unknown key"),
    ("[domain]\n", "give domain.name (a registered domain) or domain.path"),
])
def test_bad_domain_config_is_one_clear_line(tmp_path, toml, needle):
    (tmp_path / "reach.py").write_text(REACH)
    (tmp_path / "c.toml").write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "c.toml")
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_the_builtins_are_declared_as_entry_points_in_pyproject():
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["atoll.domains"]
    folders = {p.name for p in (ROOT / "evaluators" / "domains").iterdir() if (p / "domain.py").is_file()}
    assert set(table) == folders
    for name, value in table.items():
        assert value.startswith(f"evaluators.domains.{name}.domain:")
        assert declared()[name].value == value and get_domain_class(name).name == name
    assert set(table) <= set(domain_names())


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(DomainLoadError, match="unknown domain 'nope'; known: control, inventory"):
        get_domain_class("nope")


@pytest.fixture()
def visible_folder():
    """A folder that nothing but the domain's own hiding keeps from candidates (not under /tmp or home)."""
    if os.geteuid() != 0:
        pytest.skip("the sandbox hides files only as root")
    for parent in ("/srv", "/opt", "/mnt"):
        if os.access(parent, os.W_OK):
            folder = Path(tempfile.mkdtemp(prefix="atoll-domain-", dir=parent))
            folder.chmod(0o755)  # readable by the sandbox's unprivileged uid, were it not hidden
            yield folder
            for path in folder.iterdir():
                path.unlink()
            folder.rmdir()
            return
    pytest.skip("no writable folder outside /tmp and the home directory")


def test_a_hostile_policy_cannot_read_the_domain_files(visible_folder):
    write_domain("pricing", visible_folder)
    (visible_folder / "prices.csv").write_text("secret,data\n")  # the domain's own data beside it
    (visible_folder / "prices.csv").chmod(0o644)
    config, _ = load_config(visible_folder / "pricing.toml", ["domain.options.tune_trials=2",
                                                             "domain.options.horizon=10"])
    checker = Checker(config.domain, LIMITS)
    assert str(visible_folder / "pricing.py") in checker.domain_files()
    check = checker.reads_files()
    assert check.passed, check.detail


# A domain of the user's own whose score a program can drive to infinity (or NaN): a target hit
# exactly divides by zero.
EXACT_IS_INFINITE = '''\
import dataclasses
import math

from evaluators.simple import SimpleDomain

SEED = "def act(state, params):\\\\n    return 0.0\\\\n"


class Targets(SimpleDomain):
    name = "targets"
    entry_point = "act"
    seed_program = SEED
    baseline_programs = {"seed": SEED}
    action_shape = ()

    def instances(self, split, rng):
        return [0.6, 0.7, 0.8, 0.9]

    def simulate(self, instances, policy):
        return [-abs(float(a) - x) for a, x in zip(policy([{"x": x} for x in instances]), instances)]

    def evaluate(self, policy, params, split, race=None):
        out = super().evaluate(policy, params, split)
        scores = [math.nan if s == 0 else 1 / -s for s in out.instance_scores]
        return dataclasses.replace(out, score=1 / -out.score if out.score else math.inf, instance_scores=scores)
'''


EXACT_EVERYWHERE = "def act(state, params):\n    return state['x']\n"
EXACT_ON_TWO = "def act(state, params):\n    return state['x'] if state['x'] > 0.75 else 0.0\n"


@pytest.mark.parametrize("code, needle", [(EXACT_EVERYWHERE, "score for it is inf"),
                                          (EXACT_ON_TWO, "score on instance 2 for it is nan")])
def test_a_score_that_is_not_a_finite_number_is_an_invalid_result_never_a_score(code, needle):
    """Left OK, an infinite score stopped the run with a traceback at the island (and would rank above every
    real one); a NaN per-instance score breaks every paired test. Both are INVALID, with the reason."""
    evaluator = Evaluator(DomainConfig(source=EXACT_IS_INFINITE), {}, LIMITS, secrets=RunSecrets.fixed(3))
    assert evaluator.evaluate("seed", "def act(state, params):\n    return 0.0\n", "search").status == Status.OK
    for split in ("search", "heldout"):
        result = evaluator.evaluate("p", code, split)
        assert result.status == Status.INVALID and result.score is None and needle in result.error, result


def test_a_behaviour_descriptor_that_is_not_a_finite_number_is_an_invalid_result(tmp_path):
    """A program acting 1e200 in a domain with unbounded actions overflowed its actions' spread (the
    descriptor) to NaN: left OK, a MAP-Elites island refused the member and the run stopped with a traceback.
    Such a result is INVALID, with the reason, like a score that is not finite."""
    domain = _config(tmp_path, REACH.replace("action_bounds = (-10.0, 10.0)", "action_bounds = None"))
    huge = "def act(state, params):\n    return 1e200\n"
    result = _evaluate(domain, huge)
    assert result.status == Status.INVALID and "behaviour descriptor 1 for it is nan" in result.error, result
    assert _evaluate(domain, "def act(state, params):\n    return 1e100\n").status == Status.OK


# A domain of the user's own where remembering pays: each of two steps, the point is pushed by an amount
# of the instance's (unknown to the policy, seen only afterwards in where the point lands).
DRIFT = '''\
import numpy as np
from evaluators.simple import SimpleDomain

SEED = """PARAMS = {"gain": (1.0, 0.0, 2.0)}


def act(state, params):
    return -params["gain"] * state["position"]
"""


class Drift(SimpleDomain):
    name = "drift"
    entry_point = "act"
    seed_program = SEED
    baseline_programs = {"damp": SEED}
    action_shape = ()

    def instances(self, split, rng):
        return [tuple(float(v) for v in rng.normal(size=3)) for _ in range(4)]

    def simulate(self, instances, policy):
        position = np.array([start for start, _, _ in instances])
        pushes = np.array([push for _, *push in instances])
        cost = np.zeros(len(instances))
        for step in range(2):
            moves = policy([{"position": float(p), "step": step} for p in position])
            position = position + np.array(moves, dtype=float) + pushes[:, step]
            cost += np.abs(position)
        return -cost
'''

# Raises once it meets a first step after a later one: a second simulate() call in the same process.
REPLAY_REFUSED = '''\
PARAMS = {"gain": (1.0, 0.0, 2.0)}
PLAYED = []


def act(state, params):
    if state["step"] == 0 and PLAYED:
        raise RuntimeError("a second simulate() call in this process")
    if state["step"] > 0:
        PLAYED.append(1)
    return -params["gain"] * state["position"]
'''

# Learns each instance's first push (keyed by its first state) and cancels it when the instance comes again.
MEMORISE = '''\
PARAMS = {"gain": (1.0, 0.0, 2.0)}
PUSH = {}  # an instance's start -> the push after its first move, seen in an earlier round
LEFT = []  # this round's (start, where its first move left it), in the order the instances come


def act(state, params):
    position = float(state["position"])
    if state["step"] == 0:
        move = -params["gain"] * state["position"]
        LEFT.append((position, position + float(move)))
        return -position - PUSH[position] if position in PUSH else move
    start, left = LEFT.pop(0)
    PUSH[start] = position - left
    return -params["gain"] * state["position"]
'''


def _drift(tmp_path, trials=2) -> DomainConfig:
    (tmp_path / "drift.py").write_text(DRIFT)
    (tmp_path / "drift.toml").write_text(f'[domain]\npath = "drift.py"\n[domain.options]\ntune_trials = {trials}\n'
                                         'tune_batch = 1\n')
    return load_config(tmp_path / "drift.toml")[0].domain


@pytest.mark.parametrize("split", ["search", "validation", "heldout"])
def test_a_program_meets_no_instance_twice_in_one_process(tmp_path, split):
    """Tuning rounds replay the search instances, and the other splits tune on them first: each simulate()
    call is answered by a process of the program that has played nothing, so a program that refuses a
    replay scores what the written program does (it failed in the second round)."""
    domain = _drift(tmp_path)
    refused, honest = (_evaluate(domain, code, split) for code in (REPLAY_REFUSED, get_domain(domain).seed_program))
    assert refused.status == Status.OK, refused.error
    assert refused.instance_scores == honest.instance_scores and refused.tuned_params == honest.tuned_params


def test_what_a_program_remembers_of_a_tuning_round_buys_no_score_in_the_next(tmp_path):
    """Round one shows each instance's first push; a program that kept it cancelled it in round two and
    scored about twice as well as its play earns. Each round now starts with nothing remembered."""
    domain = _drift(tmp_path)
    memorise, honest = (_evaluate(domain, code) for code in (MEMORISE, get_domain(domain).seed_program))
    assert memorise.status == Status.OK, memorise.error
    assert memorise.instance_scores == honest.instance_scores and memorise.score == honest.score


def test_a_raced_evaluation_plays_each_chunk_in_a_process_that_played_no_other(tmp_path):
    """A raced search evaluation plays its instances in chunks (three, then one): a program that kept the
    first chunk's episodes could use them in the next, which an unraced evaluation never allows. Each chunk
    is answered by a process of its own, so the raced scores are the unraced ones (it failed in chunk two)."""
    evaluator = Evaluator(_drift(tmp_path, trials=1), {}, LIMITS, secrets=RunSecrets.fixed(1))
    unraced = evaluator.evaluate("p", REPLAY_REFUSED, "search")
    never_worse = RaceSpec(RacingConfig(enabled=True), "parent", (-99.0,) * 4)
    raced = evaluator.evaluate("p", REPLAY_REFUSED, "search", never_worse)
    assert unraced.status == raced.status == Status.OK, raced.error
    assert raced.instance_scores == unraced.instance_scores
