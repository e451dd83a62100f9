"""Racing: stop a search evaluation early once its instances show it clearly worse than its parent.

A domain whose search score is a mean over instances scores them in order, in
chunks, and after each chunk calls `Race.look` with the per-instance scores so
far. `Race.look` runs a one-sided paired t-test (`scipy.stats.ttest_rel`,
alternative "less") of the candidate's scores against its parent's scores on the
same instances (common random numbers: every program of a run meets the same
instances and seeds); when the parent has no per-instance scores that match, a
one-sided one-sample t-test against the parent's search score (the bar the child
is measured against). A look rejects at `alpha / looks`, `looks` being the number
of looks the evaluation can take (Bonferroni over the planned looks: the chance
of any wrong stop of a candidate that is not worse stays under `alpha`, whatever
the dependence between looks). No look is taken before `min_instances` instances,
nor after the last one (a full evaluation gains nothing from stopping).

A raced evaluation scores the instances in the race's order (`Race.shuffle`), a
permutation drawn from the run's search secret: the same for every program of the
run, so parent and child stay paired instance by instance, and unknown to the
candidates. Never the domain's own order: a domain may list its instances sorted
(small ones first, by difficulty), and the first few of a sorted list are no fair
sample of the rest, so a child better on average but worse on the small ones would
be stopped wrongly, whatever alpha says.

A stop raises `RaceStopped`; the evaluator stores a RACED result: no score, the
reason, the instances seen and their scores. The parent's scores come from the
driver (trusted side) with the job and never reach the candidate's process.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evaluators._base import CandidateError
from store.records import Status


class RacingConfig(BaseModel):
    """`[evaluator.racing]`: stop search evaluations that are clearly worse than their parent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Race search evaluations of children against their parent's "
                                             "per-instance scores (only domains whose score is a mean over "
                                             "instances take part; others always evaluate in full).")
    alpha: float = Field(0.05, gt=0.0, lt=0.5, description="One-sided level of the whole race: a candidate that is "
                                                         "not worse is stopped with at most this probability "
                                                         "(Bonferroni over the looks).")
    min_instances: int = Field(3, ge=2, le=1000, description="Instances scored before the first look.")
    chunk: int = Field(1, ge=1, le=1000, description="Instances scored between two looks.")
    margin: float = Field(0.0, ge=0.0, description="Stop only when the mean per-instance score is below the "
                                                   "parent's by more than this (score units).")


@dataclass(frozen=True)
class RaceSpec:
    """What a search evaluation races against; built by the driver, read by the evaluator only."""

    config: RacingConfig
    parent_id: str
    parent_scores: tuple[float, ...] = ()  # per instance, in the domain's order; () when unknown
    threshold: float | None = None  # the parent's search score, for a parent without per-instance scores


class RaceStopped(CandidateError):
    """The race stopped the evaluation: a partial result, stored RACED, never a score."""

    def __init__(self, reason: str, seen: tuple[float, ...], total: int, p_value: float, details: dict):
        super().__init__(Status.RACED, reason)
        self.seen, self.total, self.p_value, self.details = seen, total, p_value, details

    def metrics(self) -> dict:
        return {"raced": True, "reason": self.reason, "instances_seen": len(self.seen), "instances": self.total,
                "p_value": self.p_value, "partial_mean": float(np.mean(self.seen)), **self.details}


class Race:
    """One evaluation's race: looks at the per-instance scores after each chunk."""

    def __init__(self, spec: RaceSpec):
        self.spec, self.cfg = spec, spec.config
        self.order: tuple[int, ...] = ()  # the instances' indices in the order scored; (): the domain's own

    def shuffle(self, total: int, secrets) -> list[int]:
        """The order to score `total` instances in: a permutation drawn from the run's search secret,
        the same for every program of the run; `look` then takes the scores in this order."""
        self.order = tuple(int(i) for i in secrets.generator("search", "race order").permutation(total))
        return list(self.order)

    def _seen(self, count: int) -> list[int]:
        """The indices (in the domain's order) of the first `count` instances scored."""
        return list(self.order[:count]) if self.order else list(range(count))

    def looks(self, total: int) -> int:
        """How many looks an evaluation of `total` instances can take (0: it cannot be raced)."""
        if total <= self.cfg.min_instances:
            return 0
        return 1 + (total - 1 - self.cfg.min_instances) // self.cfg.chunk

    def due(self, seen: int, total: int) -> bool:
        """Whether a look is taken after `seen` of `total` instances."""
        return self.cfg.min_instances <= seen < total and (seen - self.cfg.min_instances) % self.cfg.chunk == 0

    def look(self, scores, total: int) -> None:
        """Raise `RaceStopped` when `scores` (the first instances in the race's order) are clearly worse."""
        seen = tuple(float(s) for s in scores)
        if not self.due(len(seen), total):
            return
        level = self.cfg.alpha / self.looks(total)
        p_value, against, details = self._test(seen, total)
        if math.isfinite(p_value) and p_value < level:
            reason = (f"raced: clearly worse than {against} after {len(seen)} of {total} instances "
                      f"(one-sided t-test p = {p_value:.3g} < {level:.3g} = alpha {self.cfg.alpha:g} / {self.looks(total)} looks)")
            raise RaceStopped(reason, seen, total, p_value,
                              {"alpha": self.cfg.alpha, "level": level, "against": against,
                               "seen_instances": self._seen(len(seen)), **details})

    def _test(self, seen: tuple[float, ...], total: int) -> tuple[float, str, dict]:
        from scipy import stats

        shifted = np.asarray(seen) + self.cfg.margin
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # no spread: answered below, never a stop
            if len(self.spec.parent_scores) == total:
                parent = np.asarray([self.spec.parent_scores[i] for i in self._seen(len(seen))])
                p = stats.ttest_rel(shifted, parent, alternative="less").pvalue
                p = math.nan if _no_spread(shifted - parent) else p
                return float(p), f"parent {self.spec.parent_id}", {"parent_mean_seen": float(parent.mean())}
            if self.spec.threshold is not None:
                p = stats.ttest_1samp(shifted, self.spec.threshold, alternative="less").pvalue
                p = math.nan if _no_spread(shifted - self.spec.threshold) else p
                return float(p), f"parent {self.spec.parent_id}'s score {self.spec.threshold:.4g}", \
                    {"threshold": self.spec.threshold}
        return math.nan, "", {}


def _no_spread(differences: np.ndarray) -> bool:
    """Whether the differences are all the same (up to rounding): the t-test then has no variance to
    measure and answers p = 0 (or nan), which says nothing about the instances not yet seen (a
    deterministic simulator gives the same difference on every instance of one kind), so no stop."""
    return bool(np.ptp(differences) <= 1e-9 * np.abs(differences).max())


def race_for(spec: RaceSpec | None, split: str) -> Race | None:
    """The race of a job, or None: only search evaluations race."""
    return Race(spec) if spec is not None and spec.config.enabled and split == "search" else None
