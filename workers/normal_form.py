"""A program's normal form, to drop proposals that are the same program as one already tried.

Two texts have the same normal form when their syntax trees agree once comments,
layout and docstrings are gone, and, where the domain tunes PARAMS (`tuned`), the PARAMS
defaults too (names and ranges stay): tuning sets the defaults, so such programs tune to
the same policy. Where it does not (`Domain.tunes_params`: MILP's `tune_trials = 0`, any
domain's 1), the defaults are what runs, so they stay. Text only, never executed.
"""
from __future__ import annotations

import ast
import hashlib

from evaluators.params import PARAMS_NAME


def normal_form(code: str, tuned: bool = True) -> str | None:
    """A short hash of the program's normal form, or None when it does not parse or nests deeper
    than the normalising walk reaches (the parser goes deeper than Python's recursion limit).
    `tuned`: the domain tunes PARAMS, so their defaults are left out."""
    try:
        return form_of(ast.parse(code), tuned)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


def form_of(tree: ast.Module, tuned: bool = True) -> str:
    """`normal_form` of a program already parsed, for callers that parsed it for other checks
    (one parse instead of two); the tree is normalised in place, so use it for nothing after."""
    _Normalizer(tuned).visit(tree)
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


class _Normalizer(ast.NodeTransformer):
    """Drops docstrings and, when `tuned`, blanks each PARAMS entry's default (the first of its three
    numbers) in the module-level PARAMS; not where the program reads PARAMS by name, as its defaults
    then run whatever tuning sets, nor in a dict of that name inside a function (a local, not tuned)."""

    def __init__(self, tuned: bool):
        self.tuned = tuned

    def visit_Module(self, node):
        node.body = _without_docstring(node.body)
        if self.tuned and not any(isinstance(n, ast.Name) and n.id == PARAMS_NAME and isinstance(n.ctx, ast.Load)
                                  for n in ast.walk(node)):
            for stmt in node.body:
                _blank_defaults(stmt)
        return self.generic_visit(node)

    def visit_FunctionDef(self, node):
        node.body = _without_docstring(node.body) or [ast.Pass()]
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef


def _blank_defaults(stmt: ast.stmt) -> None:
    """`PARAMS = {...}` with each entry's first number blanked (other statements as they are)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    if any(isinstance(t, ast.Name) and t.id == PARAMS_NAME for t in targets) and isinstance(stmt.value, ast.Dict):
        for entry in stmt.value.values:
            if isinstance(entry, (ast.Tuple, ast.List)) and entry.elts:
                entry.elts[0] = ast.Constant(None)


def _without_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body
