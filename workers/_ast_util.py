"""Small syntax-tree helpers shared by the embedded mutation operators.

They inspect and rebuild program trees; nothing here runs the program.
"""
from __future__ import annotations

import ast
import builtins
import math

from evaluators.params import read_params

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def parse_function(code: str, entry_point: str) -> tuple[ast.Module, ast.FunctionDef] | None:
    """The module tree and its top-level `entry_point` def, or None if either is missing."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == entry_point:
            return tree, stmt
    return None


def body_nodes(fn: ast.FunctionDef):
    """Every node in the function body, without descending into nested scopes."""
    stack = list(reversed(fn.body))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(reversed(list(ast.iter_child_nodes(node))))


def parents(root: ast.AST) -> dict[int, ast.AST]:
    """Map id(child) -> parent for every node under `root`."""
    return {id(child): node for node in ast.walk(root) for child in ast.iter_child_nodes(node)}


def replace(root: ast.AST, old: ast.AST, new: ast.AST) -> None:
    """Put `new` where `old` sits (by identity) anywhere under `root`."""
    for node in ast.walk(root):
        for field, value in ast.iter_fields(node):
            if value is old:
                setattr(node, field, new)
                return
            if isinstance(value, list) and any(item is old for item in value):
                value[[id(item) for item in value].index(id(old))] = new
                return
    raise LookupError("node to replace is not in the tree")


def returns(fn: ast.FunctionDef) -> list[ast.Return]:
    """The function's own `return <value>` statements."""
    return [node for node in body_nodes(fn) if isinstance(node, ast.Return) and node.value]


def arg_name(fn: ast.FunctionDef, index: int, fallback: str) -> str:
    """Name of the function's positional argument `index` (state=0, params=1)."""
    args = fn.args.posonlyargs + fn.args.args
    return args[index].arg if len(args) > index else fallback


def param_ref(fn: ast.FunctionDef, name: str) -> ast.Subscript:
    """The expression `params["name"]`, using the function's own argument name."""
    params = ast.Name(id=arg_name(fn, 1, "params"), ctx=ast.Load())
    return ast.Subscript(value=params, slice=ast.Constant(name), ctx=ast.Load())


def numpy_alias(tree: ast.Module) -> str:
    """The name numpy is imported as, adding `import numpy as np` when it is absent."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name == "numpy":
                    return alias.asname or "numpy"
    tree.body.insert(0, ast.Import(names=[ast.alias(name="numpy", asname="np")]))
    return "np"


def np_call(alias: str, func: str, *args: ast.expr) -> ast.Call:
    """The expression `<alias>.<func>(*args)`."""
    target = ast.Attribute(value=ast.Name(id=alias, ctx=ast.Load()), attr=func, ctx=ast.Load())
    return ast.Call(func=target, args=list(args), keywords=[])


def is_np_call(node: ast.AST, funcs: set[str]) -> bool:
    """True for a call like `np.minimum(...)` whose attribute name is in `funcs`."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.attr in funcs)


def is_number(node: ast.AST) -> bool:
    """A numeric literal (bools excluded)."""
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool))


def signed_number(node: ast.AST) -> int | float | None:
    """The value of a numeric literal, or of one with a unary minus (`-1`); None for anything else."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and is_number(node.operand):
        return -node.operand.value
    return node.value if is_number(node) else None


def magnitude(code: str, fn: ast.FunctionDef) -> float:
    """A typical size of the program's quantities, to scale new parameters' ranges.

    The median of the nonzero literals and parameter defaults: unlike a maximum
    (or the ranges) it does not snowball as operators add parameters scaled by it.
    """
    values = [abs(node.value) for node in body_nodes(fn) if is_number(node)]
    values += [abs(spec.default) for spec in read_params(code).values()]
    sizes = sorted(v for v in values if v > 0 and math.isfinite(v))
    return float(f"{max(sizes[len(sizes) // 2] if sizes else 1.0, 1.0):.3g}")


def local_names(fn: ast.FunctionDef) -> list[str]:
    """Variables the function assigns, in first-assignment order."""
    names = [node.id for node in body_nodes(fn)
             if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)]
    return list(dict.fromkeys(names))


def defined_names(tree: ast.Module, fn: ast.FunctionDef) -> set[str]:
    """Names a copied expression may use safely inside `fn`."""
    module = {node.id for stmt in tree.body for node in ast.walk(stmt)
              if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    module |= {stmt.name for stmt in tree.body if isinstance(stmt, (ast.FunctionDef, ast.ClassDef))}
    module |= {(a.asname or a.name).split(".")[0] for stmt in tree.body
               if isinstance(stmt, (ast.Import, ast.ImportFrom)) for a in stmt.names}
    args = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    return module | args | set(local_names(fn)) | set(dir(builtins))


def read_before_assignment(tree: ast.Module, fn: ast.FunctionDef) -> set[str]:
    """Names a statement of `fn`'s body reads that nothing defines before it (or at all).

    The statements of a loop, an if, a with or a try are followed one by one (a loop's body as on
    its first pass: `stock = stock + x` in it needs a `stock` before the loop); after an if or a
    try, a name either part assigns counts as defined; an assignment's value is read before its
    targets are assigned. Any other statement (a nested def, a match) may read what it assigns
    itself; that is left to the program's own run.
    """
    missing: set[str] = set()
    _block(fn.body, defined_names(tree, fn) - set(local_names(fn)), missing)
    return missing


_BLOCKS = {ast.For: ("iter", "target"), ast.AsyncFor: ("iter", "target"), ast.While: ("test", None),
           ast.If: ("test", None), ast.With: ("items", None), ast.AsyncWith: ("items", None), ast.Try: (None, None)}


def _block(stmts: list[ast.stmt], known: set[str], missing: set[str]) -> None:
    """Follow `stmts` in order: add to `missing` what each reads before `known` has it; `known` grows."""
    for stmt in stmts:
        if type(stmt) in _BLOCKS:
            _compound(stmt, known, missing)
        elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
            _read(stmt.value, known, missing)  # evaluated before its targets are assigned
            if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                missing |= {stmt.target.id} - known
            _read(stmt, known, missing)
        else:
            _read(stmt, known, missing)


def _compound(stmt: ast.stmt, known: set[str], missing: set[str]) -> None:
    head, target = _BLOCKS[type(stmt)]
    for part in getattr(stmt, head) if head == "items" else [getattr(stmt, head)] if head else []:
        _read(part, known, missing)  # a with's items store their `as` names too
    if target:
        known |= _stored(getattr(stmt, target))
    parts = [stmt.body, getattr(stmt, "orelse", [])] + [h.body for h in getattr(stmt, "handlers", [])]
    after = set(known)
    for part in parts:
        inner = set(known) | {h.name for h in getattr(stmt, "handlers", []) if h.name}
        _block(part, inner, missing)
        after |= inner
    _block(getattr(stmt, "finalbody", []), after, missing)
    known |= after


def _read(node: ast.AST, known: set[str], missing: set[str]) -> None:
    """`node` as one step: what it reads beyond `known` and what it assigns itself is missing; then
    what it assigns is known."""
    stored = _stored(node)
    missing |= used_names(node) - known - stored
    known |= stored


def _stored(node: ast.AST) -> set[str]:
    """Names `node` assigns anywhere in it: targets, loop and comprehension variables, lambda and nested
    functions' arguments, nested functions and classes."""
    stored = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    stored |= {n.arg for n in ast.walk(node) if isinstance(n, ast.arg)}  # lambdas, nested functions
    return stored | {n.name for n in ast.walk(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def used_names(node: ast.AST) -> set[str]:
    """Names an expression or statement reads."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def param_keys(node: ast.AST, params_arg: str) -> list[str]:
    """Keys `k` of every `params["k"]` read under `node`."""
    keys = [n.slice.value for n in ast.walk(node)
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
            and n.value.id == params_arg and isinstance(n.slice, ast.Constant)
            and isinstance(n.slice.value, str)]
    return list(dict.fromkeys(keys))


def round6(value: float) -> float:
    """Round to 6 significant digits, the precision programs carry."""
    return float(f"{value:.6g}")
