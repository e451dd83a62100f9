"""Secret randomness, through the real Evaluator and sandbox: a candidate cannot know its data.

The foresight attacks (tests/evaluators/secret_attacks.py) regenerate the data from
every public recipe and guessable seed inside the candidate's own process. Under a
run's drawn secrets each of them recognises nothing and scores exactly what its
honest fallback scores; under a replay seed it guessed, the same program wins, which
is why a replayable run says so. Also: two runs with drawn secrets meet different
data, a replay seed reproduces scores exactly, and within a run the same program
always gets the same score (common random numbers).
"""
import gymnasium as gym
import pytest

from evaluators.domains.control.programs import LANDER_HEURISTIC
from evaluators.evaluator import Evaluator
from evaluators.sandbox.config import SandboxConfig
from evaluators.secrets import RunSecrets
from store.records import Status
from tests.evaluators import secret_attacks

LIMITS = SandboxConfig(wall_s=90, startup_s=20)
REPLAY = 3  # a replay seed the attacks guess (they try 0-4)
GUESSES = range(5)
SPLITS = ("search", "heldout")

INVENTORY = {"search_instances": [{"lead_time": 1, "penalty": 4, "demand": "poisson"},
                                  {"lead_time": 2, "penalty": 19, "demand": "poisson"}],
             "heldout_instances": [{"lead_time": 3, "penalty": 9, "demand": "geometric"}],
             "search_periods": 60, "heldout_periods": 60, "warmup": 40, "search_trajectories": 2,
             "heldout_trajectories": 2, "tune_trials": 2, "tune_batch": 2, "dp_max_lead": 0}


def _inventory_attack(guesses):
    return secret_attacks.inventory(INVENTORY, replay_guesses=guesses, old_guesses=range(21) if guesses else ())


@pytest.fixture(scope="module")
def inventory_honest():
    """The honest fallback's score per split, on drawn secrets (its evaluator is reused by the attack)."""
    evaluator = Evaluator("inventory", INVENTORY, LIMITS)
    honest = {split: evaluator.evaluate("honest", _inventory_attack(()), split) for split in SPLITS}
    assert all(r.status == Status.OK for r in honest.values()), honest
    return evaluator, honest


@pytest.mark.parametrize("split", SPLITS)
def test_inventory_foresight_gains_nothing_against_drawn_secrets(inventory_honest, split):
    evaluator, honest = inventory_honest
    attack = evaluator.evaluate("attack", _inventory_attack(GUESSES), split)
    assert attack.status == Status.OK, attack.error
    assert attack.score == honest[split].score and attack.metrics == honest[split].metrics


def test_inventory_foresight_wins_when_the_run_is_replayable_with_a_guessed_seed():
    """The attack is real: against replay seed 3 (which it guesses) it beats the exact DP optimum."""
    evaluator = Evaluator("inventory", INVENTORY, LIMITS, secrets=RunSecrets.fixed(REPLAY))
    for split in SPLITS:
        honest = evaluator.evaluate("honest", _inventory_attack(()), split)
        attack = evaluator.evaluate("attack", _inventory_attack(GUESSES), split)
        assert attack.status == Status.OK, attack.error
        assert honest.score < -0.9 and attack.score > -0.05, (split, honest.score, attack.score)
        assert attack.metrics["mean_cost"] < 0.05 * honest.metrics["mean_cost"]


CONTROL = {"search_seeds": 3, "heldout_seeds": 4, "max_steps": 150, "tune_trials": 2, "tune_batch": 2,
           "linear_trials": 2}


def _first_observations(seeds) -> list:
    env = gym.make("LunarLander-v3")
    return [env.reset(seed=int(s))[0] for s in seeds]


@pytest.fixture(scope="module")
def control_attack():
    """Knows the first observation of seeds 0-49 and 1000-1049 (the old public layout, and more) and of
    every episode of replay seeds 0-4: with its own simulator it would then know the episode."""
    from evaluators.registry import get_domain

    known = list(range(50)) + list(range(1000, 1050))
    for guess in GUESSES:
        domain = get_domain("control", **CONTROL, secrets=RunSecrets.fixed(guess))
        known += [int(s) for split in ("search", "validation", "heldout")
                  for s in [*domain.seeds(split), *domain.measure_seeds(split)]]
    return secret_attacks.control(_first_observations(known), LANDER_HEURISTIC), \
        secret_attacks.control([], LANDER_HEURISTIC)


@pytest.mark.parametrize("secrets, recognised", [(None, False), (RunSecrets.fixed(REPLAY), True)],
                         ids=["drawn", "replay seed it guessed"])
def test_control_candidate_cannot_know_its_reset_seeds(control_attack, secrets, recognised):
    attack, honest = control_attack
    evaluator = Evaluator("control", CONTROL, LIMITS, secrets=secrets)
    for split in SPLITS:
        mine, fallback = evaluator.evaluate("attack", attack, split), evaluator.evaluate("honest", honest, split)
        assert mine.status == fallback.status == Status.OK, (mine.error, fallback.error)
        if recognised:
            assert mine.score > fallback.score + 50, split
        else:
            assert mine.score == fallback.score and mine.instance_scores == fallback.instance_scores


SYNTHETIC = {"assets": 2, "bars": 2000, "edge": 0.0, "drift": 0.0, "correlation": 0.3}
TRADING = {"market": "synthetic", "synthetic": SYNTHETIC, "tune_bars": 60, "test_bars": 40, "holdout_bars": 60,
           "max_folds": 2, "tune_trials": 2}


@pytest.mark.parametrize("secrets, regenerated", [(None, False), (RunSecrets.fixed(REPLAY), True)],
                         ids=["drawn", "replay seed it guessed"])
def test_trading_candidate_cannot_regenerate_the_synthetic_market(secrets, regenerated):
    attack = secret_attacks.trading(SYNTHETIC, TRADING["holdout_bars"], replay_guesses=GUESSES)
    honest = secret_attacks.trading(SYNTHETIC, TRADING["holdout_bars"])
    evaluator = Evaluator("trading", TRADING, LIMITS, secrets=secrets)
    for split in SPLITS:
        mine, fallback = evaluator.evaluate("attack", attack, split), evaluator.evaluate("honest", honest, split)
        assert mine.status == fallback.status == Status.OK, (mine.error, fallback.error)
        if regenerated:  # perfect foresight of every next return
            assert mine.score > 5 and mine.score > fallback.score + 5, split
        else:
            assert mine.score == fallback.score and mine.metrics == fallback.metrics


def test_two_runs_with_drawn_secrets_meet_different_data_and_a_replay_seed_repeats_exactly():
    code = secret_attacks.inventory(INVENTORY)  # the honest rule
    first, second = (Evaluator("inventory", INVENTORY, LIMITS) for _ in range(2))
    replay = [Evaluator("inventory", INVENTORY, LIMITS, secrets=RunSecrets.fixed(41)) for _ in range(2)]
    for split in SPLITS:
        a, b = first.evaluate("p", code, split), second.evaluate("p", code, split)
        assert a.metrics["instances"] != b.metrics["instances"]
        r1, r2 = (e.evaluate("p", code, split) for e in replay)
        assert r1.score == r2.score and r1.metrics == r2.metrics
        assert first.evaluate("p", code, split).score == a.score  # within a run: the same program, the same score


def test_the_secrets_never_reach_a_log_or_a_repr():
    secrets = RunSecrets.draw()
    assert str(secrets.search) not in repr(secrets) and "replayable=False" in repr(secrets)
    assert len({secrets.search, secrets.validation, secrets.heldout}) == 3
