"""The one interface every mutation backend implements (embedded, LLM).

Rules every `Mutator` keeps:
- It never executes, evaluates or imports candidate code; it works only on text
  and syntax trees. Running programs is the evaluator's job, in a sandbox.
- It is deterministic given `request.seed`: the same request yields the same child,
  so a run can be replayed from its archive.
- The child it returns parses, still defines the domain's entry point, and differs
  from the parent (after normalizing the text), so no evaluation is wasted on a copy.
- When it cannot meet those rules it raises `MutationFailed`, which the caller
  records and moves on from; it never returns a partial or invalid child.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

from store.records import MutationRequest


class MutationFailed(Exception):
    """No valid, changed child could be produced for this request."""


@dataclass(frozen=True)
class Proposal:
    """A mutator's answer: the child's code and the operator that made it."""

    code: str
    operator: str  # e.g. "embedded:perturb_const"; becomes Candidate.mutator
    skill_id: str = ""  # the library skill the child replays (operator "embedded:skill"), if any
    form: str = ""  # the child's normal form (`workers.normal_form`): the driver's dedup need not parse it


class Mutator(abc.ABC):
    """Turns a `MutationRequest` into one child program, keeping the rules above."""

    @abc.abstractmethod
    def propose(self, request: MutationRequest) -> Proposal:
        """Return one child of `request.parent_code`, or raise `MutationFailed`."""
