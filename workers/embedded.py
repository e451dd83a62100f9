"""The embedded mutator: seeded AST operators, no language model, no code execution.

It is the default backend and the baseline LLM backends must beat. Each request
picks an operator by the request's weights with the request's seed, applies it,
and checks the child; failures to apply are retried up to `max_attempts`.
"""
from __future__ import annotations

import ast
import functools

import numpy as np

from evaluators.params import (
    PARAMS_NAME,
    ProgramFormatError,
    entry_point_ok,
    read_params,
    write_param_specs,
)
from store.records import MutationRequest
from workers import _ast_util as u
from workers._base import MutationFailed, Mutator, Proposal
from workers.ast_ops import OPERATORS, Motif, OpContext
from workers.config import SKILL, EmbeddedMutatorConfig
from workers.layout import keep_layout
from workers.normal_form import normal_form
from workers.skills import replay_skill

__all__ = ["EmbeddedMutator", "Motif"]

PREFIX = "embedded:"
# what an operator raising means "does not apply to this parent"; RecursionError: copy.deepcopy and
# ast.unparse recurse once a level, so a sum of a few hundred terms (the parser's tree is that deep) stops them
_CANNOT = (ProgramFormatError, SyntaxError, ValueError, LookupError, RecursionError)


class EmbeddedMutator(Mutator):
    """Mutates programs of one domain (its entry point and motifs) with AST operators."""

    def __init__(self, config: EmbeddedMutatorConfig, entry_point: str, motifs: list[Motif] = (),
                 bounds: tuple[float | None, float | None] = (None, None), tuned: bool = True):
        self.config = config
        self.entry_point = entry_point
        self.motifs = tuple(motifs)
        self.bounds = bounds
        self.tuned = tuned  # the domain tunes PARAMS: a child that changes only their defaults is its parent
        for motif in self.motifs:
            _check_motif(motif)

    @classmethod
    def for_domain(cls, config: EmbeddedMutatorConfig, domain) -> EmbeddedMutator:
        """The mutator for a domain object: its entry point, its motifs, the bounds of what it returns and
        whether it tunes PARAMS."""
        motifs = [Motif(name, template, tuple(params)) for name, template, params in domain.motifs()]
        return cls(config, domain.entry_point, motifs, domain.output_bounds(), domain.tunes_params())

    def propose(self, request: MutationRequest) -> Proposal:
        """One checked child of the parent, deterministic given `request.seed`; never one of the parent's
        normal form (the driver would drop it as a duplicate: under tuning, a nudged PARAMS default)."""
        parent = _normalized(request.parent_code)
        if parent is None or not entry_point_ok(request.parent_code, self.entry_point):
            raise MutationFailed(f"the parent does not parse or lacks {self.entry_point}()")
        rng = np.random.default_rng(request.seed)
        names, probs = self._choice(request.operator_weights, bool(request.skills))
        ctx = OpContext(self.entry_point, rng, self.config.const_scale,
                        tuple(code for _, code in request.inspirations), self.motifs, self.bounds)
        unbound = u.read_before_assignment(*u.parse_function(request.parent_code, self.entry_point))
        for _ in range(self.config.max_attempts):
            name = names[int(rng.choice(len(names), p=probs))]
            child, skill = self._attempt(name, request, ctx, unbound)
            child = child if child is None else without_unread_params(child, self.entry_point)
            form = self._new_form(child, parent, request.parent_code)
            if form is not None:
                child = keep_layout(request.parent_code, child)  # the parent's comments and layout, where they agree
                return Proposal(child, PREFIX + name, skill, form)
        raise MutationFailed(f"no valid changed child in {self.config.max_attempts} attempts")

    def _new_form(self, child: str | None, parent: str, parent_code: str) -> str | None:
        """The child's normal form ("" if it has none) when it is a program other than its parent, else None."""
        if child is None or _normalized(child) == parent:
            return None
        form = normal_form(child, self.tuned)
        return None if form is not None and form == _form(parent_code, self.tuned) else form or ""

    def _choice(self, weights: tuple[tuple[str, float], ...], skills: bool = False) -> tuple[list[str], np.ndarray]:
        """Enabled operators with positive weight and their probabilities.

        Weights may name operators bare or with the "embedded:" prefix; a missing
        name weighs 1.0, and weight 0 disables an operator for this request. The
        "skill" operator counts only when the request carries skills to replay.
        """
        given = {name.removeprefix(PREFIX): float(w) for name, w in weights}
        enabled = [name for name in self.config.operators if name != SKILL or skills]
        raw = {name: max(given.get(name, 1.0), 0.0) for name in enabled}
        names = [name for name, w in raw.items() if w > 0]
        if not names:
            raise MutationFailed("every enabled operator has weight 0")
        total = sum(raw[name] for name in names)
        return names, np.array([raw[name] / total for name in names])

    def _try(self, name: str, code: str, ctx: OpContext, unbound: set[str]) -> str | None:
        """The operator's child if it is valid, else None (a bad parent PARAMS counts as 'cannot', and so
        does an expression too deep for the operator's recursive copy or walk: a long sum parses flat).

        Valid includes reading no name before it is assigned beyond those the parent already
        did (`unbound`): an edit that drops or moves an assignment would only fail at run time.
        """
        try:
            child = OPERATORS[name](code, ctx)
        except _CANNOT:
            return None
        return self._checked(child, unbound)

    def _attempt(self, name: str, request: MutationRequest, ctx: OpContext, unbound: set[str]):
        """(child or None, the skill id it replays or "")."""
        if name != SKILL:
            return self._try(name, request.parent_code, ctx, unbound), ""
        try:
            found = replay_skill(request.parent_code, request.skills, self.entry_point, ctx.rng)
        except _CANNOT:
            found = None
        return (self._checked(found[0], unbound), found[1]) if found else (None, "")

    def _checked(self, child: str | None, unbound: set[str]) -> str | None:
        if child is None or not entry_point_ok(child, self.entry_point):
            return None
        loaded = u.parse_function(child, self.entry_point)
        if loaded is None or not u.returns(loaded[1]) or u.read_before_assignment(*loaded) - unbound:
            return None
        return child


def operators_reach(entry_point: str) -> str:
    """What the operators change, for a message saying why a program got no child."""
    return f"its operators change numbers, comparisons, arithmetic and branches in {entry_point}() and PARAMS"


def no_child_remedy(entry_point: str) -> str:
    """What a user can do when the operators find nothing to change."""
    return f"give {entry_point}() numbers to tune (or PARAMS), or add an LLM ([mutator.llm])"


def without_unread_params(code: str, entry_point: str) -> str:
    """`code` without the PARAMS entries its entry point no longer reads: removing a branch leaves its
    gate's parameters behind, and tuning would spend its trials on them. `code` itself where the
    program may read its params another way (passes them on, iterates or assigns them, reads PARAMS
    by name)."""
    loaded = u.parse_function(code, entry_point)
    if loaded is None:
        return code
    tree, fn = loaded
    try:
        specs = read_params(code, tree)
    except (ValueError, ProgramFormatError):
        return code
    name = u.arg_name(fn, 1, "")
    if not specs or not name:
        return code
    uses = sum(isinstance(node, ast.Name) and node.id == name for node in ast.walk(fn))
    plain = sum(isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name)
                and node.value.id == name and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)
                for node in ast.walk(fn))
    if uses != plain or any(isinstance(node, ast.Name) and node.id == PARAMS_NAME
                            and not isinstance(node.ctx, ast.Store) for node in ast.walk(tree)):
        return code  # params read another way too (passed on, iterated, assigned), or PARAMS by name
    read = set(u.param_keys(fn, name))
    if set(specs) <= read:
        return code
    return write_param_specs(code, {key: spec for key, spec in specs.items() if key in read})


@functools.lru_cache(maxsize=32)  # a worker's requests share parents: the islands' best few are drawn often
def _form(code: str, tuned: bool) -> str | None:
    return normal_form(code, tuned)


def _normalized(code: str) -> str | None:
    """Canonical text of a program (layout and comments dropped), or None if it does not parse."""
    try:
        return ast.unparse(ast.parse(code))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def _check_motif(motif: Motif) -> None:
    """Fail at construction, with the motif's name, if its template cannot be filled in."""
    names = {f"p{i}": f"x{i}" for i in range(len(motif.params))}
    try:
        ast.parse(motif.template.format(expr="x", **names), mode="eval")
    except (KeyError, IndexError, ValueError, SyntaxError) as exc:
        raise ValueError(f"motif {motif.name!r} has a bad template {motif.template!r}: {exc}") from None
    for entry in motif.params:
        numbers = len(entry) == 4 and all(isinstance(x, (int, float)) for x in entry[1:])
        if not numbers or entry[2] > entry[3]:
            raise ValueError(f"motif {motif.name!r} parameter {entry!r} must be (name, default, low, high)")
