"""Structural edits: the difference between a parent and a child program, replayable elsewhere.

A `SkillEdit` is the smallest part of the entry point's body that changed: an expression
or a run of statements (`before`) and what replaced it (`after`), plus the PARAMS the
new part reads that the parent lacked. Where the child kept the old part inside the new
one (a clip or a branch wrapped around it), `after` holds a hole instead of a copy, so the
edit is a template: replayed on another program it wraps whatever stands at the same
place there (for a wrapped return value, any return value). The function's argument
names and numpy's alias are written as placeholders, so an edit learned on
`policy(state, params)` replays on `policy(s, p)`.

Like every mutation operator this works on text and trees only; nothing here runs a program.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

import numpy as np

from evaluators.params import ProgramFormatError, add_param, read_params, unique_param_name
from workers import _ast_util as u

HOLE, STATE, PARAMS, NUMPY = "__hole__", "__state__", "__params__", "__np__"
_BLOCKS = ("body", "orelse", "finalbody")


@dataclass(frozen=True)
class SkillEdit:
    """One replayable change of an entry point's body (see the module docstring)."""

    kind: str  # "expr" or "stmts"
    before: str  # the replaced part, with placeholders
    after: str  # its replacement; HOLE marks where `before` is kept
    anchor: str = ""  # "return": `before` was a return value, so any return value is a place for it
    new_params: tuple[tuple[str, float, float, float], ...] = ()

    @property
    def wraps(self) -> bool:
        return HOLE in self.after

    def to_record(self) -> dict:
        return {"kind": self.kind, "before": self.before, "after": self.after, "anchor": self.anchor,
                "new_params": [list(p) for p in self.new_params]}

    @classmethod
    def from_record(cls, record: dict) -> "SkillEdit":
        params = tuple((str(n), float(d), float(lo), float(hi)) for n, d, lo, hi in record.get("new_params", ()))
        return cls(record["kind"], record["before"], record["after"], record.get("anchor", ""), params)


# --- extraction ------------------------------------------------------------------------------

def extract_edit(parent: str, child: str, entry_point: str) -> SkillEdit | None:
    """The edit turning `parent`'s entry point into `child`'s; None when the body did not
    change (only PARAMS defaults or ranges, which tuning redoes anyway) or a program is bad."""
    p_loaded, c_loaded = u.parse_function(parent, entry_point), u.parse_function(child, entry_point)
    if p_loaded is None or c_loaded is None:
        return None
    found = _diff_block(p_loaded[1].body, c_loaded[1].body)
    try:
        old_specs, new_specs = read_params(parent), read_params(child)
    except (ProgramFormatError, SyntaxError, ValueError):
        return None
    if found is None:
        return None
    names = {**_placeholders(*p_loaded), **_placeholders(*c_loaded)}
    old, new = found
    if isinstance(old, list):
        kind, anchor, before, after = "stmts", "", old, new
    else:
        kind, before, after = "expr", [old], [_with_hole(old, new)]
        anchor = "return" if any(r.value is old for r in u.returns(p_loaded[1])) else ""
    read = {k for node in after for k in u.param_keys(node, u.arg_name(c_loaded[1], 1, "params"))}
    added = tuple((s.name, s.default, s.low, s.high) for name, s in new_specs.items()
                  if name in read and name not in old_specs)
    return SkillEdit(kind, _source(before, names), _source(after, names), anchor, added)


def _diff_block(old: list, new: list):
    """(old part, new part) of two statement lists: one differing statement is searched
    deeper; otherwise the differing run of statements (with a neighbour if it is empty)."""
    start = 0
    while start < min(len(old), len(new)) and _same(old[start], new[start]):
        start += 1
    if start == len(old) == len(new):
        return None
    end_old, end_new = len(old), len(new)
    while end_old > start and end_new > start and _same(old[end_old - 1], new[end_new - 1]):
        end_old, end_new = end_old - 1, end_new - 1
    if end_old - start == 1 and end_new - start == 1:
        return _diff_node(old[start], new[start])
    if end_old == start:  # a pure insertion: anchor it on a neighbour
        if start > 0:
            start -= 1
        else:
            end_old, end_new = end_old + 1, end_new + 1
    return old[start:end_old], new[start:end_new]


def _diff_node(old: ast.AST, new: ast.AST, outer=None):
    """The innermost differing expression or statement pair under two nodes at one place;
    a changed literal, attribute or name is widened to its enclosing expression, which says
    where it sits (a name replaced by a larger expression is kept: it may be a wrap)."""
    here = outer
    if isinstance(old, (ast.expr, ast.stmt)) and not (outer and _too_small(old, new)):
        here = (old, new)
    if type(old) is not type(new):
        return _part(here)
    differing = []
    for (name, a), (_, b) in zip(ast.iter_fields(old), ast.iter_fields(new)):
        if name == "ctx" or (not isinstance(a, (ast.AST, list)) and a == b):
            continue
        if isinstance(a, list) and isinstance(b, list) and (len(a) == len(b) or name in _BLOCKS):
            if name in _BLOCKS:
                differing += [("block", a, b)] if [ast.dump(x) for x in a] != [ast.dump(y) for y in b] else []
            else:
                differing += [("node", x, y) for x, y in zip(a, b) if not _same(x, y)]
        elif isinstance(a, ast.AST) and isinstance(b, ast.AST):
            differing += [] if _same(a, b) else [("node", a, b)]
        else:
            return _part(here)
    if len(differing) != 1:
        return _part(here)
    kind, a, b = differing[0]
    return _diff_block(a, b) if kind == "block" else _diff_node(a, b, here)


def _too_small(old: ast.AST, new: ast.AST) -> bool:
    return isinstance(old, (ast.Constant, ast.Attribute)) or isinstance(old, ast.Name) and isinstance(new, ast.Name)


def _part(pair):
    if pair is None:
        return None
    old, new = pair
    return ([old], [new]) if isinstance(old, ast.stmt) else (old, new)


def _same(a, b) -> bool:
    return ast.dump(a) == ast.dump(b)


def _with_hole(old: ast.expr, new: ast.expr) -> ast.expr:
    """`new` with each copy of `old` inside it replaced by the hole (a wrap), if any."""
    target, new = ast.dump(old), copy.deepcopy(new)
    if ast.dump(new) == target:
        return new
    for node in ast.walk(new):
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.AST) and ast.dump(value) == target:
                setattr(node, field, _hole())
            elif isinstance(value, list):
                value[:] = [_hole() if isinstance(v, ast.AST) and ast.dump(v) == target else v for v in value]
    return new


def _hole() -> ast.Name:
    return ast.Name(id=HOLE, ctx=ast.Load())


def _numpy_name(tree: ast.Module) -> str | None:
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name == "numpy":
                    return alias.asname or "numpy"
    return None


def _placeholders(tree: ast.Module, fn: ast.FunctionDef) -> dict[str, str]:
    """The program's own names -> placeholders (state and params arguments, numpy's alias)."""
    names = {u.arg_name(fn, 0, "state"): STATE, u.arg_name(fn, 1, "params"): PARAMS}
    alias = _numpy_name(tree)
    return {**names, alias: NUMPY} if alias else names


def _renamed(nodes: list, names: dict[str, str]) -> list:
    nodes = [copy.deepcopy(n) for n in nodes]
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in names:
                sub.id = names[sub.id]
    return nodes


def _source(nodes: list, names: dict[str, str]) -> str:
    return "\n".join(ast.unparse(n) for n in _renamed(nodes, names))


# --- replay ----------------------------------------------------------------------------------

def applies(edit: SkillEdit, code: str, entry_point: str) -> bool:
    """Whether `edit` has a place in `code` (its `before`, or a return value for a wrapped one)."""
    loaded = u.parse_function(code, entry_point)
    if loaded is None:
        return False
    try:
        return bool(_places(edit, *loaded))
    except SyntaxError:
        return False


def replay(edit: SkillEdit, code: str, entry_point: str, rng: np.random.Generator) -> str | None:
    """`code` with `edit` applied at one of its places (chosen by `rng`), or None if it has none."""
    loaded = u.parse_function(code, entry_point)
    if loaded is None:
        return None
    tree, fn = loaded
    places = _places(edit, tree, fn)
    if not places:
        return None
    holder, place = places[int(rng.integers(len(places)))]
    fresh, current = {}, code
    for name, default, low, high in edit.new_params:
        fresh[name] = unique_param_name(current, name)
        current = add_param(current, fresh[name], default, low, high)
    names = _actual(tree, fn, edit)
    new = [_fill_keys(n, fresh) for n in _renamed(_parse(edit.after, edit.kind), names)]
    if edit.kind == "expr":
        u.replace(fn, place, _fill_hole(new[0], place))
    else:
        holder[place.start:place.stop] = new
    return _with_new_params(ast.unparse(tree), fresh, edit.new_params)


def _places(edit: SkillEdit, tree: ast.Module, fn: ast.FunctionDef) -> list:
    """(holder, place) pairs where `edit.before` stands in `fn`: for expressions the node,
    for statements the statement list and the slice."""
    names = {v: k for k, v in _placeholders(tree, fn).items()}
    names.setdefault(NUMPY, "np")
    before = [ast.dump(n) for n in _renamed(_parse(edit.before, edit.kind), names)]
    if edit.kind == "expr":
        found = [(None, n) for n in u.body_nodes(fn) if isinstance(n, ast.expr) and ast.dump(n) == before[0]]
        if not found and edit.anchor == "return" and _params_known(edit, tree, fn):
            found = [(None, r.value) for r in u.returns(fn)]
        return found
    width = len(before)
    return [(block, slice(i, i + width)) for block in _blocks(fn) for i in range(len(block) - width + 1)
            if [ast.dump(s) for s in block[i:i + width]] == before]


def _params_known(edit: SkillEdit, tree: ast.Module, fn: ast.FunctionDef) -> bool:
    """Whether every parameter the new return value reads is the program's or comes with the edit."""
    try:
        have = set(read_params(ast.unparse(tree))) | {p[0] for p in edit.new_params}
    except (ProgramFormatError, SyntaxError, ValueError):
        return False
    return set(u.param_keys(ast.parse(edit.after, mode="eval"), PARAMS)) <= have


def _blocks(fn: ast.FunctionDef) -> list[list]:
    found = [fn.body]
    for node in u.body_nodes(fn):
        found += [getattr(node, f) for f in _BLOCKS if isinstance(getattr(node, f, None), list)
                  and getattr(node, f) and isinstance(getattr(node, f)[0], ast.stmt)]
    return found


def _parse(text: str, kind: str) -> list:
    return [ast.parse(text, mode="eval").body] if kind == "expr" else list(ast.parse(text).body)


def _actual(tree: ast.Module, fn: ast.FunctionDef, edit: SkillEdit) -> dict[str, str]:
    """Placeholders -> this program's names; numpy is imported if the edit needs it."""
    names = {v: k for k, v in _placeholders(tree, fn).items()}
    if NUMPY in edit.after and NUMPY not in names:
        names[NUMPY] = u.numpy_alias(tree)
    return names


def _fill_keys(node: ast.AST, fresh: dict[str, str]) -> ast.AST:
    """Rename the keys of new parameters (`params["cap"]` -> `params["cap_2"]`) where taken."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) and sub.slice.value in fresh:
            sub.slice = ast.Constant(fresh[sub.slice.value])
    return node


def _fill_hole(template: ast.expr, place: ast.expr) -> ast.expr:
    if isinstance(template, ast.Name) and template.id == HOLE:
        return copy.deepcopy(place)
    for node in ast.walk(template):
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.Name) and value.id == HOLE:
                setattr(node, field, copy.deepcopy(place))
            elif isinstance(value, list):
                value[:] = [copy.deepcopy(place) if isinstance(v, ast.Name) and v.id == HOLE else v for v in value]
    return template


def _with_new_params(code: str, fresh: dict[str, str], specs) -> str:
    for name, default, low, high in specs:
        code = add_param(code, fresh[name], default, low, high)
    return code
