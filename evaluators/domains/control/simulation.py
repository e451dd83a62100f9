"""The control domain's episodes: environments made and checked, every episode of every tuning
trial stepped in lockstep with one policy round trip per step, checked actions, and the tuner
(Sobol then elite search, or CMA-ES for the linear baseline).

Trusted side only: the candidate's process sees observation rows and parameter values through
`PolicyFn`; environments, seeds and rewards stay here.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import optuna

from evaluators import tuning
from evaluators._base import CandidateError, PolicyFn, numeric_reply
from evaluators.domains.control import programs as progs
from evaluators.params import ParamSpec
from evaluators.tuning import EliteSampler, distributions, new_study, sobol_sampler
from store.records import Status

if TYPE_CHECKING:
    from evaluators.domains.control.domain import ControlConfig

CRASH_REWARD = {"LunarLander-v3": -100.0}  # the reward of LunarLander's game-over step


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
    def make(cls, env_id: str, max_steps: int | None) -> EnvSpec:
        """The spaces of `env_id`; a ValueError of one line if it is not registered or not supported."""
        env = _make(env_id)
        space, obs, limit = env.action_space, env.observation_space, max_steps or env.spec.max_episode_steps
        env.close()
        if not (isinstance(obs, gym.spaces.Box) and len(obs.shape) == 1):
            raise ValueError(f"env {env_id!r} observes {obs}; the control domain needs a flat Box observation "
                             "(one vector of numbers)")
        if not limit:
            raise ValueError(f"env {env_id!r} has no registered step limit; set max_steps")
        if isinstance(space, gym.spaces.Discrete) and int(space.start) == 0:
            return cls(env_id, obs.shape[0], True, int(space.n), None, None, limit)
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1 and np.isfinite(space.low).all() \
                and np.isfinite(space.high).all():
            return cls(env_id, obs.shape[0], False, space.shape[0], space.low.astype(float),
                       space.high.astype(float), limit)
        raise ValueError(f"env {env_id!r} has the action space {space}; the control domain supports Discrete "
                         "(starting at 0) and a flat Box with finite bounds")

    def entry_folder(self) -> str | None:
        """The folder of the package that defines the environment, when it is not gymnasium's own."""
        entry = registered(self.env_id).entry_point
        top = (entry if isinstance(entry, str) else getattr(entry, "__module__", "")).split(":")[0].split(".")[0]
        found = importlib.util.find_spec(top) if top and top != "gymnasium" else None
        return list(found.submodule_search_locations)[0] if found and found.submodule_search_locations else None


def _make(env_id: str) -> gym.Env:
    """gym.make, every failure one line: an unknown id, a package it needs that is missing, anything else."""
    try:
        return gym.make(env_id, disable_env_checker=True)
    except gym.error.Error as exc:
        if isinstance(exc, gym.error.DependencyNotInstalled):
            raise ValueError(f"env {env_id!r} needs a package that is not installed: {_first_line(exc)}") from None
        raise ValueError(f"env {env_id!r} is not a registered gymnasium environment ({_first_line(exc)}); e.g. "
                         "CartPole-v1, Acrobot-v1, Pendulum-v1, LunarLander-v3, or 'package.module:Name-v0' for "
                         "one that a package registers") from None
    except ModuleNotFoundError as exc:
        raise ValueError(f"env {env_id!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001  a third-party environment's constructor can raise anything
        raise ValueError(f"env {env_id!r} cannot be made: {type(exc).__name__}: {_first_line(exc)}") from None


def registered(env_id: str) -> gym.envs.registration.EnvSpec:
    """gymnasium's registration of `env_id`; a 'package.module:' prefix (imported by gym.make) is not part of it."""
    return gym.spec(env_id.split(":", 1)[-1])


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass
class Episodes:
    """Per-episode results of one lockstep run (rows = trials x seeds)."""

    returns: np.ndarray
    lengths: np.ndarray
    crashed: np.ndarray  # terminated by a game-over (LunarLander's -100)
    timed_out: np.ndarray  # truncated by the step limit
    action_sums: np.ndarray  # (rows, k): discrete, steps per action; continuous, sum of each dimension
    action_abs: np.ndarray  # (rows,): sum over steps of the mean |action| (continuous), else 0

    def rows(self, index) -> Episodes:
        return Episodes(*(getattr(self, f)[index] for f in self.__dataclass_fields__))


def check_actions(reply, rows: int, spec: EnvSpec, step: int, out_of_range: tuning.OutOfRange | None = None,
                  where: np.ndarray | None = None) -> np.ndarray:
    """The reply as valid actions: (rows,) ints or (rows, dims) floats, else a CandidateError.

    With `out_of_range` (a tuning round, `evaluators.tuning.OutOfRange`), an action that is not
    finite or not one of the discrete actions marks its row there (`where[i]`: row i's index in
    it) and is taken as the nearest valid one, instead of failing the program.
    """
    acts = numeric_reply(reply, "actions", lambda reason: _reject(step, reason), rows)
    want = (rows,) if spec.discrete or spec.actions == 1 else (rows, spec.actions)
    if acts.shape == (rows, 1) and want == (rows,):
        acts = acts[:, 0]
    if acts.shape != want:
        _reject(step, f"actions have shape {acts.shape}; expected {want}, one action per row of obs")
    values = acts.astype(float)
    if not np.isfinite(values).all():
        bad = ~np.isfinite(values)
        _out_of_range(step, f"{int(bad.sum())} of {rows} actions are not finite", bad.reshape(rows, -1).any(axis=1),
                      out_of_range, where)
        values = np.where(bad, 0.0, values)
    if spec.discrete:
        bad = (values != np.rint(values)) | (values < 0) | (values >= spec.actions)
        if bad.any():
            _out_of_range(step, f"action {values[bad][0]:g} is not one of the discrete actions "
                                f"0..{spec.actions - 1}", bad, out_of_range, where)
            values = np.clip(np.rint(values), 0, spec.actions - 1)
        return values.astype(np.int64)
    return np.clip(values.reshape(rows, spec.actions), spec.low, spec.high).astype(np.float32)


def _out_of_range(step: int, reason: str, bad: np.ndarray, out_of_range: tuning.OutOfRange | None, where) -> None:
    if out_of_range is None:
        _reject(step, reason)
    out_of_range.mark(where[bad], f"step {step}: {reason}")


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

    def run(self, policy: PolicyFn, seeds, params: dict[str, np.ndarray],
            out_of_range: tuning.OutOfRange | None = None) -> Episodes:
        """Every episode to its end; with `out_of_range` (a tuning round) an action out of range
        marks its row there instead of failing the program (see `check_actions`)."""
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
            acts = check_actions(reply, alive.size, spec, step, out_of_range, alive)
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
    episodes: Episodes | None  # on the tuning episodes (None: nothing was tuned)
    trials: int
    out_of_range: int = 0  # trials that failed with an action out of range


class Tuner:
    """Tunes PARAMS on the search seeds: Sobol then elite local search, or CMA-ES for the linear baseline."""

    def __init__(self, config: ControlConfig, runner: Lockstep):
        self.config, self.runner = config, runner
        spec = runner.spec
        self.linear = set(progs.linear_names(spec.obs_dim, spec.actions, spec.discrete))

    def tune(self, policy: PolicyFn, params: dict[str, ParamSpec], seeds, sampler_seed: int) -> Tuned:
        """Tune `params` (at least one) on the episodes of reset `seeds`; `sampler_seed` seeds the samplers
        (from the run's secret). The best's episodes are the tuning ones: never a score (see `Control.evaluate`)."""
        if set(params) == self.linear:
            return self._cma(policy, params, seeds, sampler_seed)
        cfg = self.config
        study = new_study(params, sobol_sampler(sampler_seed))
        best = first = None
        failed = 0
        for start in range(0, cfg.tune_trials, cfg.tune_batch):
            best, first, out = self._round(policy, params, seeds, study, min(cfg.tune_batch, cfg.tune_trials - start),
                                           best, first)
            failed += out
            study.sampler = EliteSampler(seed=sampler_seed)
        return self._kept(best, first, cfg.tune_trials, failed)

    def _cma(self, policy, params, seeds, sampler_seed: int) -> Tuned:
        """CMA-ES on the linear weights: the defaults first (so it knows the space), then generations."""
        cfg = self.config
        popsize = 4 + int(3 * math.log(len(params)))
        sampler = optuna.samplers.CmaEsSampler(seed=sampler_seed, popsize=popsize, warn_independent_sampling=False)
        study = new_study(params, sampler)
        best, first, failed = self._round(policy, params, seeds, study, 1, None, None)
        done = 1
        while done < cfg.linear_trials:
            n = min(popsize, cfg.linear_trials - done)
            best, first, out = self._round(policy, params, seeds, study, n, best, first)
            failed, done = failed + out, done + n
        return self._kept(best, first, cfg.linear_trials, failed)

    @staticmethod
    def _kept(best: Tuned | None, first: str | None, trials: int, failed: int) -> Tuned:
        if best is None:  # no trial kept its actions in range: the program's fault
            raise tuning.OutOfRange.none_kept(first, trials)
        return Tuned(best.values, best.episodes, trials, failed)

    def _round(self, policy, params, seeds, study, n: int, best: Tuned | None,
               first: str | None) -> tuple[Tuned | None, str | None, int]:
        """One round of `n` trials; (the best so far, the first reason an action was out of range,
        the round's trials that failed so)."""
        dists = distributions(params)
        trials = [study.ask(dists) for _ in range(n)]
        reps = len(seeds)
        values = {name: np.repeat([t.params[name] for t in trials], reps).astype(float) for name in params}
        out_of_range = tuning.OutOfRange(n * reps)
        episodes = self.runner.run(policy, np.tile(seeds, n), values, out_of_range)
        failed = out_of_range.fail_trials(study, trials, reps)  # their parameters' fault, not the program's
        for k, trial in enumerate(trials):
            rows = slice(k * reps, (k + 1) * reps)
            if k in failed:
                continue
            mean = float(episodes.returns[rows].mean())
            study.tell(trial, -mean)
            if best is None or mean > best.episodes.returns.mean():
                best = Tuned(dict(trial.params), episodes.rows(rows), 0)
        return best, first or out_of_range.first, len(failed)
