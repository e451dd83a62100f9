"""Frozen, picklable records that travel between actors and land in the archive.

Each record carries its routing fields (run, island, program id), so a result
finds its way home without any actor handle.
"""
from __future__ import annotations

import enum
import functools
import hashlib
from dataclasses import dataclass, field


class Status(str, enum.Enum):
    """Outcome of one evaluation. A bad candidate is data, never an exception."""

    OK = "OK"
    FAILED = "FAILED"  # the candidate raised, crashed or broke a resource limit
    TIMEOUT = "TIMEOUT"  # the wall-clock or CPU limit killed it
    INVALID = "INVALID"  # it answered, but with wrong types, NaN or out-of-range actions
    RACED = "RACED"  # stopped early as clearly worse than its parent (evaluators.racing): a partial
    # evaluation, no score; metrics hold the reason and the instances seen


def code_hash(code: str) -> str:
    """Stable identity of a program text (whitespace at the ends ignored)."""
    return hashlib.sha256(code.strip().encode()).hexdigest()[:16]


@dataclass(frozen=True)
class MutationRequest:
    """Ask a mutator for one child of `parent_code` on `island`."""

    run_id: str
    island: int
    generation: int
    parent_id: str
    parent_code: str
    inspirations: tuple[tuple[str, str], ...] = ()  # (program_id, code)
    operator_weights: tuple[tuple[str, float], ...] = ()
    seed: int = 0
    feedback: str = ""  # search-split metrics of the parent, for prompts
    skills: tuple = ()  # workers.skills.Skill ranked for this parent (library memory), best first
    parent_score: float | None = None  # the parent's search score, to tell an improvement


@dataclass(frozen=True)
class Candidate:
    """A proposed program, before evaluation."""

    program_id: str
    run_id: str
    island: int
    generation: int
    parent_ids: tuple[str, ...]
    code: str
    mutator: str  # e.g. "seed", "embedded:perturb_const"
    created_at: float

    @functools.cached_property
    def code_hash(self) -> str:
        """`code_hash(self.code)`, computed once per candidate."""
        return code_hash(self.code)


@dataclass(frozen=True)
class EvalResult:
    """What the trusted side measured for one program on one split.

    `score` is higher-is-better (a cost domain reports minus the cost) and is
    None unless status is OK.
    """

    program_id: str
    split: str  # "search", "validation" or "heldout" (evaluators._base.SPLITS)
    status: Status
    score: float | None = None
    metrics: dict = field(default_factory=dict)
    instance_scores: tuple[float, ...] = ()
    descriptors: tuple[float, ...] = ()
    tuned_params: dict = field(default_factory=dict)  # name -> value written back into code
    error: str | None = None
    duration_s: float = 0.0
    node_id: str | None = None  # the Ray node whose evaluator measured it (controller.actors)
    node_ip: str | None = None

    def reason(self) -> str:
        """Why it did not score, in one line (`reason_line` of its error)."""
        return reason_line(self.error)


OUTPUT_HEADING = "output:"  # evaluators.sandbox: the program's own last output follows it, below the reason


def reason_line(error: str | None) -> str:
    """An evaluation's error in one line: its first line, and where that heads a traceback (it ends
    with ':', as "the policy raised:"), the traceback's last line, the exception. Never a line of the
    program's own output, which the sandbox keeps below an 'output:' line after the reason."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if OUTPUT_HEADING in lines:
        lines = lines[:lines.index(OUTPUT_HEADING)]
    if not lines:
        return "no reason given"
    if lines[0].startswith("[") and lines[0].endswith(" characters cut]"):  # its head was cut: its end says most
        return lines[-1]
    return f"{lines[0]} {lines[-1]}" if len(lines) > 1 and lines[0].endswith(":") else lines[0]
