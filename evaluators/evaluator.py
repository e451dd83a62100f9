"""The evaluator: trusted scoring of one program on one split.

A plain class (tested without Ray); `controller.actors` wraps it as a Ray actor.
It parses the program's text (never runs it), starts the candidate's sandboxed
process, hands the domain a `PolicyFn` that talks to that process, and turns
every misbehaviour into an `EvalResult` with a status and a reason.
"""
from __future__ import annotations

import math
import time

from evaluators._base import CandidateError, Outcome
from evaluators.sandbox.config import SandboxConfig
from evaluators.params import ProgramFormatError, entry_point_ok, read_params
from evaluators.racing import Race, RaceSpec, RaceStopped, race_for
from evaluators.registry import DomainConfig, domain_folders, get_domain
from evaluators.sandbox.process import PolicyProcess, clip
from evaluators.secrets import RunSecrets
from store.records import EvalResult, Status


class Evaluator:
    """Scores programs for one domain; one instance per evaluator actor."""

    def __init__(self, domain: str | DomainConfig, domain_options: dict, sandbox: SandboxConfig,
                 hide: tuple[str, ...] = (), secrets: RunSecrets | None = None):
        """`domain`: a registered name or the run's `DomainConfig` (see `registry.get_domain`).
        `secrets`: the run's secret randomness, the same for every evaluator of a run (common
        random numbers); None draws fresh ones, for an evaluator that stands alone."""
        self.domain = get_domain(domain, secrets=secrets, **domain_options)
        self.sandbox = sandbox
        self.hide = tuple(hide) + tuple(self.domain.sandbox_hide()) + domain_folders(self.domain)

    def evaluate(self, program_id: str, code: str, split: str, race: RaceSpec | None = None) -> EvalResult:
        """`race`: the parent to race against (search split only, domains with `racing`); a stopped
        race is a RACED result with the instances seen, never a score."""
        start = time.monotonic()
        try:
            outcome = self._score(code, split, race_for(race, split) if self.domain.racing else None)
        except RaceStopped as exc:
            return EvalResult(program_id, split, Status.RACED, error=exc.reason, metrics=exc.metrics(),
                              instance_scores=exc.seen, duration_s=time.monotonic() - start)
        except CandidateError as exc:
            return EvalResult(program_id, split, exc.status, error=clip(exc.reason),
                              duration_s=time.monotonic() - start)
        unscored = not_finite(outcome.score, outcome.instance_scores, outcome.descriptors)
        if unscored:
            return EvalResult(program_id, split, Status.INVALID, error=unscored, duration_s=time.monotonic() - start)
        return EvalResult(program_id, split, Status.OK, score=outcome.score,
                          metrics=outcome.metrics, instance_scores=tuple(outcome.instance_scores),
                          descriptors=tuple(outcome.descriptors), tuned_params=dict(outcome.tuned_params),
                          duration_s=time.monotonic() - start)

    def reference(self, split: str) -> dict:
        """The domain's reference figures for `split` (trusted code, so measured here, beside the programs)."""
        return self.domain.reference(split)

    def _score(self, code: str, split: str, race: Race | None):
        try:
            params = read_params(code)
        except (ProgramFormatError, SyntaxError) as exc:
            raise CandidateError(Status.INVALID, f"bad program: {exc}") from None
        if not entry_point_ok(code, self.domain.entry_point):
            raise CandidateError(Status.INVALID, f"the program defines no function {self.domain.entry_point}()")
        with PolicyProcess(code, self.domain.entry_point, self.sandbox, self.hide,
                           self.domain.program_modules(), pipelined=True) as policy:
            if race is None:
                outcome = self.domain.evaluate(policy, params, split)
            else:
                outcome = self.domain.evaluate(policy, params, split, race=race)
            policy.confirm_started()  # a program that never loaded has no score, even if it was never asked
        if not isinstance(outcome, Outcome):  # a user's Domain: say what to fix, not what broke further on
            raise TypeError(f"{type(self.domain).__name__}.evaluate returned {type(outcome).__name__}, not an "
                            "Outcome (evaluators._base.Outcome: score, metrics, instance_scores, descriptors)")
        return outcome


def not_finite(score, instance_scores, descriptors=()) -> str:
    """Why a domain's outcome cannot be a score ('' if it can): a score, an instance's score or a behaviour
    descriptor that is not a finite number (a program that drives a simulator, or the spread of its
    actions, to an overflow), which no ranking or MAP-Elites grid can hold."""
    values = (("score", score), *((f"score on instance {i}", v) for i, v in enumerate(instance_scores)),
              *((f"behaviour descriptor {i}", v) for i, v in enumerate(descriptors)))
    for what, value in values:
        try:
            if math.isfinite(value):
                continue
        except TypeError:
            pass
        return f"the domain's {what} for it is {value!r}, not a finite number"
    return ""
