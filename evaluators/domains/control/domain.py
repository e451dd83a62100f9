"""Control (gymnasium): evolve `act(obs, params)` for LunarLander-v3, Pendulum-v1 or MountainCarContinuous-v0.

The trusted side steps every episode (each seed of each tuning trial) in
lockstep: one policy round trip per time step carries the observations of every
live episode, and finished episodes drop out. The candidate's process only ever
sees observation rows and parameter values; environments, seeds, rewards and
scoring stay here. Actions are validated (shape, finite, a valid discrete
action) and continuous ones clipped into the action space.

A program's PARAMS are tuned by optuna on the search seeds (the same budget for
evolved programs and baselines), all trials of a round stepped together as extra
rows. The linear baseline, recognised by its parameter names, is tuned by
CMA-ES with its own budget (`linear_trials`, meant to equal the run's
`max_evals`). Score: mean return; the held-out split re-tunes on the search
seeds and measures on held-out seeds only; the validation split tunes and
scores on seeds of its own, like the search split. Every split's reset seeds
and the samplers' seeds derive from the run's secrets (`evaluators.secrets`).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal

import gymnasium as gym
import numpy as np
import optuna
from pydantic import BaseModel, ConfigDict, Field

from evaluators.domains.control import programs as progs
from evaluators._base import CandidateError, Domain, Outcome, PolicyFn, check_split
from evaluators.domains.control.report import heldout_table
from evaluators.params import ParamSpec
from evaluators.tuning import EliteSampler, distributions, new_study, sobol_sampler
from store.records import EvalResult, Status


ENV_IDS = ("LunarLander-v3", "Pendulum-v1", "MountainCarContinuous-v0")
SOLVED = {"LunarLander-v3": 200.0, "Pendulum-v1": -150.0, "MountainCarContinuous-v0": 90.0}
LINEAR_BOUND = {"LunarLander-v3": 3.0, "Pendulum-v1": 10.0, "MountainCarContinuous-v0": 50.0}  # obs scales differ
CRASH_REWARD = {"LunarLander-v3": -100.0}  # the reward of LunarLander's game-over step


class ControlConfig(BaseModel):
    """Options of the control domain (the `[domain.options]` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: Literal[ENV_IDS] = Field("LunarLander-v3", description="Pinned gymnasium environment id.")
    search_seeds: int = Field(20, ge=1, le=1000, description="Episodes of the search split (reset seeds drawn from the run's search secret); PARAMS are tuned on them.")
    validation_seeds: int = Field(10, ge=1, le=1000, description="Episodes of the validation split (reset seeds from the validation secret), tuned on and scored like the search split.")
    heldout_seeds: int = Field(100, ge=1, le=10_000, description="Episodes of the held-out measurement (reset seeds from the held-out secret).")
    max_steps: int | None = Field(None, ge=1, le=100_000, description="Episode step limit (truncation); None keeps the environment's registered limit.")
    tune_trials: int = Field(12, ge=1, le=10_000, description="Optuna trials per evaluation; the first is the program's PARAMS defaults.")
    tune_batch: int = Field(6, ge=1, le=1000, description="Trials asked at once and stepped together (one round).")
    linear_trials: int = Field(240, ge=1, le=100_000, description="CMA-ES trials of the linear baseline: set it to the run's run.max_evals (the search's budget).")
    linear_bound: float | None = Field(None, gt=0, le=1000, description="Weights and biases of the linear baseline range over [-bound, bound]; None: the environment's default (LINEAR_BOUND).")



@dataclass(frozen=True)
class EnvSpec:
    """What the trusted side needs to know of an environment's spaces."""

    env_id: str
    obs_dim: int
    discrete: bool
    actions: int  # discrete: number of actions; continuous: action dimensions
    low: np.ndarray | None
    high: np.ndarray | None
    max_steps: int

    @classmethod
    def make(cls, env_id: str, max_steps: int | None) -> "EnvSpec":
        env = gym.make(env_id)
        space, limit = env.action_space, max_steps or env.spec.max_episode_steps
        obs_dim = env.observation_space.shape[0]
        env.close()
        if isinstance(space, gym.spaces.Discrete):
            return cls(env_id, obs_dim, True, int(space.n), None, None, limit)
        return cls(env_id, obs_dim, False, space.shape[0], space.low.astype(float), space.high.astype(float), limit)


@dataclass
class Episodes:
    """Per-episode results of one lockstep run (rows = trials x seeds)."""

    returns: np.ndarray
    lengths: np.ndarray
    crashed: np.ndarray  # terminated by a game-over (LunarLander's -100)
    timed_out: np.ndarray  # truncated by the step limit
    action_sums: np.ndarray  # (rows, k): discrete, steps per action; continuous, sum of each dimension
    action_abs: np.ndarray  # (rows,): sum over steps of the mean |action| (continuous), else 0

    def rows(self, index) -> "Episodes":
        return Episodes(*(getattr(self, f)[index] for f in self.__dataclass_fields__))


def check_actions(reply, rows: int, spec: EnvSpec, step: int) -> np.ndarray:
    """The reply as valid actions: (rows,) ints or (rows, dims) floats, else a CandidateError."""
    try:
        acts = reply if isinstance(reply, np.ndarray) else np.asarray(reply, dtype=float)
    except (ValueError, TypeError):
        _reject(step, "the reply is not an array of numbers")
    if acts.dtype.kind not in "biuf":
        _reject(step, f"actions must be numbers, got dtype {acts.dtype}")
    if acts.shape in ((), (1,)):
        acts = np.broadcast_to(acts.reshape(()), (rows,))
    want = (rows,) if spec.discrete or spec.actions == 1 else (rows, spec.actions)
    if acts.shape == (rows, 1) and want == (rows,):
        acts = acts[:, 0]
    if acts.shape != want:
        _reject(step, f"actions have shape {acts.shape}; expected {want}, one action per row of obs")
    values = acts.astype(float)
    if not np.isfinite(values).all():
        _reject(step, f"{int((~np.isfinite(values)).sum())} of {rows} actions are not finite")
    if spec.discrete:
        bad = (values != np.rint(values)) | (values < 0) | (values >= spec.actions)
        if bad.any():
            _reject(step, f"action {values[bad][0]:g} is not one of the discrete actions 0..{spec.actions - 1}")
        return values.astype(np.int64)
    return np.clip(values.reshape(rows, spec.actions), spec.low, spec.high).astype(np.float32)


def _reject(step: int, reason: str):
    raise CandidateError(Status.INVALID, f"step {step}: {reason}")


class Lockstep:
    """Steps many episodes of one environment together, one policy round trip per time step."""

    def __init__(self, spec: EnvSpec):
        self.spec = spec
        self._envs: list[gym.Env] = []

    def _pool(self, n: int) -> list[gym.Env]:
        while len(self._envs) < n:
            self._envs.append(gym.make(self.spec.env_id, max_episode_steps=self.spec.max_steps,
                                       disable_env_checker=True))
        return self._envs[:n]

    def run(self, policy: PolicyFn, seeds, params: dict[str, np.ndarray]) -> Episodes:
        spec, n = self.spec, len(seeds)
        envs = self._pool(n)
        obs = np.stack([env.reset(seed=int(s))[0] for env, s in zip(envs, seeds)]).astype(np.float32)
        k = spec.actions
        out = Episodes(np.zeros(n), np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n, bool),
                       np.zeros((n, k)), np.zeros(n))
        crash = CRASH_REWARD.get(spec.env_id)
        alive, step = np.arange(n), 0
        while alive.size:
            reply = policy([(obs[alive], {name: v[alive] for name, v in params.items()})])[0]
            acts = check_actions(reply, alive.size, spec, step)
            still = []
            for j, i in enumerate(alive):
                o, r, term, trunc, _ = envs[i].step(int(acts[j]) if spec.discrete else acts[j])
                out.returns[i] += r
                out.lengths[i] += 1
                self._count_action(out, i, acts[j])
                if term or trunc:
                    out.crashed[i] = bool(term and crash is not None and r == crash)
                    out.timed_out[i] = bool(trunc and not term)
                else:
                    obs[i] = o
                    still.append(i)
            alive, step = np.asarray(still, dtype=np.int64), step + 1
        return out

    def _count_action(self, out: Episodes, i: int, act) -> None:
        if self.spec.discrete:
            out.action_sums[i, act] += 1
        else:
            out.action_sums[i] += act
            out.action_abs[i] += float(np.abs(act).mean())


@dataclass
class Tuned:
    """The best trial: its parameter values, its episodes, and how many trials were run."""

    values: dict[str, float]
    episodes: Episodes
    trials: int


class Tuner:
    """Tunes PARAMS on the search seeds: Sobol then elite local search, or CMA-ES for the linear baseline."""

    def __init__(self, config: ControlConfig, runner: Lockstep):
        self.config, self.runner = config, runner
        spec = runner.spec
        self.linear = set(progs.linear_names(spec.obs_dim, spec.actions, spec.discrete))

    def tune(self, policy: PolicyFn, params: dict[str, ParamSpec], seeds, sampler_seed: int) -> Tuned:
        """Tune on the episodes of reset `seeds`; `sampler_seed` seeds the samplers (from the run's secret)."""
        if not params:
            return Tuned({}, self.runner.run(policy, seeds, {}), 1)
        if set(params) == self.linear:
            return self._cma(policy, params, seeds, sampler_seed)
        cfg = self.config
        study = new_study(params, sobol_sampler(sampler_seed))
        best = None
        for start in range(0, cfg.tune_trials, cfg.tune_batch):
            best = self._round(policy, params, seeds, study, min(cfg.tune_batch, cfg.tune_trials - start), best)
            study.sampler = EliteSampler(seed=sampler_seed)
        return Tuned(best.values, best.episodes, cfg.tune_trials)

    def _cma(self, policy, params, seeds, sampler_seed: int) -> Tuned:
        """CMA-ES on the linear weights: the defaults first (so it knows the space), then generations."""
        cfg = self.config
        popsize = 4 + int(3 * math.log(len(params)))
        sampler = optuna.samplers.CmaEsSampler(seed=sampler_seed, popsize=popsize, warn_independent_sampling=False)
        study = new_study(params, sampler)
        best, done = self._round(policy, params, seeds, study, 1, None), 1
        while done < cfg.linear_trials:
            n = min(popsize, cfg.linear_trials - done)
            best, done = self._round(policy, params, seeds, study, n, best), done + n
        return Tuned(best.values, best.episodes, cfg.linear_trials)

    def _round(self, policy, params, seeds, study, n: int, best: Tuned | None) -> Tuned:
        dists = distributions(params)
        trials = [study.ask(dists) for _ in range(n)]
        reps = len(seeds)
        values = {name: np.repeat([t.params[name] for t in trials], reps).astype(float) for name in params}
        episodes = self.runner.run(policy, np.tile(seeds, n), values)
        for k, trial in enumerate(trials):
            rows = slice(k * reps, (k + 1) * reps)
            mean = float(episodes.returns[rows].mean())
            study.tell(trial, -mean)
            if best is None or mean > best.episodes.returns.mean():
                best = Tuned(dict(trial.params), episodes.rows(rows), 0)
        return best


_PROGRAMS = {  # env -> (seed program, simple rule name and text, motifs, built-in heuristic or None)
    "LunarLander-v3": (progs.LANDER_SEED, ("simple rule", progs.LANDER_RULE), progs.LANDER_MOTIFS,
                       progs.LANDER_HEURISTIC),
    "Pendulum-v1": (progs.PENDULUM_SEED, ("energy swing-up", progs.PENDULUM_RULE), progs.PENDULUM_MOTIFS, None),
    "MountainCarContinuous-v0": (progs.MOUNTAINCAR_SEED, ("bang-bang on velocity", progs.MOUNTAINCAR_RULE),
                                 progs.MOUNTAINCAR_MOTIFS, None),
}


class Control(Domain):
    """Gymnasium control: mean return of `act(obs, params)` over seeded episodes."""

    name = "control"
    entry_point = "act"
    config_model = ControlConfig
    descriptor_names = ("episode length share", "action use")

    def __init__(self, config: ControlConfig):
        self.config = config
        self.spec = EnvSpec.make(config.env, config.max_steps)
        self.runner = Lockstep(self.spec)
        self.tuner = Tuner(config, self.runner)
        self.linear_bound = config.linear_bound or LINEAR_BOUND[config.env]

    @property
    def seed_program(self) -> str:
        return _PROGRAMS[self.config.env][0]

    def baselines(self) -> dict[str, str]:
        spec = self.spec
        _, (rule_name, rule), _, heuristic = _PROGRAMS[spec.env_id]
        bounds = () if spec.discrete else (float(spec.low.min()), float(spec.high.max()))
        out = {"random": progs.random_program(spec.discrete, spec.actions, *bounds)}
        if heuristic:
            out["gymnasium heuristic"] = heuristic
        out[rule_name] = rule
        out["seed program"] = self.seed_program  # the weak start, for the climb's size
        out["linear (CMA-ES)"] = progs.linear_program(spec.obs_dim, spec.actions, spec.discrete,
                                                      self.linear_bound)
        return out

    def motifs(self) -> list[tuple[str, str, tuple]]:
        return list(_PROGRAMS[self.config.env][2])

    def sandbox_hide(self) -> tuple[str, ...]:
        """gymnasium and Box2D: a candidate with its own exact simulator could find the episode's
        seed from the first observation and plan on a private copy; policies need neither."""
        import Box2D

        return tuple(os.path.dirname(m.__file__) for m in (gym, Box2D))

    def seeds(self, split: str) -> np.ndarray:
        """The reset seeds of `split`: distinct draws below 2**31 from the run's secret of that split.

        The same for every program of a run (common random numbers); unknown to the
        candidate, which could otherwise recognise an episode by its first observation.
        """
        count = {"search": self.config.search_seeds, "validation": self.config.validation_seeds,
                 "heldout": self.config.heldout_seeds}[check_split(split)]
        rng, seeds = self.secrets.generator(split, "reset"), []
        while len(seeds) < count:
            seeds = list(dict.fromkeys(seeds + [int(s) for s in rng.integers(0, 2 ** 31, size=count - len(seeds))]))
        return np.asarray(seeds, dtype=np.int64)

    def evaluate(self, policy: PolicyFn, params: dict[str, ParamSpec], split: str) -> Outcome:
        if check_split(split) == "heldout" and not params:  # nothing to tune: measure only
            episodes = self.runner.run(policy, self.seeds("heldout"), {})
            return self._outcome(episodes, Tuned({}, episodes, 1), params)
        tune_on = "validation" if split == "validation" else "search"  # held-out re-tunes on the search seeds
        tuned = self.tuner.tune(policy, params, self.seeds(tune_on), self.secrets.seed(tune_on, "tuner", bits=32))
        episodes = tuned.episodes
        if split == "heldout":
            seeds = self.seeds("heldout")
            fixed = {name: np.full(len(seeds), float(v)) for name, v in tuned.values.items()}
            episodes = self.runner.run(policy, seeds, fixed)
        return self._outcome(episodes, tuned, params)

    def _outcome(self, ep: Episodes, tuned: Tuned, params: dict[str, ParamSpec]) -> Outcome:
        spec, threshold = self.spec, SOLVED[self.spec.env_id]
        steps = max(int(ep.lengths.sum()), 1)
        n = len(ep.returns)
        metrics = {"env": spec.env_id, "mean_return": float(ep.returns.mean()),
                   "se": float(ep.returns.std(ddof=1) / math.sqrt(n)) if n > 1 else None,
                   "min_return": float(ep.returns.min()), "max_return": float(ep.returns.max()),
                   "solved_threshold": threshold, "solved_share": float((ep.returns >= threshold).mean()),
                   "crashes": int(ep.crashed.sum()), "timeouts": int(ep.timed_out.sum()), "episodes": n,
                   "mean_length": float(ep.lengths.mean()), "tune_trials": tuned.trials,
                   "params": {k: float(v) for k, v in tuned.values.items()},
                   "returns": [float(r) for r in ep.returns]}
        if spec.discrete:
            share = ep.action_sums.sum(axis=0) / steps
            metrics["action_share"] = [float(s) for s in share]
            action_descriptor = float(share[min(2, spec.actions - 1)])  # LunarLander: the main engine
        else:
            metrics["action_mean"] = [float(m) for m in ep.action_sums.sum(axis=0) / steps]
            metrics["action_abs_mean"] = float(ep.action_abs.sum() / steps)
            action_descriptor = metrics["action_abs_mean"] / float(np.abs(spec.high).max())
        clipped = {k: float(np.clip(v, params[k].low, params[k].high)) for k, v in tuned.values.items()}
        return Outcome(score=float(ep.returns.mean()), metrics=metrics,
                       instance_scores=tuple(float(r) for r in ep.returns),
                       descriptors=(float(ep.lengths.mean() / spec.max_steps), action_descriptor),
                       tuned_params=clipped)

    def reference(self, split: str) -> dict:
        return {"env": self.spec.env_id, "solved_threshold": SOLVED[self.spec.env_id],
                "episodes": len(self.seeds(split)), "max_steps": self.spec.max_steps,
                "linear_bound": self.linear_bound}

    def heldout_table(self, results: dict[str, EvalResult], reference: dict):
        return heldout_table(self.config, results, reference)

    # -- for LLM prompts ----------------------------------------------------------------------

    def description(self) -> str:
        spec = self.spec
        actions = (f"one of {spec.actions} discrete actions" if spec.discrete else
                   f"{spec.actions} continuous action(s) in [{float(spec.low.min()):g}, {float(spec.high.max()):g}]")
        return (f"Control of gymnasium's {spec.env_id}: the policy maps each observation ({spec.obs_dim} numbers) "
                f"to {actions}. The score is the mean episode return over the search seeds (higher is better; "
                f"{SOLVED[spec.env_id]:g} counts as solved). PARAMS are tuned on the search seeds.")

    def contract(self) -> str:
        kind = "an integer action per row" if self.spec.discrete else "a float per row (or a (rows, act_dim) array)"
        return (f"Define act(obs, params): obs is a float32 array (rows, {self.spec.obs_dim}), one row per live "
                f"episode; params[name] is a (rows,) array per PARAMS entry. Return {kind}; continuous actions "
                "are clipped into the action space. Use numpy only; keep no state between calls.")
