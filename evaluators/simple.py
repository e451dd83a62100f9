"""The shorter form of a domain: programs, instances and a simulator; Atoll does the rest.

A subclass of `SimpleDomain` gives

- `name`, `entry_point`, `seed_program` and `baseline_programs` (program texts),
- `instances(split, rng)`: the instances of one split, drawn from `rng` only, and
- `simulate(instances, policy)`: play every instance to its end and return one
  score per instance (higher is better), calling `policy(states)` with one state
  per instance (a dict of numbers and arrays; `None` for one that has ended) and
  getting one action per instance back,

and inherits everything else a domain needs: PARAMS tuning, per-instance
feedback, behaviour descriptors, the held-out table, and the integrity rules.

Integrity: `rng` derives from the run's secret for that split (`Domain.secrets`),
so a candidate cannot rebuild the data it is scored on; held-out instances are
built only inside held-out evaluations, in the trusted process. The policy is
only ever the sandboxed `PolicyFn`: the candidate sees the states the simulator
builds, never an instance, and each action is checked (numeric, finite, and the
declared shape and bounds) before the simulator sees it. Anything wrong with an
action is INVALID; raise `InvalidAction` from `simulate` for a domain rule.
Every `simulate()` call is answered by a process of the program that has seen no
earlier call (`_base.renew`): the tuning rounds replay the same search instances,
the validation and held-out paths tune on them before their own instances are
played, a raced evaluation plays its instances in chunks, and a user's splits may
share instances; a program that remembered one call in the next could score what
its play does not earn (an instance recognised by its first state, and its future
replayed), and a raced score could differ from an unraced one.

Scoring: on the search split a program's PARAMS are tuned on the search
instances (the written defaults first, then a Sobol design, then refinement
around the best, `evaluators.tuning`), and its score is the best trial's mean.
On any other split the parameters are tuned the same way on the search
instances, then measured once on that split's instances.
"""
from __future__ import annotations

import abc
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evaluators import _base, tuning
from evaluators._base import CandidateError, Domain, Outcome, PolicyFn, check_split
from evaluators.params import ParamSpec
from evaluators.simple_report import heldout_table, instance_metrics
from evaluators.tuning import EliteSampler, distributions, new_study, sobol_sampler
from store.records import EvalResult, Status

# policy(states) -> actions, one per state; the simulator's view of the candidate.
Policy = Callable[[Sequence[dict | None]], list[Any]]


class InvalidAction(CandidateError):
    """Raised by a simulator for an action its domain forbids; the program is INVALID."""

    def __init__(self, reason: str):
        super().__init__(Status.INVALID, reason)


class SimpleOptions(BaseModel):
    """Options every simple domain has; subclass it to add the domain's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tune_trials: int = Field(24, ge=1, le=10_000, description="PARAMS trials per evaluation, on the search "
                                                              "instances; the first is the program's written defaults.")
    tune_batch: int = Field(8, ge=1, le=1_000, description="Trials simulated together in one call of simulate().")


class _Actions:
    """The sandboxed policy as the simulator sees it: one state per job, params attached, actions checked."""

    def __init__(self, policy: PolicyFn, domain: "SimpleDomain", params: list[dict], labels: list[str],
                 tolerant: bool = False):
        """`tolerant` (a tuning round): an action that is not finite or outside the bounds marks its
        job in `out_of_range` (`evaluators.tuning.OutOfRange`) and reaches the simulator clipped
        into range, instead of failing the program."""
        self.policy, self.domain, self.params, self.labels = policy, domain, params, labels
        n = len(params)
        self.sums, self.squares, self.counts = np.zeros(n), np.zeros(n), np.zeros(n)
        self.failure: CandidateError | None = None
        self.tolerant = tolerant
        self.out_of_range = tuning.OutOfRange(n)
        self.step = 0

    def __call__(self, states: Sequence[dict | None]) -> list[Any]:
        if len(states) != len(self.params):
            raise ValueError(f"{type(self.domain).__name__}.simulate passed {len(states)} states to the policy; "
                             f"expected one per instance ({len(self.params)}), None for one that has ended")
        live = [i for i, state in enumerate(states) if state is not None]
        for i in live:
            if not isinstance(states[i], dict):
                raise TypeError(f"a state must be a dict of numbers and arrays, got {type(states[i]).__name__}")
        self.step += 1
        if not live:
            return [None] * len(states)
        try:
            replies = self.policy([(states[i], self.params[i]) for i in live])
            out: list[Any] = [None] * len(states)
            for i, reply in zip(live, replies):
                out[i] = self._checked(i, reply)
        except CandidateError as exc:
            self.failure = self.failure or exc  # kept: a simulator's own except clause cannot hide it
            raise
        return out

    def _checked(self, job: int, reply) -> Any:
        where = f"instance {self.labels[job]}, step {self.step}"
        try:
            action = np.asarray(reply, dtype=float)
        except (TypeError, ValueError):
            raise InvalidAction(f"{where}: the policy's answer is not a number or an array of numbers") from None
        shape, bounds = self.domain.action_shape, self.domain.action_bounds
        if action.shape == (1,) and shape == ():  # the wire sends a lone number as a one-element array
            action = action.reshape(())
        if shape is not None and action.shape != tuple(shape):
            raise InvalidAction(f"{where}: the action has shape {action.shape}; expected {tuple(shape)}")
        if not np.isfinite(action).all():
            action = self._out_of_range(job, action, f"{where}: the action is not finite "
                                                     f"({action.ravel()[~np.isfinite(action.ravel())][0]})")
        if bounds is not None and action.size and (action.min() < bounds[0] or action.max() > bounds[1]):
            shown = action.ravel()[0] if action.size == 1 else action
            action = self._out_of_range(job, action, f"{where}: the action {shown} is outside "
                                                     f"[{bounds[0]:g}, {bounds[1]:g}]")
        self.sums[job] += action.sum()
        self.squares[job] += np.square(action).sum()
        self.counts[job] += action.size
        return float(action) if action.ndim == 0 else action

    def _out_of_range(self, job: int, action: np.ndarray, reason: str) -> np.ndarray:
        """Fail the program with `reason`; in a tuning round, mark the job and go on with the action in range."""
        if not self.tolerant:
            raise InvalidAction(reason)
        self.out_of_range.mark(job, reason)
        bounds = self.domain.action_bounds
        action = np.nan_to_num(action, nan=0.0, posinf=0.0, neginf=0.0)
        return np.clip(action, *bounds) if bounds is not None else action

    def descriptors(self, jobs: slice) -> tuple[float, float]:
        """Mean and standard deviation of every action of `jobs`."""
        count = max(self.counts[jobs].sum(), 1.0)
        mean = self.sums[jobs].sum() / count
        return float(mean), float(np.sqrt(max(self.squares[jobs].sum() / count - mean * mean, 0.0)))


class SimpleDomain(Domain):
    """A domain from instances and a simulator; see the module's docstring for the contract."""

    config_model: ClassVar[type[SimpleOptions]] = SimpleOptions
    racing = True  # search evaluations without tuning (no PARAMS, or tune_trials = 1) are raced
    baseline_programs: ClassVar[dict[str, str]] = {}
    # (name, template, params) the embedded mutator may wrap around a return expression: the
    # template holds {expr} and {p0}, {p1}... for new PARAMS given as (name, default, low, high).
    mutation_motifs: ClassVar[list[tuple[str, str, tuple]]] = []
    action_shape: ClassVar[tuple[int, ...] | None] = None  # None: any shape
    action_bounds: ClassVar[tuple[float, float] | None] = None  # None: any finite value

    def __init__(self, config: SimpleOptions):
        if not isinstance(config, SimpleOptions):
            raise TypeError(f"{type(self).__name__}.config_model must derive from evaluators.simple.SimpleOptions")
        self.config = config
        self._instances: dict[str, list] = {}

    @property
    @abc.abstractmethod
    def seed_program(self) -> str:
        """The program every island starts from (a class attribute holding its text will do)."""

    @abc.abstractmethod
    def instances(self, split: str, rng: np.random.Generator) -> list:
        """The instances of `split`, drawn from `rng` alone (never from a fixed seed or global state)."""

    @abc.abstractmethod
    def simulate(self, instances: list, policy: Policy) -> Sequence[float]:
        """Play every instance against `policy` to its end; one score per instance, higher is better.

        The same instance may appear several times (once per tuning trial): treat
        instances as read-only. Call `policy` with one state per instance, None
        for those that have ended, and as few times as the simulation allows: each
        call is one round trip to the candidate's process.
        """

    def label(self, instance, index: int) -> str:
        """A short name for instance `index` in reports and feedback."""
        return str(index)

    def baselines(self) -> dict[str, str]:
        return dict(self.baseline_programs)

    def tunes_params(self) -> bool:
        return self.config.tune_trials > 1  # the first trial is the written defaults

    def motifs(self) -> list[tuple[str, str, tuple]]:
        return list(self.mutation_motifs)

    def output_bounds(self) -> tuple[float | None, float | None]:
        return (None, None) if self.action_bounds is None else tuple(self.action_bounds)

    def split_instances(self, split: str) -> list:
        """The instances of `split`, built once from the run's secret for that split."""
        if check_split(split) not in self._instances:
            made = list(self.instances(split, self.secrets.generator(split, "instances")))
            if not made:  # never kept: each later call says the same, not what an empty list breaks
                raise ValueError(f"{type(self).__name__}.instances({split!r}) returned no instances")
            self._instances[split] = made
        return self._instances[split]

    # -- scoring ----------------------------------------------------------------------------

    def evaluate(self, policy: PolicyFn, params: dict[str, ParamSpec], split: str, race=None) -> Outcome:
        """`race`: raced on the search split when no tuning picks among trials (no PARAMS, or one trial)."""
        check_split(split)
        if race is not None and split == "search" and (not params or self.config.tune_trials == 1):
            return self._raced(policy, params, race)
        values, scores, descriptors, trials, out_of_range = {}, None, None, 0, 0
        if params:
            values, scores, descriptors, trials, out_of_range = self._tune(policy, params,
                                                                           self.split_instances("search"))
        if split == "search" and scores is not None:  # the best tuning trial is the search score
            return self._outcome(self.split_instances("search"), scores, descriptors, values, params, trials,
                                 out_of_range)
        instances = self.split_instances(split)
        played, actions = self._play(policy, instances, [values])
        return self._outcome(instances, played[0], actions.descriptors(slice(None)), values, params, trials,
                             out_of_range)

    def _raced(self, policy: PolicyFn, params: dict[str, ParamSpec], race) -> Outcome:
        """The search instances in the race's order (`Race.shuffle`), in chunks (one simulate() call
        each), a look after each chunk; the scores kept in the domain's order."""
        instances, values = self.split_instances("search"), {n: p.default for n, p in params.items()}
        total = len(instances)
        order = race.shuffle(total, self.secrets)
        scores, moments, start = [], np.zeros(3), 0
        while start < total:
            stop = next((k for k in range(start + 1, total) if race.due(k, total)), total)
            played, actions = self._play(policy, [instances[i] for i in order[start:stop]], [values],
                                         indices=order[start:stop])
            scores.extend(played[0])
            moments += (actions.sums.sum(), actions.squares.sum(), actions.counts.sum())
            race.look(scores, total)
            start = stop
        count = max(moments[2], 1.0)
        mean = moments[0] / count
        descriptors = (float(mean), float(np.sqrt(max(moments[1] / count - mean * mean, 0.0))))
        in_order = np.empty(total)
        in_order[order] = scores
        return self._outcome(instances, in_order, descriptors, values, params, int(bool(params)))

    def _play(self, policy: PolicyFn, instances: list, trials: list[dict],
              tolerant: bool = False, indices=None) -> tuple[np.ndarray, _Actions]:
        """Scores of every (trial, instance) pair, shape (trials, instances), from one simulate() call
        answered by a process that remembers no earlier one (`tolerant`: see `_Actions`; `indices`:
        the instances' places in the split, for their labels, when they are a part of it)."""
        _base.renew(policy)
        jobs = [inst for _ in trials for inst in instances]
        indices = range(len(instances)) if indices is None else indices
        labels = [self.label(inst, i) for _ in trials for i, inst in zip(indices, instances)]
        actions = _Actions(policy, self, [dict(t) for t in trials for _ in instances], labels, tolerant)
        try:
            scores = self.simulate(jobs, actions)
        except CandidateError:
            raise
        except Exception:
            if actions.failure is not None:
                raise actions.failure from None
            raise
        if actions.failure is not None:
            raise actions.failure
        return self._checked_scores(scores, len(jobs)).reshape(len(trials), len(instances)), actions

    def _checked_scores(self, scores, n: int) -> np.ndarray:
        try:
            out = np.asarray(scores, dtype=float).reshape(-1)
        except (TypeError, ValueError):
            raise TypeError(f"{type(self).__name__}.simulate must return one number per instance") from None
        if len(out) != n or not np.isfinite(out).all():
            raise ValueError(f"{type(self).__name__}.simulate returned {len(out)} scores for {n} instances"
                             + ("" if len(out) != n else ", not all finite"))
        return out

    def _tune(self, policy: PolicyFn, params: dict[str, ParamSpec], instances: list):
        """(best values, their per-instance scores, their descriptors, trials run, trials that failed out of
        range) on the search instances."""
        cfg, seed = self.config, self.secrets.seed("search", "tuning")
        study = new_study(params, sobol_sampler(seed))
        dists, best, done, first, failed = distributions(params), None, 0, None, 0
        while done < cfg.tune_trials:
            trials = [study.ask(dists) for _ in range(min(cfg.tune_batch, cfg.tune_trials - done))]
            scores, actions = self._play(policy, instances, [t.params for t in trials], tolerant=True)
            first = first or actions.out_of_range.first
            gone = actions.out_of_range.fail_trials(study, trials, len(instances))  # their parameters' fault
            failed += len(gone)
            for k, trial in enumerate(trials):
                if k in gone:
                    continue
                mean = float(scores[k].mean())
                study.tell(trial, -mean)
                if best is None or mean > best[0]:
                    jobs = slice(k * len(instances), (k + 1) * len(instances))
                    best = (mean, dict(trial.params), scores[k], actions.descriptors(jobs))
            if done == 0:
                study.sampler = EliteSampler(seed)
            done += len(trials)
        if best is None:
            raise tuning.OutOfRange.none_kept(first, done)
        return best[1], best[2], best[3], done, failed

    def _outcome(self, instances, scores: np.ndarray, descriptors, values, params, trials,
                 out_of_range: int = 0) -> Outcome:
        labels = [self.label(inst, i) for i, inst in enumerate(instances)]
        tuned = {n: float(np.clip(values.get(n, p.default), p.low, p.high)) for n, p in params.items()}
        metrics = instance_metrics(labels, scores)
        metrics.update(params=tuned, tune_trials=trials, tune_out_of_range=out_of_range,
                       actions={"mean": descriptors[0], "std": descriptors[1]})
        return Outcome(score=float(scores.mean()), metrics=metrics,
                       instance_scores=tuple(float(s) for s in scores),
                       descriptors=tuple(descriptors), tuned_params=tuned)

    # -- reports ----------------------------------------------------------------------------

    def reference(self, split: str) -> dict:
        check_split(split)
        return {"instances": len(self.split_instances(split)), "tune_trials": self.config.tune_trials}

    def heldout_table(self, results: dict[str, EvalResult], reference: dict):
        return heldout_table(self.name, list(self.baseline_programs), results, reference)
