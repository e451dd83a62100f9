"""Test-only ways to make a trusted process die, for the fault-tolerance tests.

`KillingEvaluator` is the real evaluator, except that a program carrying `KILL_MARK`
makes its process die by SIGKILL half a second into its evaluation: the actor is
really lost, mid-evaluation, as when a trusted solver crashes or the kernel's OOM
killer picks the evaluator. Ray workers import it from the project root.
"""
import os
import signal
import time

import ray

from controller.actors import EVALUATOR_OPTIONS
from evaluators.evaluator import Evaluator

KILL_MARK = "# this program kills its evaluator process (test)"


class KillingEvaluator(Evaluator):
    def evaluate(self, program_id: str, code: str, split: str, race=None):
        if KILL_MARK in code:
            # mid-evaluation, as a crashing solver: a moment in, so the reply of the job before it has
            # left this process (a SIGKILL in the same instant can lose that reply inside Ray)
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().evaluate(program_id, code, split, race)


KillingEvaluatorActor = ray.remote(**EVALUATOR_OPTIONS)(KillingEvaluator)


class UnbuildableEvaluator(Evaluator):
    """The real evaluator on a node that lacks a package its domain imports: its constructor raises."""

    def __init__(self, *args, **kwargs):
        raise ImportError("No module named 'pyscipopt'")


UnbuildableEvaluatorActor = ray.remote(**EVALUATOR_OPTIONS)(UnbuildableEvaluator)


def killing_evaluator(config, hide=(), secrets=None):
    """Built like `controller.actors.new_evaluator`, with the same Ray options."""
    return KillingEvaluatorActor.remote(config.domain, {}, config.evaluator.sandbox, hide, secrets)
