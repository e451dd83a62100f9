"""The program format's tunable parameters: one module-level `PARAMS` dict literal.

A program may declare `PARAMS = {"name": (default, low, high), ...}`. Everything
here works on the program's text and AST only (`ast.parse`, `ast.literal_eval`),
never by running it, because the code is untrusted. Edits splice a freshly
written `PARAMS` literal into the original text, so comments and layout
elsewhere in the program survive a round trip.
"""
from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

PARAMS_NAME = "PARAMS"


class ProgramFormatError(ValueError):
    """The program text breaks the format (unparsable, or a malformed PARAMS)."""


@dataclass(frozen=True)
class ParamSpec:
    """One tunable parameter: its current default and the closed range [low, high]."""

    name: str
    default: float
    low: float
    high: float


def read_params(code: str, tree: ast.Module | None = None) -> dict[str, ParamSpec]:
    """Parse the program's PARAMS into specs, in declaration order (`tree`: `code` already parsed).

    A missing PARAMS means no parameters. A default outside its range is clipped,
    since tuning may have drifted it; anything else malformed raises.
    """
    node = _params_node(tree if tree is not None else _parse(code))
    if node is None:
        return {}
    if not isinstance(node.value, ast.Dict):
        raise ProgramFormatError(f"{PARAMS_NAME} must be a dict literal")
    try:
        raw = ast.literal_eval(node.value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise ProgramFormatError(f"{PARAMS_NAME} is not a plain literal: {exc}") from None
    return {name: _spec(name, entry) for name, entry in raw.items()}


def write_params(code: str, values: dict[str, float]) -> str:
    """Return `code` with the named defaults replaced, clipped to range and rounded.

    Values are rounded to 6 significant digits so written-back programs stay
    readable; unknown names are an error, not silently ignored.
    """
    specs = read_params(code)
    unknown = sorted(set(values) - set(specs))
    if unknown:
        raise KeyError(f"no such parameters in {PARAMS_NAME}: {', '.join(unknown)}")
    for name, value in values.items():
        spec = specs[name]
        specs[name] = ParamSpec(name, _clip(value, spec.low, spec.high), spec.low, spec.high)
    return write_param_specs(code, specs)


def write_param_specs(code: str, specs: dict[str, ParamSpec]) -> str:
    """Replace the whole PARAMS literal with `specs` (creating it if missing)."""
    for spec in specs.values():
        _check_range(spec.name, spec.low, spec.high)
    tree = _parse(code)
    node = _params_node(tree)
    literal = _format_params(specs)
    if node is None:
        return _insert_params(code, tree, literal)
    start = _offset(code, node.value.lineno, node.value.col_offset)
    end = _offset(code, node.value.end_lineno, node.value.end_col_offset)
    return code[:start] + literal + code[end:]


def add_param(code: str, name: str, default: float, low: float, high: float) -> str:
    """Declare a new parameter (creating PARAMS if missing); the name must be new."""
    specs = read_params(code)
    if name in specs:
        raise ValueError(f"parameter {name!r} already exists in {PARAMS_NAME}")
    _check_range(name, low, high)
    specs[name] = ParamSpec(name, _clip(default, low, high), float(low), float(high))
    return write_param_specs(code, specs)


def unique_param_name(code: str, prefix: str) -> str:
    """`prefix` itself if unused in PARAMS, else the first free `prefix_2`, `prefix_3`..."""
    taken = set(read_params(code))
    if prefix not in taken:
        return prefix
    suffix = 2
    while f"{prefix}_{suffix}" in taken:
        suffix += 1
    return f"{prefix}_{suffix}"


def entry_point_ok(code: str, name: str) -> bool:
    """True when the module parses and defines a top-level function `name`."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return any(isinstance(stmt, ast.FunctionDef) and stmt.name == name for stmt in tree.body)


def _parse(code: str) -> ast.Module:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ProgramFormatError(f"the program does not parse: {exc}") from None


def _params_node(tree: ast.Module) -> ast.Assign | ast.AnnAssign | None:
    """The last module-level assignment to PARAMS (the one that wins at import)."""
    found = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(_is_params(t) for t in stmt.targets):
            if len(stmt.targets) != 1:
                raise ProgramFormatError(f"{PARAMS_NAME} must be assigned on its own")
            found = stmt
        elif isinstance(stmt, ast.AnnAssign) and _is_params(stmt.target) and stmt.value:
            found = stmt
    return found


def _is_params(target: ast.expr) -> bool:
    return isinstance(target, ast.Name) and target.id == PARAMS_NAME


def _spec(name, entry) -> ParamSpec:
    if not isinstance(name, str) or not name.isidentifier():
        raise ProgramFormatError(f"{PARAMS_NAME} key {name!r} must be an identifier string")
    if not isinstance(entry, (tuple, list)) or len(entry) != 3:
        raise ProgramFormatError(f"{PARAMS_NAME}[{name!r}] must be (default, low, high)")
    if not all(_is_number(x) for x in entry):
        raise ProgramFormatError(f"{PARAMS_NAME}[{name!r}] must hold three finite numbers")
    default, low, high = (float(x) for x in entry)
    _check_range(name, low, high)
    return ParamSpec(name, _clip(default, low, high), low, high)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_range(name: str, low: float, high: float) -> None:
    if not (_is_number(low) and _is_number(high)):
        raise ProgramFormatError(f"parameter {name!r} needs finite numeric bounds")
    if low > high:
        raise ProgramFormatError(f"parameter {name!r} has low {low} > high {high}")


def _clip(value: float, low: float, high: float) -> float:
    """Clip into [low, high] and round to 6 significant digits, staying in range."""
    if not _is_number(value):
        raise ProgramFormatError(f"parameter value {value!r} is not a finite number")
    rounded = float(f"{min(max(float(value), low), high):.6g}")
    return min(max(rounded, float(low)), float(high))


def _format_params(specs: dict[str, ParamSpec]) -> str:
    """A dict literal, one entry per line when there are several."""
    entries = [f'"{s.name}": ({s.default!r}, {float(s.low)!r}, {float(s.high)!r})'
               for s in specs.values()]
    if len(entries) <= 1:
        return "{" + ", ".join(entries) + "}"
    return "{\n" + "".join(f"    {e},\n" for e in entries) + "}"


def _insert_params(code: str, tree: ast.Module, literal: str) -> str:
    """Place a new PARAMS after the docstring and imports, before everything else."""
    line = 0
    for index, stmt in enumerate(tree.body):
        is_doc = index == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        if not (is_doc or isinstance(stmt, (ast.Import, ast.ImportFrom))):
            break
        line = stmt.end_lineno
    lines = _lines(code)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    block = ("\n" if line else "") + f"{PARAMS_NAME} = {literal}\n\n"
    return "".join(lines[:line]) + block + "".join(lines[line:])


def _offset(code: str, lineno: int, col_byte: int) -> int:
    """Character offset of an AST (line, utf-8 byte column) position in `code`."""
    lines = _lines(code)
    before = sum(len(text) for text in lines[:lineno - 1])
    return before + len(lines[lineno - 1].encode()[:col_byte].decode())


def _lines(code: str) -> list[str]:
    """Split lines the way the tokenizer counts them (not str.splitlines' wider set)."""
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", code)
