"""A user domain whose every evaluation costs the same fixed time: for cluster tests and scaling figures.

Each `simulate` call sleeps `cost_s` in the trusted evaluator (the cost of a simulator),
then asks the sandboxed program for one action per instance: a real candidate process per
evaluation, and a score that depends on the program (how close its line comes to a hidden
one), so the search has something to improve. The seed has no PARAMS; with
`tune_trials = 1` an evaluation is one `simulate` call even for a program that gained some.
"""
from __future__ import annotations

import time
from typing import ClassVar

from pydantic import Field

from evaluators.simple import SimpleDomain, SimpleOptions

SEED = '''\
def act(state, params):
    """A curve through the state's x (a line fits best)."""
    x = state["x"]
    slope = 0.3
    bias = 0.1
    bend = 0.05
    wave = 0.02
    return slope * x + bias + bend * x * x + wave * x * x * x
'''


class FixedCostOptions(SimpleOptions):
    """Options of the fixed-cost domain."""

    cost_s: float = Field(0.05, ge=0, le=60, description="Seconds each evaluation spends in the simulator.")
    instances_per_split: int = Field(4, ge=1, le=1000, description="Instances of each split.")


class FixedCost(SimpleDomain):
    """Fit a line in a fixed time per evaluation."""

    name = "fixed_cost"
    entry_point = "act"
    config_model = FixedCostOptions
    seed_program = SEED
    baseline_programs: ClassVar[dict[str, str]] = {"seed": SEED}
    action_shape = ()
    action_bounds = (-1e6, 1e6)

    def instances(self, split, rng):
        return [float(x) for x in rng.uniform(-1, 1, size=self.config.instances_per_split)]

    def simulate(self, instances, policy):
        time.sleep(self.config.cost_s)
        actions = policy([{"x": x} for x in instances])
        return [-abs(float(a) - (0.7 * x - 0.2)) for a, x in zip(actions, instances)]
