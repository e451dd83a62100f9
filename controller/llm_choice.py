"""Which source proposes the next child on an island, and whether the LLM budget allows it.

Pure logic over explicit generators (tested without Ray). The island's weights
pick the embedded mutator or the LLM side; on the LLM side a bandit picks the
model: Thompson sampling (or UCB) on each model's improvement rate, divided by
its mean cost per call in the configured unit. The weights are the bandit's
prior: each model's Beta prior holds `prior_strength` pseudo-calls, of which the
model's share of the island's LLM weight are improvements. The state is rebuilt
from the archive's llm_calls rows on a resume, so a model the new config adds
starts from its prior and one it drops is ignored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workers.llm.config import EMBEDDED, BanditConfig, BudgetConfig


@dataclass
class Arm:
    """One model's record: edit calls, improvements among their children, cost spent."""

    edits: int = 0
    improvements: int = 0
    cost: float = 0.0


class ModelBandit:
    """Improvement per unit cost, per model."""

    def __init__(self, config: BanditConfig, rng: np.random.Generator, arms: dict[str, Arm] | None = None):
        self.config, self.rng = config, rng
        self.arms: dict[str, Arm] = dict(arms or {})

    def arm(self, model: str) -> Arm:
        return self.arms.setdefault(model, Arm())

    def choose(self, weights: dict[str, float]) -> str:
        """A model among `weights` (all > 0), by the configured policy."""
        names = sorted(weights)
        total = sum(weights.values())
        if self.config.policy == "off" or len(names) == 1:
            return names[int(self.rng.choice(len(names), p=[weights[n] / total for n in names]))]
        values = [self._value(n, weights[n] / total) / self._unit_cost(n) for n in names]
        return names[int(np.argmax(values))]

    def _value(self, name: str, share: float) -> float:
        arm, k = self.arm(name), self.config.prior_strength
        a = 1.0 + k * share + arm.improvements
        b = 1.0 + k * (1.0 - share) + arm.edits - arm.improvements
        if self.config.policy == "thompson":
            return float(self.rng.beta(a, b))
        calls = sum(x.edits for x in self.arms.values()) + 1
        return a / (a + b) + math.sqrt(2.0 * math.log(calls + 1) / (arm.edits + 1))

    def _unit_cost(self, name: str) -> float:
        """Mean cost per edit call, smoothed toward the mean over all models (one pseudo-call)."""
        spent = [a for a in self.arms.values() if a.edits]
        overall = sum(a.cost for a in spent) / max(sum(a.edits for a in spent), 1) if spent else 1.0
        overall = max(overall, 1e-12)
        arm = self.arm(name)
        return max((arm.cost + overall) / (arm.edits + 1), 1e-12)


def call_cost(unit: str, tokens: int, money: float, gpu_s: float) -> float:
    """One call's cost in the bandit's unit."""
    return {"tokens": float(tokens), "money": money, "gpu_s": gpu_s, "calls": 1.0}[unit]


def pick_source(mix: dict[str, float], allowed: set[str], rng: np.random.Generator) -> str | None:
    """'embedded' or 'llm' by the island's weights, among the sources that have room (`allowed`)."""
    weights = {EMBEDDED: mix.get(EMBEDDED, 0.0) if EMBEDDED in allowed else 0.0,
               "llm": sum(w for name, w in mix.items() if name != EMBEDDED and name in allowed)}
    total = sum(weights.values())
    if total <= 0:
        return None
    return EMBEDDED if rng.random() * total < weights[EMBEDDED] else "llm"


@dataclass
class Budget:
    """Calls, tokens and cost: spent (committed or finished) plus reserved by calls in flight."""

    limits: BudgetConfig
    calls: int = 0
    tokens: int = 0
    cost: float = 0.0
    reserved: tuple[int, int, float] = (0, 0, 0.0)

    def allows(self, calls: int, tokens: int, cost: float) -> bool:
        """True when a request of this estimated size fits beside everything spent and in flight."""
        rc, rt, rm = self.reserved
        return all(limit is None or used + extra <= limit for limit, used, extra in (
            (self.limits.calls, self.calls + rc, calls), (self.limits.tokens, self.tokens + rt, tokens),
            (self.limits.cost, self.cost + rm, cost)))

    def reserve(self, calls: int, tokens: int, cost: float, sign: int = 1) -> None:
        rc, rt, rm = self.reserved
        self.reserved = (rc + sign * calls, rt + sign * tokens, rm + sign * cost)

    def spend(self, calls: int, tokens: int, cost: float) -> None:
        self.calls, self.tokens, self.cost = self.calls + calls, self.tokens + tokens, self.cost + cost

    def left(self) -> dict:
        return {"calls": None if self.limits.calls is None else self.limits.calls - self.calls,
                "tokens": None if self.limits.tokens is None else self.limits.tokens - self.tokens,
                "cost": None if self.limits.cost is None else round(self.limits.cost - self.cost, 6)}
