"""The interface every domain implements, and the error a bad candidate raises.

A domain owns its simulator or solver, its data, its splits and its score. It
never runs candidate code itself: it receives a `PolicyFn` (in production a
`sandbox.PolicyProcess`) and sends it batches of states. Anything the candidate
does wrong is raised as a `CandidateError` and becomes an `EvalResult` status.
A reply holds one action array per batch of at most 1024 numbers plus four per
number of that batch's state; a larger one is INVALID before it is read.

A candidate cannot learn what its score depends on: a domain that shows it the
same data twice in one evaluation (a tuning round over instances already played,
another seed of a solve) calls `renew(policy)` before each later pass, so the
program answers it in a process that remembers nothing of the earlier ones.
A domain that times something of its own between passes (SCIP's default rule on
the run just played) calls `retire(policy)` first, so no process of the program,
not even one that has just loaded, can load the machine while that is timed.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NoReturn

import numpy as np
from pydantic import BaseModel

from evaluators.params import ParamSpec
from evaluators.secrets import RunSecrets
from store.records import EvalResult, Status

# search: what the evolution sees and is scored on. validation: other data scored like the
# search split (same protocol, same scale), to check that a gain on search holds elsewhere;
# selected on again and again, so never used for reports. heldout: touched only by reports
# and promotion gates; its scores never reach a mutator.
SPLITS = ("search", "validation", "heldout")

# policy(batches) -> actions: batches is a list of (state, params) pairs, each a
# dict of numpy arrays; the answer is one numeric array per batch. A module-level
# global of the program lives as long as its process: see `renew`.
PolicyFn = Callable[[list[tuple[dict, dict]]], list[Any]]


def renew(policy: PolicyFn) -> None:
    """Let `policy` go on in a new process of the same program that has seen nothing, where it runs in one.

    The sandboxed `PolicyProcess` takes a new process (the evaluation's deadline holds on; one
    that has been sent nothing yet is kept); a plain callable (tests, benchmarks) is left as it is.
    """
    fresh = getattr(policy, "renew", None)
    if callable(fresh):
        fresh()


def retire(policy: PolicyFn) -> None:
    """Stop `policy`'s process until the next `renew` or call, where it runs in one (a plain callable: nothing).

    A program's process (or what it started) could otherwise burn CPU and memory bandwidth
    while the trusted side times a reference on the same machine, and score against a
    slowed reference.
    """
    stop = getattr(policy, "retire", None)
    if callable(stop):
        stop()


class CandidateError(Exception):
    """The candidate misbehaved; `status` and `reason` go into its EvalResult."""

    def __init__(self, status: Status, reason: str):
        super().__init__(f"{status.value}: {reason}")
        self.status = status
        self.reason = reason


class DoesNotHoldUp(CandidateError):
    """A validation result the domain refuses because the program does not hold up there (inventory: a
    policy that does not work off a disturbed start): INVALID, so the report does not crown it
    (`controller/crowning.py`). A weak baseline may meet it too; `atoll check` says so and passes, where
    any other failure of a baseline fails. Its reason starts with MARK."""

    MARK = "does not hold up on the validation split: "

    def __init__(self, reason: str):
        super().__init__(Status.INVALID, self.MARK + reason)

    @classmethod
    def marks(cls, error: str | None) -> bool:
        """Whether an evaluation's `error` is such a refusal."""
        return (error or "").startswith(cls.MARK)


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
    # What each number of `Outcome.descriptors` measures, in order (MAP-Elites bins them; the
    # config's bounds are checked against it). None: not declared, so not checked.
    descriptor_names: ClassVar[tuple[str, ...] | None] = None
    # True: `evaluate` takes `race=` (an `evaluators.racing.Race`) on the search split, scores
    # its instances in order and calls `race.look(scores so far, instance count)` after each one
    # where the search score is a mean over instances (no tuning trial picks the best).
    racing: ClassVar[bool] = False
    # The run's secret randomness, set by `registry.get_domain`: every stream a score
    # depends on derives from it (never from a seed a candidate could know).
    secrets: RunSecrets

    @property
    @abc.abstractmethod
    def seed_program(self) -> str:
        """The program every island starts from."""

    @abc.abstractmethod
    def evaluate(self, policy: PolicyFn, params: dict[str, ParamSpec], split: str) -> Outcome:
        """Score `policy` on `split`, tuning `params` first where the protocol says so
        (never on the data the held-out figure is measured on).

        `policy` answers in one process for the whole call; call `renew(policy)` before
        showing it data it has seen (the same instance again), or its score can rest on
        what it remembered.

        "search" and "validation" follow the same protocol on different data (the
        validation data derived from `secrets.validation`), so their scores are on one
        scale; "heldout" is the report's protocol.

        Raises `CandidateError` for anything the candidate did wrong.
        """

    @abc.abstractmethod
    def baselines(self) -> dict[str, str]:
        """Name -> program text of each baseline, scored by the same evaluator."""

    def motifs(self) -> list[tuple[str, str, tuple]]:
        """(name, template, params) the embedded mutator may splice in; see workers.ast_ops."""
        return []

    def output_bounds(self) -> tuple[float | None, float | None]:
        """The least and greatest number the entry point may return (None: no bound on that side).

        Only a hint for the embedded mutator, which keeps the range of a new parameter that
        becomes the returned value inside them; the evaluation checks what a program returns.
        """
        return None, None

    def tunes_params(self) -> bool:
        """Whether a search score is the best of tuning trials over PARAMS, not the written defaults'.

        Then two programs that differ only in their PARAMS defaults tune alike and count as one
        (`workers.normal_form`); otherwise the defaults are what runs, and each is a program of its own.
        """
        return False

    def reference(self, split: str) -> dict:
        """Reference figures for `split` (e.g. an exact optimum), for the report.

        The held-out report adds `reference["trials"] = {"count": N, "search_scores":
        [...]}`: how many programs the run evaluated on the search split (every
        status) and the scores of those that scored, for selection-bias corrections.
        """
        return {}

    def program_modules(self) -> tuple[str, ...]:
        """Top-level modules the domain's programs may import besides the standard library.

        They are bound read-only into the candidate's root with their companion
        library folders and the system libraries they load; nothing else is there.
        """
        return ("numpy",)

    def public_data(self) -> str:
        """Why the search split's data are the same whatever the run's secrets, or '' when they derive
        from them: published or the user's own records (real price history, an instance library),
        which no secret can make unknown; the sandbox hiding them is what protects them.

        `atoll check` then takes a score that does not change with the secrets as this, not as a
        stream drawn from a public seed.
        """
        return ""

    def sandbox_hide(self) -> tuple[str, ...]:
        """Paths the candidate's process must not read even where they lie inside `program_modules()`.

        The candidate's root is an allow-list, so a domain's data outside those
        modules is out of reach without naming it here.
        """
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


def numeric_reply(reply, noun: str, reject: Callable[[str], NoReturn], rows: int | None = None) -> np.ndarray:
    """A policy's reply as an array of numbers: the first step of every domain's reply check.

    Anything else is refused through `reject(reason)`, which raises. With `rows`, a scalar or
    one-element reply is spread over that many rows (a read-only view); the domain checks the
    shape, the values and their range itself.
    """
    try:
        values = reply if isinstance(reply, np.ndarray) else np.asarray(reply, dtype=float)
    except (ValueError, TypeError):
        values = None  # refused outside the handler, so the reason carries no traceback of its own
    if values is None:
        reject("the policy's reply is not an array of numbers")
    if values.dtype.kind not in "biuf":
        reject(f"{noun} must be numbers, got dtype {values.dtype}")
    if rows is not None and values.shape in ((), (1,)):
        values = np.broadcast_to(values.reshape(()), (rows,))
    return values


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    return split
