"""The embedded mutator's operators: small, seeded edits of a program's syntax tree.

Each operator takes the parent's code and an `OpContext` and returns the child's
code, or None when it does not apply to this program (the mutator then retries).
Operators only rewrite text and trees; none of them runs the program. Validity
(parses, keeps the entry point, differs from the parent) is checked by the caller.
"""
from __future__ import annotations

import ast
import copy
from dataclasses import astuple, dataclass
from typing import Callable

import numpy as np

from evaluators.params import ParamSpec, add_param, read_params, unique_param_name, write_param_specs
from workers import _ast_util as u


@dataclass(frozen=True)
class Motif:
    """A domain idiom: `template` wraps `{expr}` (the return expression) using fresh
    parameters `{p0}`, `{p1}`... declared by `params` as (name, default, low, high)."""

    name: str
    template: str
    params: tuple[tuple[str, float, float, float], ...] = ()


@dataclass(frozen=True)
class OpContext:
    """Everything an operator may use besides the parent's code."""

    entry_point: str
    rng: np.random.Generator
    const_scale: float = 0.3
    inspirations: tuple[str, ...] = ()
    motifs: tuple[Motif, ...] = ()
    # The least and greatest value the entry point may return (None: no bound), from the domain:
    # a number an operator writes that the program returns as it is (a new parameter's range, a
    # nudged literal) stays inside them, so tuning trials are not spent on values the domain refuses.
    bounds: tuple[float | None, float | None] = (None, None)


def _clip(value: float, bounds: tuple[float | None, float | None]) -> float:
    lo, hi = bounds
    value = max(value, lo) if lo is not None else value
    return min(value, hi) if hi is not None else value


def _within(spec: tuple[str, float, float, float], bounds: tuple[float | None, float | None]):
    """`spec` (name, default, low, high) with its range cut to `bounds`, its default inside; as it
    was where the cut would leave nothing."""
    name, default, low, high = spec
    low, high = _clip(low, bounds), _clip(high, bounds)
    if not low < high:
        return spec
    return name, min(max(default, low), high), low, high


# np functions that return one of their arguments, element by element: (name, which arguments)
_PASS_THROUGH = {"maximum": slice(None), "minimum": slice(None), "clip": slice(None), "where": slice(1, 3)}


def _returned(fn: ast.FunctionDef) -> list[ast.expr]:
    """What the function can return as it is: each return's value and, where that is
    np.maximum, np.minimum, np.clip or np.where, the arguments it passes through."""
    out = []
    for ret in u.returns(fn):
        out.append(ret.value)
        if u.is_np_call(ret.value, set(_PASS_THROUGH)):
            out += ret.value.args[_PASS_THROUGH[ret.value.func.attr]]
    return out


def _pick(ctx: OpContext, items: list):
    return items[int(ctx.rng.integers(len(items)))] if items else None


def _with_params(code: str, new: list[tuple[str, float, float, float]]) -> str:
    for name, default, low, high in new:
        code = add_param(code, name, default, low, high)
    return code


def perturb_const(code: str, ctx: OpContext) -> str | None:
    """Nudge one numeric literal of the function body, or one PARAMS default or range."""
    loaded = u.parse_function(code, ctx.entry_point)
    if loaded is None:
        return None
    tree, fn = loaded
    sites = _const_sites(fn)
    specs = read_params(code)
    choice = int(ctx.rng.integers(len(sites) + 2 * len(specs))) if sites or specs else None
    if choice is None:
        return None
    returned = _returned(fn)
    if choice < len(sites):
        node = sites[choice]
        value = u.round6(_nudge(float(node.value), ctx))
        if any(node is r for r in returned):  # e.g. the 0.0 of np.maximum(..., 0.0)
            value = _clip(value, ctx.bounds)
        node.value = value
        return ast.unparse(tree)
    spec = list(specs.values())[(choice - len(sites)) // 2]
    changer = _nudge_default if (choice - len(sites)) % 2 == 0 else _rescale_range
    changed = changer(spec, ctx)
    ref = ast.dump(u.param_ref(fn, spec.name))
    if any(ast.dump(r) == ref for r in returned):  # a returned value, as a new parameter's
        changed = ParamSpec(*_within(astuple(changed), ctx.bounds))
    specs[spec.name] = changed
    return write_param_specs(code, specs)


def _const_sites(fn: ast.FunctionDef) -> list[ast.Constant]:
    """Literals safe to change: not indices, not keyword values, not integer call args."""
    parent = u.parents(fn)
    sites = []
    for node in u.body_nodes(fn):
        if not u.is_number(node):
            continue
        above = parent.get(id(node))
        if isinstance(above, ast.UnaryOp):
            above = parent.get(id(above))
        if isinstance(above, (ast.keyword, ast.Subscript, ast.Slice)):
            continue
        if isinstance(node.value, int) and (_in_index(node, parent) or _call_arg(above, parent)
                                            or _in_sized_call(node, parent)):
            continue
        sites.append(node)
    return sites


def _in_index(node: ast.AST, parent: dict) -> bool:
    """Whether `node` lies inside a subscript's index (as the 2 of `obs[:, 2]` or the 1 of `x[i + 1]`):
    an integer there must stay one, as a float index raises."""
    while (above := parent.get(id(node))) is not None:
        if isinstance(above, ast.Subscript) and node is above.slice:
            return True
        node = above
    return False


def _in_sized_call(node: ast.AST, parent: dict) -> bool:
    """Whether `node` lies inside an argument of a call that takes sizes or indices (the 1 of
    `np.take_along_axis(x, (n - 1)[:, None], axis=1)`): an integer there must stay one."""
    while (above := parent.get(id(node))) is not None:
        func = getattr(above, "func", None)
        if isinstance(above, ast.Call) and any(node is arg for arg in above.args) and (
                getattr(func, "attr", None) or getattr(func, "id", None)) in _SIZED:
            return True
        node = above
    return False


def _call_arg(above: ast.AST | None, parent: dict) -> bool:
    """Whether a literal below `above` is a call's argument, itself or in a tuple or list of them (a shape)."""
    if isinstance(above, (ast.Tuple, ast.List)):
        above = parent.get(id(above))
    return isinstance(above, ast.Call)


def _nudge(value: float, ctx: OpContext) -> float:
    step = ctx.const_scale * float(ctx.rng.standard_normal())
    return value * (1.0 + step) if value != 0 else step


def _nudge_default(spec: ParamSpec, ctx: OpContext) -> ParamSpec:
    width = max(abs(spec.default), 0.1 * (spec.high - spec.low), 1e-6)
    value = spec.default + ctx.const_scale * width * float(ctx.rng.standard_normal())
    value = u.round6(min(max(value, spec.low), spec.high))
    return ParamSpec(spec.name, value, spec.low, spec.high)


def _rescale_range(spec: ParamSpec, ctx: OpContext) -> ParamSpec:
    """Grow or shrink the range around the default, which stays inside it."""
    factor = float(np.exp(ctx.const_scale * ctx.rng.standard_normal()))
    low = u.round6(spec.default - (spec.default - spec.low) * factor)
    high = u.round6(spec.default + (spec.high - spec.default) * factor)
    return ParamSpec(spec.name, spec.default, min(low, spec.default), max(high, spec.default))


_BIN_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Div: ast.Mult,
              ast.LShift: ast.RShift, ast.RShift: ast.LShift}
_CMP_SWAPS = {ast.LtE: ast.GtE, ast.GtE: ast.LtE, ast.Lt: ast.Gt, ast.Gt: ast.Lt}
_NP_SWAPS = {"minimum": "maximum", "maximum": "minimum"}


def swap_operator(code: str, ctx: OpContext) -> str | None:
    """Flip one operator: + and -, / to * (and * to / by a nonzero literal), << and >>,
    <= and >=, < and >, np.minimum and np.maximum."""
    loaded = u.parse_function(code, ctx.entry_point)
    if loaded is None:
        return None
    tree, fn = loaded
    sites = [(node, i) for node in u.body_nodes(fn) for i in _swap_slots(node)]
    site = _pick(ctx, sites)
    if site is None:
        return None
    node, slot = site
    if isinstance(node, ast.BinOp):
        node.op = ast.Div() if isinstance(node.op, ast.Mult) else _BIN_SWAPS[type(node.op)]()
    elif isinstance(node, ast.Compare):
        node.ops[slot] = _CMP_SWAPS[type(node.ops[slot])]()
    else:
        node.func.attr = _NP_SWAPS[node.func.attr]
    return ast.unparse(tree)


def _swap_slots(node: ast.AST) -> list[int]:
    if isinstance(node, ast.BinOp):
        safe_div = (isinstance(node.op, ast.Mult) and u.is_number(node.right)
                    and node.right.value != 0)
        return [0] if type(node.op) in _BIN_SWAPS or safe_div else []
    if isinstance(node, ast.Compare):
        return [i for i, op in enumerate(node.ops) if type(op) in _CMP_SWAPS]
    return [0] if u.is_np_call(node, set(_NP_SWAPS)) else []


def wrap_clip(code: str, ctx: OpContext) -> str | None:
    """Bound one sub-expression with np.minimum or np.maximum and a new parameter."""
    loaded = u.parse_function(code, ctx.entry_point)
    if loaded is None:
        return None
    tree, fn = loaded
    target = _pick(ctx, _value_sites(fn))
    if target is None:
        return None
    scale = u.magnitude(code, fn)
    upper = bool(ctx.rng.integers(2))
    name = unique_param_name(code, "cap" if upper else "floor")
    default = scale if upper else 0.0
    wrapped = u.np_call(u.numpy_alias(tree), "minimum" if upper else "maximum",
                        copy.deepcopy(target), u.param_ref(fn, name))
    u.replace(fn, target, wrapped)
    spec = (name, default, -4.0 * scale, 4.0 * scale)
    if any(node is wrapped for node in _returned(fn)):  # the bound is then a value returned as it is
        spec = _within(spec, ctx.bounds)
    return _with_params(ast.unparse(tree), [spec])


def _value_sites(fn: ast.FunctionDef) -> list[ast.expr]:
    """Numeric sub-expressions worth bounding: arithmetic, calls, local variables, returns; not one
    that may hold several values a row (a parameter is one value a row: `np.minimum` of the two
    cannot broadcast), nor a count, size or index (`len(x)`, `np.zeros(n)`: a float bound breaks it)."""
    locals_ = set(u.local_names(fn))
    parent = u.parents(fn)
    wide, matrices = _wide(fn), _matrices(fn, u.arg_name(fn, 0, "state"))
    sites = []
    for node in u.body_nodes(fn):
        above = parent.get(id(node))
        if isinstance(above, (ast.Attribute, ast.Subscript, ast.keyword)) or (
                isinstance(above, ast.Call) and above.func is node):
            continue
        if id(node) in wide or ast.dump(node) in matrices or _integral(node, above, parent):
            continue
        is_local = isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in locals_
        if is_local or isinstance(node, (ast.BinOp, ast.Call)):
            sites.append(node)
    return sites


_SIZED = {"zeros", "ones", "empty", "full", "arange", "eye", "identity", "reshape", "tile", "repeat",
          "take_along_axis", "range"}  # calls whose arguments (after the array) are counts, shapes or indices


def _integral(node: ast.AST, above: ast.AST | None, parent: dict) -> bool:
    """Whether `node` is a count or index: `len(...)`, within a subscript's index, or an argument of a
    call that takes sizes or indices (np.zeros(n), np.take_along_axis(x, i, axis=1))."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
        return True
    name = getattr(getattr(above, "func", None), "attr", None) or getattr(getattr(above, "func", None), "id", None)
    return _in_index(node, parent) or (isinstance(above, ast.Call) and name in _SIZED)


def _wide(fn: ast.FunctionDef) -> set[int]:
    """ids of the expressions that may hold several values a row: a column made of per-row values
    (np.reshape(x, (-1, 1)), x[:, None], np.expand_dims, np.outer), a range along a row (np.arange)
    and what combines one, up to a reduction along an axis (`.sum(axis=1)`) or a pick of one column
    (`x[:, 0]`); a local assigned one is one too."""
    wide: set[int] = set()
    names: set[str] = set()

    def visit(node: ast.AST) -> bool:
        inner = [visit(child) for child in ast.iter_child_nodes(node)]
        if isinstance(node, ast.Assign) and id(node.value) in wide:
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.Call) and any(k.arg == "axis" for k in node.keywords) or _column(node):
            return False
        made = _makes_column(node) or (isinstance(node, ast.Name) and node.id in names) or (
            isinstance(node, ast.expr) and not isinstance(node, ast.Name) and any(inner))
        if made:
            wide.add(id(node))
        return made

    for stmt in fn.body:
        visit(stmt)
    return wide


def _makes_column(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        return name in ("reshape", "expand_dims", "outer", "atleast_2d", "column_stack", "arange", "linspace")
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) and any(
        isinstance(e, ast.Constant) and e.value is None for e in node.slice.elts)


def add_branch(code: str, ctx: OpContext) -> str | None:
    """Wrap a return as `np.where(<state-derived value> <op> threshold, expr, alt)`."""
    loaded = u.parse_function(code, ctx.entry_point)
    if loaded is None:
        return None
    tree, fn = loaded
    ret, subject = _pick(ctx, u.returns(fn)), _pick(ctx, _branch_subjects(fn))
    if ret is None or subject is None:
        return None
    scale = u.magnitude(code, fn)
    gate = unique_param_name(code, "gate")
    alt_name = unique_param_name(code, "alt")
    cmp_op = ast.Gt() if ctx.rng.integers(2) else ast.Lt()
    cond = ast.Compare(left=subject, ops=[cmp_op], comparators=[u.param_ref(fn, gate)])
    alt, alt_spec = _branch_alternative(fn, ret.value, alt_name, scale, ctx)
    ret.value = u.np_call(u.numpy_alias(tree), "where", cond, ret.value, alt)
    gate_spec = (gate, u.round6(ctx.rng.uniform(0.0, scale)), -4.0 * scale, 4.0 * scale)
    return _with_params(ast.unparse(tree), [gate_spec, alt_spec])


def _branch_subjects(fn: ast.FunctionDef) -> list[ast.expr]:
    """Local variables, state entries used directly (not only via methods like .sum, or len) and columns
    `x[:, 3]`, which are likely one value per trajectory; not what the function indexes by row and
    column (a matrix, as trading's close prices: comparing it gives one value per cell), nor what
    reads a comprehension's own variable."""
    state = u.arg_name(fn, 0, "state")
    parent = u.parents(fn)
    subjects = [ast.Name(id=name, ctx=ast.Load()) for name in u.local_names(fn)]
    for node in u.body_nodes(fn):
        above = parent.get(id(node))
        direct = not isinstance(above, ast.Attribute) and not (  # nor its size alone: len(state["close"])
            isinstance(above, ast.Call) and isinstance(above.func, ast.Name) and above.func.id == "len")
        entry = isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == state
        if (entry and direct) or _column(node):
            subjects.append(copy.deepcopy(node))
    matrices, inner = _matrices(fn, state), _comprehension_names(fn)
    return [s for key, s in {ast.dump(s): s for s in subjects}.items()
            if key not in matrices and not u.used_names(s) & inner]


def _comprehension_names(fn: ast.FunctionDef) -> set[str]:
    """Names bound only by a comprehension's `for`, unknown where the return reads its value."""
    inner = {n.id for node in u.body_nodes(fn) if isinstance(node, ast.comprehension)
             for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    outside = {n.id for stmt in fn.body for n in _outside_comprehensions(stmt)
               if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return inner - outside


def _outside_comprehensions(node: ast.AST):
    """The nodes under `node`, not descending into comprehensions."""
    yield node
    if not isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        for child in ast.iter_child_nodes(node):
            yield from _outside_comprehensions(child)


def _column(node: ast.AST) -> bool:
    """`x[:, k]` with a literal k: one value per row."""
    index = node.slice if isinstance(node, ast.Subscript) else None
    return (isinstance(index, ast.Tuple) and len(index.elts) == 2 and isinstance(index.elts[0], ast.Slice)
            and not any((index.elts[0].lower, index.elts[0].upper, index.elts[0].step))
            and isinstance(u.signed_number(index.elts[1]), int))


def _matrices(fn: ast.FunctionDef, state: str) -> set[str]:
    """Dumps of the expressions the function indexes by row and column (`close[:, -1]`) or multiplies
    as matrices, of locals made as lists, and of the state entries a matrix is made from
    (`close = state["close"].astype(float)`)."""
    found = {ast.dump(node.value) for node in u.body_nodes(fn)
             if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple)}
    found |= {ast.dump(side) for node in u.body_nodes(fn)  # obs @ weights: neither is one value a row
              if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) for side in (node.left, node.right)}
    found |= {ast.dump(t) for node in u.body_nodes(fn) if isinstance(node, ast.Assign)  # scores = [...]: a list
              and isinstance(node.value, (ast.List, ast.ListComp, ast.Tuple, ast.Dict)) for t in _loads(node.targets)}
    for node in u.body_nodes(fn):
        if isinstance(node, ast.Assign) and any(ast.dump(t) in found for t in _loads(node.targets)):
            source = node.value
            while isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute):
                source = source.func.value  # .astype(...), .copy()
            if isinstance(source, ast.Subscript) and isinstance(source.value, ast.Name) and source.value.id == state:
                found.add(ast.dump(source))
    return found


def _loads(targets: list[ast.expr]) -> list[ast.Name]:
    """Assignment targets that are plain names, as the expressions that read them."""
    return [ast.Name(id=t.id, ctx=ast.Load()) for t in targets if isinstance(t, ast.Name)]


def _branch_alternative(fn, expr, name, scale, ctx):
    """The other arm: the expression scaled by a new factor, or a new constant level (returned,
    so its range stays inside the domain's bounds)."""
    if ctx.rng.integers(2):
        alt = ast.BinOp(left=copy.deepcopy(expr), op=ast.Mult(), right=u.param_ref(fn, name))
        return alt, (name, 1.0, 0.0, 3.0)
    level = (name, u.round6(ctx.rng.uniform(0.0, scale)), -4.0 * scale, 4.0 * scale)
    return u.param_ref(fn, name), _within(level, ctx.bounds)


def remove_branch(code: str, ctx: OpContext) -> str | None:
    """Drop an `if` (keeping one arm, or nothing) or collapse np.where / a ternary to one arm."""
    loaded = u.parse_function(code, ctx.entry_point)
    if loaded is None:
        return None
    tree, fn = loaded
    sites = [n for n in u.body_nodes(fn) if isinstance(n, (ast.If, ast.IfExp))
             or (u.is_np_call(n, {"where"}) and len(n.args) == 3 and not n.keywords)]
    node = _pick(ctx, sites)
    if node is None:
        return None
    if isinstance(node, ast.If):
        return _drop_if(tree, fn, node, ctx)
    arms = [node.body, node.orelse] if isinstance(node, ast.IfExp) else node.args[1:]
    u.replace(fn, node, arms[int(ctx.rng.integers(2))])
    return ast.unparse(tree)


def _drop_if(tree, fn, node: ast.If, ctx: OpContext) -> str | None:
    for holder in u.body_nodes(fn) if node not in fn.body else [fn]:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(holder, field, None)
            if isinstance(block, list) and any(stmt is node for stmt in block):
                index = [id(stmt) for stmt in block].index(id(node))
                options = [node.body, node.orelse] if node.orelse else [node.body, []]
                chosen = options[int(ctx.rng.integers(2))]
                if len(block) == 1 and not chosen:
                    chosen = node.body
                block[index:index + 1] = chosen
                return ast.unparse(tree)
    return None


def crossover(code: str, ctx: OpContext) -> str | None:
    """Replace one statement, or the return expression, with the matching part of an
    inspiration program's same-named function, bringing along the parameters it reads."""
    loaded, donor = u.parse_function(code, ctx.entry_point), _pick(ctx, list(ctx.inspirations))
    donor_loaded = u.parse_function(donor, ctx.entry_point) if donor else None
    if loaded is None or donor_loaded is None:
        return None
    tree, fn = loaded
    pairs = _crossover_pairs(fn, donor_loaded[1])
    pair = _pick(ctx, pairs)
    if pair is None:
        return None
    old, new = pair
    if not u.used_names(new) <= u.defined_names(tree, fn):
        return None
    brought = _donor_params(code, donor, new, u.arg_name(donor_loaded[1], 1, "params"))
    if brought is None:
        return None
    u.replace(fn, old, copy.deepcopy(new))
    return _with_params(ast.unparse(tree), brought)


def _crossover_pairs(fn, donor_fn) -> list[tuple[ast.AST, ast.AST]]:
    own, theirs = u.returns(fn), u.returns(donor_fn)
    pairs = [(r.value, d.value) for r in own[-1:] for d in theirs]
    pairs += [(stmt, other) for stmt in fn.body for other in donor_fn.body
              if type(stmt) is type(other) and not isinstance(stmt, ast.Return)]
    return [(a, b) for a, b in pairs if ast.dump(a) != ast.dump(b)]


def _donor_params(code, donor, node, params_arg):
    """Specs of parameters `node` reads that the parent lacks; None if the donor lacks one."""
    have, donor_specs = read_params(code), read_params(donor)
    needed = [k for k in u.param_keys(node, params_arg) if k not in have]
    if any(k not in donor_specs for k in needed):
        return None
    return [(k, donor_specs[k].default, donor_specs[k].low, donor_specs[k].high) for k in needed]


def insert_motif(code: str, ctx: OpContext) -> str | None:
    """Apply one of the domain's motifs to a return expression, declaring its parameters."""
    loaded, motif = u.parse_function(code, ctx.entry_point), _pick(ctx, list(ctx.motifs))
    if loaded is None or motif is None:
        return None
    tree, fn = loaded
    ret = _pick(ctx, u.returns(fn))
    if ret is None:
        return None
    u.numpy_alias(tree)  # motif templates spell numpy as np
    new_params, names, current = [], {}, code
    for index, (name, default, low, high) in enumerate(motif.params):
        fresh = unique_param_name(current, name)
        current = add_param(current, fresh, default, low, high)
        names[f"p{index}"] = fresh
        new_params.append((fresh, default, low, high))
    ret.value = ast.parse(motif.template.format(expr=ast.unparse(ret.value), **names), mode="eval").body
    return _with_params(ast.unparse(tree), new_params)


Operator = Callable[[str, OpContext], "str | None"]

OPERATORS: dict[str, Operator] = {
    "perturb_const": perturb_const,
    "swap_operator": swap_operator,
    "wrap_clip": wrap_clip,
    "add_branch": add_branch,
    "remove_branch": remove_branch,
    "crossover": crossover,
    "insert_motif": insert_motif,
}
