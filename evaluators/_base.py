"""The interface every domain implements, and the error a bad candidate raises.

A domain owns its simulator or solver, its data, its splits and its score. It
never runs candidate code itself: it receives a `PolicyFn` (in production a
`sandbox.PolicyProcess`) and sends it batches of states. Anything the candidate
does wrong is raised as a `CandidateError` and becomes an `EvalResult` status.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from pydantic import BaseModel

from evaluators.params import ParamSpec
from evaluators.secrets import RunSecrets
from store.records import EvalResult, Status

SPLITS = ("search", "heldout")

# policy(batches) -> actions: batches is a list of (state, params) pairs, each a
# dict of numpy arrays; the answer is one numeric array per batch.
PolicyFn = Callable[[list[tuple[dict, dict]]], list[Any]]


class CandidateError(Exception):
    """The candidate misbehaved; `status` and `reason` go into its EvalResult."""

    def __init__(self, status: Status, reason: str):
        super().__init__(f"{status.value}: {reason}")
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Outcome:
    """What a domain measured for one program on one split (score: higher is better)."""

    score: float
    metrics: dict = field(default_factory=dict)
    instance_scores: tuple[float, ...] = ()
    descriptors: tuple[float, ...] = ()
    tuned_params: dict = field(default_factory=dict)


class Domain(abc.ABC):
    """One policy domain: its program format, its data, its score and its baselines."""

    name: ClassVar[str]
    entry_point: ClassVar[str] = "policy"
    config_model: ClassVar[type[BaseModel]]
    # The run's secret randomness, set by `registry.get_domain`: every stream a score
    # depends on derives from it (never from a seed a candidate could know).
    secrets: RunSecrets

    @property
    @abc.abstractmethod
    def seed_program(self) -> str:
        """The program every island starts from."""

    @abc.abstractmethod
    def evaluate(self, policy: PolicyFn, params: dict[str, ParamSpec], split: str) -> Outcome:
        """Score `policy` on `split`, tuning `params` on the search split only.

        Raises `CandidateError` for anything the candidate did wrong.
        """

    @abc.abstractmethod
    def baselines(self) -> dict[str, str]:
        """Name -> program text of each baseline, scored by the same evaluator."""

    def motifs(self) -> list[tuple[str, str, tuple]]:
        """(name, template, params) the embedded mutator may splice in; see workers.ast_ops."""
        return []

    def reference(self, split: str) -> dict:
        """Reference figures for `split` (e.g. an exact optimum), for the report.

        The held-out report adds `reference["trials"] = {"count": N, "search_scores":
        [...]}`: how many programs the run evaluated on the search split (every
        status) and the scores of those that scored, for selection-bias corrections.
        """
        return {}

    def sandbox_hide(self) -> tuple[str, ...]:
        """Paths the candidate's process must not read (the domain's own data files)."""
        return ()

    @abc.abstractmethod
    def heldout_table(self, results: dict[str, EvalResult], reference: dict
                      ) -> tuple[list[str], list[tuple[str, ...]], list[str]]:
        """(columns, rows of strings, notes) comparing labelled held-out results.

        Labels are "evolved best" and "baseline: NAME".
        """

    # -- for LLM prompts (workers/llm): what the model must know to write a program ----------
    def description(self) -> str:
        """A few sentences on the task and its score, shown in every LLM prompt."""
        return " ".join((type(self).__doc__ or f"The {self.name} domain.").split())

    def contract(self) -> str:
        """What a program must define, receive and return; shown in every LLM prompt."""
        return (f"Define {self.entry_point}(state, params) at the top level; it receives batches as numpy "
                "arrays and `params` as one array per PARAMS entry, and returns numeric actions. "
                "No file, network or process access.")


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return split
