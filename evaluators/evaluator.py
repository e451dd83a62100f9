"""The evaluator: trusted scoring of one program on one split.

A plain class (tested without Ray); `controller.actors` wraps it as a Ray actor.
It parses the program's text (never runs it), starts the candidate's sandboxed
process, hands the domain a `PolicyFn` that talks to that process, and turns
every misbehaviour into an `EvalResult` with a status and a reason.
"""
from __future__ import annotations

import time

from evaluators._base import CandidateError
from evaluators.sandbox.config import SandboxConfig
from evaluators.params import ProgramFormatError, entry_point_ok, read_params
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

    def evaluate(self, program_id: str, code: str, split: str) -> EvalResult:
        start = time.monotonic()
        try:
            outcome = self._score(code, split)
        except CandidateError as exc:
            return EvalResult(program_id, split, exc.status, error=clip(exc.reason),
                              duration_s=time.monotonic() - start)
        return EvalResult(program_id, split, Status.OK, score=outcome.score,
                          metrics=outcome.metrics, instance_scores=tuple(outcome.instance_scores),
                          descriptors=tuple(outcome.descriptors), tuned_params=dict(outcome.tuned_params),
                          duration_s=time.monotonic() - start)

    def reference(self, split: str) -> dict:
        """The domain's reference figures for `split` (trusted code, so measured here, beside the programs)."""
        return self.domain.reference(split)

    def _score(self, code: str, split: str):
        try:
            params = read_params(code)
        except (ProgramFormatError, SyntaxError) as exc:
            raise CandidateError(Status.INVALID, f"bad program: {exc}") from None
        if not entry_point_ok(code, self.domain.entry_point):
            raise CandidateError(Status.INVALID, f"the program defines no function {self.domain.entry_point}()")
        with PolicyProcess(code, self.domain.entry_point, self.sandbox, self.hide,
                           self.domain.program_modules()) as policy:
            return self.domain.evaluate(policy, params, split)
