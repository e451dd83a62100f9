"""Control (gymnasium): evolve `act(obs, params)` for LunarLander-v3, Pendulum-v1, MountainCarContinuous-v0
or any other registered environment with a flat Box observation and a Box or Discrete action space.

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
`max_evals`). Score: mean return of the tuned values, measured once on as many
fresh search episodes that no tuning round showed. The rounds replay the same
episodes to the candidate's process, which lives through them all: a program
could recognise an episode by its first observation and replay, in a later
round, the best actions it met there, so no score comes from a tuning episode
(a program without PARAMS plays the fresh episodes only). The held-out split
re-tunes on the search seeds and measures on held-out seeds only; the
validation split tunes and measures on seeds of its own, like the search split.
Every split's reset seeds (no seed in two sets) and the samplers' seeds derive
from the run's secrets (`evaluators.secrets`).
"""
from __future__ import annotations

import math
import os

import gymnasium as gym
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from evaluators.domains.control import programs as progs
from evaluators._base import Domain, Outcome, PolicyFn, check_split
from evaluators.domains.control.report import heldout_table
from evaluators.domains.control.simulation import EnvSpec, Episodes, Lockstep, Tuned, Tuner, registered
from evaluators.params import ParamSpec
from evaluators.userdata import hidden
from store.records import EvalResult


SPLITS = ("search", "validation", "heldout")  # each split's episodes avoid the earlier ones'
ENV_IDS = ("LunarLander-v3", "Pendulum-v1", "MountainCarContinuous-v0")
SOLVED = {"LunarLander-v3": 200.0, "Pendulum-v1": -150.0, "MountainCarContinuous-v0": 90.0}
LINEAR_BOUND = {"LunarLander-v3": 3.0, "Pendulum-v1": 10.0, "MountainCarContinuous-v0": 50.0}  # obs scales differ


class ControlConfig(BaseModel):
    """Options of the control domain (the `[domain.options]` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str = Field("LunarLander-v3", min_length=1, description="A registered gymnasium environment id, pinned with its version: LunarLander-v3, Pendulum-v1 and MountainCarContinuous-v0 come with seed programs, baselines and motifs; any other with a flat Box observation and a Box or Discrete action space (CartPole-v1, Acrobot-v1, an installed package's own as 'package.module:Name-v0') starts from a generic seed program.")
    search_seeds: int = Field(20, ge=1, le=1000, description="Episodes of the search split (reset seeds drawn from the run's search secret): PARAMS are tuned on them and the tuned values scored on as many fresh ones.")
    validation_seeds: int = Field(10, ge=1, le=1000, description="Episodes of the validation split (reset seeds from the validation secret), tuned on, and as many fresh ones scored, like the search split.")
    heldout_seeds: int = Field(100, ge=1, le=10_000, description="Episodes of the held-out measurement (reset seeds from the held-out secret).")
    max_steps: int | None = Field(None, ge=1, le=100_000, description="Episode step limit (truncation); None keeps the environment's registered limit.")
    tune_trials: int = Field(12, ge=1, le=10_000, description="Optuna trials per evaluation; the first is the program's PARAMS defaults.")
    tune_batch: int = Field(6, ge=1, le=1000, description="Trials asked at once and stepped together (one round).")
    linear_trials: int = Field(240, ge=1, le=100_000, description="CMA-ES trials of the linear baseline: set it to the run's run.max_evals (the search's budget).")
    linear_bound: float | None = Field(None, gt=0, le=1000, description="Weights and biases of the linear baseline range over [-bound, bound]; None: the environment's default (LINEAR_BOUND, else 3).")

    @field_validator("env")
    @classmethod
    def _env_supported(cls, env: str) -> str:
        EnvSpec.make(env, max_steps=1)  # one clear line for an id or a space this domain cannot use
        return env

    @model_validator(mode="after")
    def _env_has_a_step_limit(self):
        EnvSpec.make(self.env, self.max_steps)
        return self



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
        self.linear_bound = config.linear_bound or LINEAR_BOUND.get(config.env, 3.0)
        self.threshold = SOLVED.get(config.env, registered(config.env).reward_threshold)

    @property
    def seed_program(self) -> str:
        if self.config.env in _PROGRAMS:
            return _PROGRAMS[self.config.env][0]
        spec = self.spec
        bounds = () if spec.discrete else (float(spec.low.min()), float(spec.high.max()))
        return progs.generic_seed(spec.obs_dim, spec.actions, spec.discrete, *bounds)

    def baselines(self) -> dict[str, str]:
        spec = self.spec
        _, rule, _, heuristic = _PROGRAMS.get(spec.env_id, (None, None, None, None))
        bounds = () if spec.discrete else (float(spec.low.min()), float(spec.high.max()))
        out = {"random": progs.random_program(spec.discrete, spec.actions, *bounds)}
        if heuristic:
            out["gymnasium heuristic"] = heuristic
        if rule:
            out[rule[0]] = rule[1]
        out["seed program"] = self.seed_program  # the weak start, for the climb's size
        out["linear (CMA-ES)"] = progs.linear_program(spec.obs_dim, spec.actions, spec.discrete,
                                                      self.linear_bound)
        return out

    def tunes_params(self) -> bool:
        return self.config.tune_trials > 1  # the first trial is the written defaults

    def motifs(self) -> list[tuple[str, str, tuple]]:
        return list(_PROGRAMS[self.config.env][2]) if self.config.env in _PROGRAMS else []

    def sandbox_hide(self) -> tuple[str, ...]:
        """gymnasium and Box2D: a candidate with its own exact simulator could find the episode's
        seed from the first observation and plan on a private copy; policies need neither."""
        import Box2D

        own = self.spec.entry_folder()  # an installed package's environment: hidden like gymnasium
        return tuple(os.path.dirname(m.__file__) for m in (gym, Box2D)) + (hidden(own) if own else ())

    def seeds(self, split: str) -> np.ndarray:
        """The reset seeds PARAMS are tuned on in `split` (held-out: the episodes it is measured on).

        The same for every program of a run (common random numbers); unknown to the
        candidate, which could otherwise recognise an episode by its first observation.
        """
        return self._episode_sets(check_split(split))[0]

    def measure_seeds(self, split: str) -> np.ndarray:
        """The episodes a score of `split` is measured on: on search and validation as many fresh ones
        as the tuning episodes, which no tuning round showed the program; on held-out its own."""
        return self._episode_sets(check_split(split))[-1]

    def _episode_sets(self, split: str) -> list[np.ndarray]:
        """`split`'s reset seeds, distinct draws below 2**31 from the run's secret of that split: the
        tuning episodes then the measured ones (held-out: one set, measured). No seed is in two sets,
        nor in an earlier split's (search, validation, held-out), so no score reuses an episode."""
        taken: set[int] = set()
        for earlier in SPLITS[:SPLITS.index(split)]:
            taken.update(int(s) for sets in self._episode_sets(earlier) for s in sets)
        count = {"search": self.config.search_seeds, "validation": self.config.validation_seeds,
                 "heldout": self.config.heldout_seeds}[split]
        keys = [("reset",)] if split == "heldout" else [("reset",), ("reset", "measure")]
        sets = []
        for key in keys:
            sets.append(self._draw(self.secrets.generator(split, *key), count, taken))
            taken.update(sets[-1].tolist())
        return sets

    @staticmethod
    def _draw(rng: np.random.Generator, count: int, taken: set[int]) -> np.ndarray:
        seeds: list[int] = []
        while len(seeds) < count:
            drawn = (int(s) for s in rng.integers(0, 2 ** 31, size=count - len(seeds)))
            seeds = list(dict.fromkeys(seeds + [s for s in drawn if s not in taken]))
        return np.asarray(seeds, dtype=np.int64)

    def evaluate(self, policy: PolicyFn, params: dict[str, ParamSpec], split: str) -> Outcome:
        """Tune PARAMS on the split's tuning episodes (held-out: the search ones), then measure the tuned
        values, in one pass, on episodes that no tuning round showed (`measure_seeds`): the rounds
        replay the same episodes to the same process, so a program that remembered round one's
        episodes could play every later round with hindsight. Only the measured episodes count."""
        if params:
            tune_on = "validation" if check_split(split) == "validation" else "search"
            tuned = self.tuner.tune(policy, params, self.seeds(tune_on), self.secrets.seed(tune_on, "tuner", bits=32))
        else:
            tuned = Tuned({}, None, 1)
        seeds = self.measure_seeds(split)
        fixed = {name: np.full(len(seeds), float(v)) for name, v in tuned.values.items()}
        return self._outcome(self.runner.run(policy, seeds, fixed), tuned, params)

    def _outcome(self, ep: Episodes, tuned: Tuned, params: dict[str, ParamSpec]) -> Outcome:
        spec, threshold = self.spec, self.threshold
        steps = max(int(ep.lengths.sum()), 1)
        n = len(ep.returns)
        metrics = {"env": spec.env_id, "mean_return": float(ep.returns.mean()),
                   "se": float(ep.returns.std(ddof=1) / math.sqrt(n)) if n > 1 else None,
                   "min_return": float(ep.returns.min()), "max_return": float(ep.returns.max()),
                   "solved_threshold": threshold,
                   "solved_share": None if threshold is None else float((ep.returns >= threshold).mean()),
                   "crashes": int(ep.crashed.sum()), "timeouts": int(ep.timed_out.sum()), "episodes": n,
                   "mean_length": float(ep.lengths.mean()), "tune_trials": tuned.trials,
                   "tune_out_of_range": tuned.out_of_range,
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
        return {"env": self.spec.env_id, "solved_threshold": self.threshold,
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
                "to " + actions + ". The score is the mean episode return over fresh search episodes (higher is better"
                + ("" if self.threshold is None else f"; {self.threshold:g} counts as solved")
                + "). PARAMS are tuned on other search episodes, which never count for the score.")

    def contract(self) -> str:
        kind = "an integer action per row" if self.spec.discrete else "a float per row (or a (rows, act_dim) array)"
        return (f"Define act(obs, params): obs is a float32 array (rows, {self.spec.obs_dim}), one row per live "
                f"episode; params[name] is a (rows,) array per PARAMS entry. Return {kind}; continuous actions "
                "are clipped into the action space. Use numpy only; keep no state between calls.")
