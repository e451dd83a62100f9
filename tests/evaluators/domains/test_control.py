"""The control domain: gymnasium's heuristic reproduced, determinism, validation, lockstep, tuning."""
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.box2d.lunar_lander import heuristic

from evaluators._base import CandidateError
from evaluators.sandbox.config import SandboxConfig
from evaluators.domains.control.programs import LANDER_HEURISTIC
from evaluators.evaluator import Evaluator
from evaluators.params import read_params
from evaluators.registry import get_domain
from evaluators.sandbox.process import PolicyProcess
from evaluators.secrets import RunSecrets
from store.records import Status

FIXED = RunSecrets.fixed(2024)  # where a test needs the same episodes every time

LIMITS = SandboxConfig(wall_s=60)
SHORT = {"search_seeds": 3, "heldout_seeds": 4, "max_steps": 60, "tune_trials": 4, "tune_batch": 2,
         "linear_trials": 4}


def in_process(code):
    """Run a trusted test program directly (the domain only ever sees a PolicyFn)."""
    namespace = {}
    exec(code, namespace)
    fn = namespace["act"]
    return lambda batches: [fn(obs, params) for obs, params in batches]


def test_heuristic_program_matches_gymnasium_step_by_step():
    env = gym.make("LunarLander-v3")
    with PolicyProcess(LANDER_HEURISTIC, "act", LIMITS) as policy:
        for seed in (1000, 1001, 1002):
            obs, _ = env.reset(seed=seed)
            done, steps = False, 0
            while not done:
                ours = int(policy([(obs[None, :].astype(np.float32), {})])[0][0])
                assert ours == heuristic(env, obs), (seed, steps)
                obs, _, term, trunc, _ = env.step(ours)
                done, steps = term or trunc, steps + 1
            assert steps > 50


def test_heuristic_reproduces_gymnasium_on_the_secret_seeds_and_the_known_mean_on_seeds_1000_1099():
    """The held-out episodes are gymnasium's own on the run's secret seeds; on the public seeds
    1000-1099 the same lockstep runner gives the known figure 233.5 (min -169)."""
    evaluator = Evaluator("control", {"linear_trials": 1}, LIMITS, secrets=FIXED)
    result = evaluator.evaluate("heuristic", LANDER_HEURISTIC, "heldout")
    assert result.status == Status.OK, result.error
    env, own = gym.make("LunarLander-v3"), []
    for seed in evaluator.domain.seeds("heldout"):
        obs, _ = env.reset(seed=int(seed))
        total, done = 0.0, False
        while not done:
            obs, reward, term, trunc, _ = env.step(heuristic(env, obs))
            total, done = total + reward, term or trunc
        own.append(total)
    assert result.instance_scores == pytest.approx(own, abs=1e-9)
    assert result.score > 200 and result.metrics["solved_share"] > 0.75
    public = evaluator.domain.runner.run(in_process(LANDER_HEURISTIC), np.arange(1000, 1100), {})
    assert public.returns.mean() == pytest.approx(233.5, abs=3.0)
    assert public.returns.min() == pytest.approx(-169.4, abs=3.0)


def test_same_program_same_returns():
    evaluator = Evaluator("control", SHORT, LIMITS)
    seed = evaluator.domain.seed_program
    first, second = (evaluator.evaluate("seed", seed, "search") for _ in range(2))
    assert first.status == second.status == Status.OK
    assert first.instance_scores == second.instance_scores and first.tuned_params == second.tuned_params
    random = evaluator.domain.baselines()["random"]
    a, b = (evaluator.evaluate("random", random, "heldout") for _ in range(2))
    assert a.instance_scores == b.instance_scores
    assert len(set(a.metrics["action_share"])) > 1  # it does pick different actions


@pytest.mark.parametrize("env, body, needle", [
    ("LunarLander-v3", "return np.full(len(obs), 4)", "not one of the discrete actions"),
    ("LunarLander-v3", "return np.full(len(obs), 1.5)", "not one of the discrete actions"),
    ("LunarLander-v3", "return np.zeros(len(obs) + 1, dtype=int)", "shape"),
    ("LunarLander-v3", "return np.full(len(obs), np.nan)", "not finite"),
    ("Pendulum-v1", "return np.full(len(obs), np.inf)", "not finite"),
    ("Pendulum-v1", "return np.zeros((len(obs), 2))", "shape"),
])
def test_invalid_actions_are_invalid(env, body, needle):
    evaluator = Evaluator("control", dict(SHORT, env=env), LIMITS)
    result = evaluator.evaluate("bad", f"import numpy as np\n\ndef act(obs, params):\n    {body}\n", "search")
    assert result.status == Status.INVALID and needle in result.error and "step 0" in result.error


def test_a_tuning_trial_that_acts_out_of_range_fails_alone_and_a_program_none_of_whose_trials_does_is_invalid():
    # engine choice from a parameter: over 4.0 it is no action of LunarLander's; the written 2.0
    # and the trials below 4 are scored, the others fail
    tuned = ("import numpy as np\nPARAMS = {'engine': (2.0, 0.0, 7.0)}\n\ndef act(obs, params):\n"
             "    return np.floor(params['engine'])\n")
    domain = get_domain("control", **dict(SHORT, tune_trials=8, tune_batch=4), secrets=FIXED)
    studies = []
    real = domain.tuner._round
    domain.tuner._round = lambda policy, params, seeds, study, *rest: (
        studies.append(study) or real(policy, params, seeds, study, *rest))
    out = domain.evaluate(in_process(tuned), read_params(tuned), "search")
    assert 0.0 <= out.tuned_params["engine"] < 4.0
    states = [t.state.name for t in studies[0].trials]
    assert states.count("FAIL") >= 1 and states.count("COMPLETE") >= 1
    assert out.metrics["tune_out_of_range"] == states.count("FAIL")
    never = ("import numpy as np\nPARAMS = {'engine': (5.0, 4.0, 9.0)}\n\ndef act(obs, params):\n"
             "    return np.floor(params['engine'])\n")
    with pytest.raises(CandidateError) as caught:
        domain.evaluate(in_process(never), read_params(never), "search")
    assert caught.value.status == Status.INVALID
    assert caught.value.reason.startswith("step 0: action 5 is not one of the discrete actions 0..3")
    assert caught.value.reason.endswith("; every one of the 8 tuning trials of its PARAMS acted out of range")


def test_continuous_actions_are_clipped_not_rejected():
    domain = get_domain("control", **dict(SHORT, env="Pendulum-v1"))
    big = in_process("import numpy as np\n\ndef act(obs, params):\n    return 1e6 * obs[:, 2]\n")
    edge = in_process("import numpy as np\n\ndef act(obs, params):\n    return 2.0 * np.sign(obs[:, 2])\n")
    a = domain.evaluate(big, {}, "search").instance_scores
    b = domain.evaluate(edge, {}, "search").instance_scores
    assert a == pytest.approx(b)  # 1e6 * velocity saturates to the same bang-bang torque


@pytest.mark.parametrize("env", ["LunarLander-v3", "MountainCarContinuous-v0"])
def test_lockstep_equals_one_episode_at_a_time(env):
    domain = get_domain("control", env=env, max_steps=300)
    name = "gymnasium heuristic" if env == "LunarLander-v3" else "bang-bang on velocity"
    code = domain.baselines()[name]
    policy, values = in_process(code), {n: p.default for n, p in read_params(code).items()}
    seeds = np.arange(5)
    together = domain.runner.run(policy, seeds, {n: np.full(5, v) for n, v in values.items()})
    for i, seed in enumerate(seeds):
        alone = domain.runner.run(policy, [seed], {n: np.full(1, v) for n, v in values.items()})
        assert alone.returns[0] == together.returns[i] and alone.lengths[0] == together.lengths[i]
    assert len(set(together.lengths)) > 1  # episodes did drop out at different steps


def test_tuning_improves_a_tunable_rule():
    domain = get_domain("control", env="MountainCarContinuous-v0", search_seeds=3, max_steps=400,
                        tune_trials=8, tune_batch=4, secrets=FIXED)
    code = ("import numpy as np\n\nPARAMS = {'force': (0.0, -1.0, 1.0)}\n\n"
            "def act(obs, params):\n    return np.where(obs[:, 1] >= 0, params['force'], -params['force'])\n")
    untuned = domain.runner.run(in_process(code), domain.seeds("search"), {"force": np.zeros(3)})
    tuned = domain.evaluate(in_process(code), read_params(code), "search")
    assert untuned.returns.tolist() == [0.0] * 3  # force 0: the car stays in the valley, at no cost
    assert tuned.score > 50 and tuned.tuned_params["force"] > 0.1
    assert tuned.metrics["solved_share"] > 0.5 and tuned.metrics["timeouts"] < 3


def test_linear_baseline_gets_its_cma_budget_and_heldout_retunes_on_search_seeds_only():
    domain = get_domain("control", **dict(SHORT, env="Pendulum-v1", linear_trials=9))
    code = domain.baselines()["linear (CMA-ES)"]
    seen = []

    def spy(batches):
        seen.append(len(batches[0][0]))
        return in_process(code)(batches)

    result = domain.evaluate(spy, read_params(code), "heldout")
    assert result.metrics["tune_trials"] == 9 and result.metrics["episodes"] == 4
    # Pendulum episodes all run the 60 steps: the defaults alone on the 3 search seeds, one CMA-ES
    # generation of 8 (popsize for 4 weights) as 24 rows, then the tuned weights on the 4 held-out seeds.
    assert seen == [3] * 60 + [24] * 60 + [4] * 60


def test_reset_seeds_come_from_the_run_secrets_one_set_per_split():
    options = dict(search_seeds=30, validation_seeds=10, heldout_seeds=100)
    domain, twin = get_domain("control", **options, secrets=FIXED), get_domain("control", **options, secrets=FIXED)
    seeds = {split: domain.seeds(split) for split in ("search", "validation", "heldout")}
    assert [len(set(s.tolist())) for s in seeds.values()] == [30, 10, 100]  # distinct within a split
    assert not set(seeds["search"].tolist()) & set(seeds["heldout"].tolist())
    assert not set(seeds["validation"].tolist()) & (set(seeds["search"].tolist()) | set(seeds["heldout"].tolist()))
    assert all(np.array_equal(twin.seeds(split), s) for split, s in seeds.items())  # the same run: the same
    measured = {split: domain.measure_seeds(split) for split in ("search", "validation")}
    assert [len(set(s.tolist())) for s in measured.values()] == [30, 10]  # as many fresh episodes as tuned on
    every = [s.tolist() for s in [*seeds.values(), *measured.values()]]
    assert len(set().union(*every)) == sum(map(len, every))  # no episode in two sets
    assert np.array_equal(domain.measure_seeds("heldout"), seeds["heldout"])
    assert all(np.array_equal(twin.measure_seeds(split), s) for split, s in measured.items())
    fresh = get_domain("control", **options)  # drawn secrets: another run's episodes
    assert not set(fresh.seeds("search").tolist()) & set(seeds["search"].tolist())
    assert seeds["search"].max() >= 2 ** 20  # not a small guessable range like 0-19
    with pytest.raises(Exception, match="heldout_seed_start"):
        get_domain("control", heldout_seed_start=1000)  # the old public layout is gone


def test_check_actions_rejects_wrong_dtype():
    domain = get_domain("control", **SHORT)
    from evaluators.domains.control.simulation import check_actions
    with pytest.raises(CandidateError, match="numbers"):
        check_actions(np.array(["a", "b"]), 2, domain.spec, 3)
    assert check_actions(np.array(2.0), 3, domain.spec, 0).tolist() == [2, 2, 2]


@pytest.mark.parametrize("name", ["control_lunarlander", "control_pendulum", "control_mountaincar"])
def test_shipped_configs_give_the_linear_baseline_the_search_budget(name):
    from controller.config import load_config

    config, _ = load_config(Path(__file__).resolve().parents[3] / "configs" / f"{name}.toml")
    assert config.domain.name == "control"
    assert config.domain.options["linear_trials"] == config.run.max_evals


def test_pendulum_motifs_compose_into_a_swing_up_at_their_written_defaults():
    """'energy pump' then 'balance near upright' on the constant-torque seed: the baseline's structure."""
    from workers.ast_ops import Motif, OpContext, insert_motif

    domain = get_domain("control", env="Pendulum-v1", search_seeds=6, tune_trials=1, tune_batch=1, linear_trials=1,
                        secrets=FIXED)
    motifs = {name: Motif(name, template, params) for name, template, params in domain.motifs()}
    code = domain.seed_program
    for name in ("energy pump", "balance near upright"):
        code = insert_motif(code, OpContext("act", np.random.default_rng(0), motifs=(motifs[name],)))
        assert code is not None, name
    seed = domain.evaluate(in_process(domain.seed_program), read_params(domain.seed_program), "search")
    swing = domain.evaluate(in_process(code), read_params(code), "search")  # one trial: the written defaults
    assert seed.score < -900 and swing.score > -400, (seed.score, swing.score)


def test_the_report_says_when_the_search_and_the_linear_baseline_had_different_budgets():
    """`--max-evals 10` on a shipped config leaves linear_trials at 300: the table's notes say so."""
    from evaluators.domains.control.report import _notes

    domain = get_domain("control", env="Pendulum-v1", secrets=FIXED, **dict(SHORT, linear_trials=300))
    results = {"evolved best": None}
    differ = " ".join(_notes(domain.config, results, {"trials": {"count": 10}}))
    assert "Their budgets differ: the search evaluated 10 programs, the linear baseline had 300 CMA-ES trials" in differ
    same = " ".join(_notes(domain.config, results, {"trials": {"count": 290}}))  # ended on its wall time: close
    assert "budgets differ" not in same and "the best of 290 programs" in same
