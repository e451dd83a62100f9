"""Turning an untrusted model reply into a child program, as text only (nothing is executed).

A reply holds SEARCH/REPLACE blocks or a whole program. Parsing tolerates the usual
variants: code fences around the blocks, 3 to 9 marker characters, spaces after
markers, a missing closing `>>>>>>> REPLACE`, and a search text whose indentation or
trailing whitespace differs from the parent's. Every way a reply can fail is an
`EditError` whose `status` is the llm_calls status and whose message is the reason
shown to the next prompt for the same parent.
"""
from __future__ import annotations

import ast
import functools
import re
import textwrap
from dataclasses import dataclass

from evaluators.params import ProgramFormatError, read_params
from workers._ast_util import param_keys
from workers.normal_form import form_of

UNPARSEABLE, DID_NOT_APPLY, INVALID_PROGRAM = "unparseable", "did_not_apply", "invalid_program"
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # control characters but tab and newline

# A marker's line may hold spaces around it but never spans lines: `^\s*` would try every run of
# blank lines from each of its starts, quadratic in a degenerate reply of newlines and spaces
_SPACE = r"[^\S\n]*"
_SEARCH = re.compile(rf"^{_SPACE}<{{3,9}}{_SPACE}SEARCH{_SPACE}$", re.M)
_DIVIDER = re.compile(rf"^{_SPACE}={{3,9}}{_SPACE}$", re.M)
_REPLACE = re.compile(rf"^{_SPACE}>{{3,9}}{_SPACE}(REPLACE)?{_SPACE}$", re.M)
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)(```|\Z)", re.S)  # the end: a fence, or none (cut off)


class EditError(Exception):
    """The reply gave no usable child; `status` is one of the three statuses above."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class Edit:
    """What a reply asks for: SEARCH/REPLACE pairs, or a whole new program."""

    kind: str  # "diff" or "rewrite"
    blocks: tuple[tuple[str, str], ...] = ()
    code: str = ""


_THINK, _THINK_END = re.compile(r"<think>", re.I), re.compile(r"</think>", re.I)


def answer_of(reply: str) -> str | None:
    """The reply without its reasoning: what follows its last `</think>` (a reasoning model drafts
    code before it, and some chat templates open the section in the prompt, so only its end is in
    the reply); the whole reply when it has none. None when a `<think>` opens and never closes:
    the reply is all reasoning (usually cut off at max_tokens)."""
    ends = list(_THINK_END.finditer(reply))
    if ends:
        return reply[ends[-1].end():]
    return None if _THINK.search(reply) else reply


def parse_reply(reply: str, entry_point: str) -> Edit:
    """The edit a reply's answer holds (`answer_of`): blocks if it has a SEARCH marker, else a
    program that defines `entry_point` (the last closed fence's, else the bare text). Raises
    EditError(UNPARSEABLE) when it holds neither. A server's CR LF (or lone CR) line ends are read as newlines."""
    text = answer_of(reply.replace("\r\n", "\n").replace("\r", "\n"))
    if text is None:
        raise EditError(UNPARSEABLE, "the reply ended inside its <think> section, before any answer")
    if _SEARCH.search(text):
        return Edit("diff", blocks=_blocks(text))
    programs = sorted(((bool(end), n, body) for n, (lang, body, end) in enumerate(_FENCE.findall(text))
                       if f"def {entry_point}" in body and lang.lower() in ("", "python", "py", "python3")))
    if programs:  # the last whole one: a reply shows the current program, or a draft, before its answer, and
        # one cut off at max_tokens ends in a block that never closed
        return Edit("rewrite", code=textwrap.dedent(programs[-1][2]))  # a fence in a list item is indented whole
    if re.search(rf"^def {re.escape(entry_point)}\s*\(", text, re.M) and _parses(text):
        return Edit("rewrite", code=text)
    raise EditError(UNPARSEABLE, "the reply has no SEARCH/REPLACE block and no program defining "
                                 f"{entry_point}() in a ```python block")


def _blocks(text: str) -> tuple[tuple[str, str], ...]:
    blocks = []
    starts = [m.end() for m in _SEARCH.finditer(text)] + [len(text)]
    for n, (start, next_start) in enumerate(zip(starts, starts[1:]), 1):
        chunk = text[start:next_start]
        divider = _DIVIDER.search(chunk)
        if divider is None:
            raise EditError(UNPARSEABLE, f"SEARCH block {n} has no ======= line between search and replacement")
        search, rest = chunk[:divider.start()], chunk[divider.end():]
        end = _REPLACE.search(rest)
        replace = rest[:end.start()] if end else _until_fence(rest)
        blocks.append((_trim(search), _trim(replace)))
    return tuple(blocks)


def _until_fence(text: str) -> str:
    """A replacement whose closing marker is missing ends at a closing fence or the text's end."""
    fence = re.search(rf"^{_SPACE}```{_SPACE}$", text, re.M)
    return text[:fence.start()] if fence else text


def _trim(text: str) -> str:
    """Drop the blank lines after a marker and the newline before the next, keeping indentation."""
    return _BLANK_LINES.sub("", text).rstrip("\n ")


_BLANK_LINES = re.compile(r"\A(?:[^\S\n]*\n)+")


def apply_edit(parent: str, edit: Edit) -> str:
    """The child text; raises EditError(DID_NOT_APPLY) when a search text is not in the parent."""
    if edit.kind == "rewrite":
        return edit.code.strip("\n") + "\n"
    child = parent
    for n, (search, replace) in enumerate(edit.blocks, 1):
        child = _replace_once(child, search, replace, n)
    return child


def _replace_once(code: str, search: str, replace: str, n: int) -> str:
    if not search.strip():
        raise EditError(DID_NOT_APPLY, f"SEARCH block {n} is empty")
    whole_lines = re.search(r"(?m)^" + re.escape(search) + r"(?=\n|\Z)", code)
    if whole_lines:
        return code[:whole_lines.start()] + replace + code[whole_lines.end():]
    lines, wanted = code.split("\n"), [s.strip() for s in search.split("\n")]
    for i in range(len(lines) - len(wanted) + 1):
        if [line.strip() for line in lines[i:i + len(wanted)]] == wanted:
            shift = _indent(lines[i]) - _indent(search.split("\n")[0])
            first = next((r for r in replace.split("\n") if r.strip()), "")
            if _indent(first) == _indent(lines[i]):  # the replacement is indented like the parent already
                shift = 0
            new = [_shift(r, shift) for r in replace.split("\n")]
            return "\n".join(lines[:i] + new + lines[i + len(wanted):])
    first = next((s for s in wanted if s), "")
    raise EditError(DID_NOT_APPLY, f"SEARCH block {n} does not match the parent (first line: {first[:80]!r})")


def _shift(line: str, by: int) -> str:
    """`line` indented `by` more spaces (fewer when negative, never cutting text)."""
    if by >= 0 or not line.strip():
        return " " * by + line if line.strip() else line
    return line[min(-by, _indent(line)):]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def check_child(child: str, parent: str, entry_point: str, tuned: bool = True) -> str:
    """The child's normal form (`workers.normal_form`) if it is valid Python that keeps the
    contract: `entry_point` at the top level with the parent's positional arity, returning a
    value, reading only the params that a well-formed PARAMS declares, and no call at the top
    level (it would run at load); else EditError(INVALID_PROGRAM). A child with the parent's
    normal form did not apply (EditError(DID_NOT_APPLY)); `tuned`: the domain tunes PARAMS, so the
    normal form leaves their defaults out. The child is parsed once; what the parent gives is kept
    for the next children of the same parent."""
    control = _CONTROL.search(child)
    if control:  # it would be printed to terminals as it is (controller.terminal writes it out, still)
        raise EditError(INVALID_PROGRAM, f"a control character (\\x{ord(control.group()):02x}) on line "
                                         f"{child.count(chr(10), 0, control.start()) + 1}: a program's text holds none "
                                         "but newline and tab (in a string, write it as an escape)")
    try:
        tree = ast.parse(child)
    except SyntaxError as exc:
        raise EditError(INVALID_PROGRAM, f"not valid Python: line {exc.lineno}: {exc.msg}") from None
    except (ValueError, MemoryError, RecursionError) as exc:
        raise EditError(INVALID_PROGRAM, f"not valid Python: {exc}") from None
    try:
        return _contract_form(tree, child, parent, entry_point, tuned)
    except RecursionError:  # the parser nests deeper than the recursive walks of the checks and the normal form
        raise EditError(INVALID_PROGRAM, "nested too deeply to check (an expression or block hundreds of "
                                         "levels deep): a policy needs no such nesting") from None


def _contract_form(tree: ast.Module, child: str, parent: str, entry_point: str, tuned: bool) -> str:
    """`check_child` past the parse: the contract's checks, then the normal form."""
    func = _function(tree, entry_point)
    if func is None:
        raise EditError(INVALID_PROGRAM, f"breaks the contract: no top-level def {entry_point}(...)")
    want, parent_form = _parent(parent, entry_point, tuned)
    if want is not None and _arity(func) != want:
        raise EditError(INVALID_PROGRAM, f"breaks the contract: {entry_point}() must take {want} "
                                         f"positional arguments, not {_arity(func)}")
    if not any(isinstance(node, ast.Return) and node.value is not None for node in ast.walk(func)):
        raise EditError(INVALID_PROGRAM, f"breaks the contract: {entry_point}() returns nothing")
    try:
        declared = read_params(child, tree)
    except ProgramFormatError as exc:
        raise EditError(INVALID_PROGRAM, f"breaks the contract: {exc}") from None
    undeclared = sorted(_params_read(func) - set(declared))
    if undeclared:
        raise EditError(INVALID_PROGRAM, f"breaks the contract: {entry_point}() reads params{undeclared} "
                                         "but PARAMS does not declare them")
    calls = [s.lineno for s in tree.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)]
    if calls:
        raise EditError(INVALID_PROGRAM, f"breaks the contract: a call at the top level (line {calls[0]}) "
                                         "would run when the program loads")
    form = form_of(tree, tuned)  # last: it normalises the tree in place
    if form == parent_form:
        which = "docstrings or PARAMS defaults differ, and tuning resets those" if tuned else "or docstrings differ"
        raise EditError(DID_NOT_APPLY, f"the edit leaves the program unchanged (only layout, comments, {which})")
    return form


@functools.lru_cache(maxsize=64)  # a worker's jobs share parents: the islands' best few are drawn often
def _parent(parent: str, entry_point: str, tuned: bool) -> tuple[int | None, str | None]:
    """(positional arity of the parent's entry point, the parent's normal form)."""
    try:
        tree = ast.parse(parent)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None, None
    return _arity(_function(tree, entry_point)), form_of(tree, tuned)


def _params_read(func: ast.FunctionDef) -> set[str]:
    """Keys the function reads as `params["name"]` (its second positional argument)."""
    args = func.args.posonlyargs + func.args.args
    return set(param_keys(func, args[1].arg)) if len(args) >= 2 else set()


def _function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == name), None)


def _arity(func: ast.FunctionDef | None) -> int | None:
    return None if func is None else len(func.args.posonlyargs) + len(func.args.args)


def child_from_reply(reply: str, parent: str, entry_point: str) -> tuple[str, str]:
    """(child code, edit kind) from a reply, or EditError with the status and the reason."""
    edit = parse_reply(reply, entry_point)
    child = apply_edit(parent, edit)
    check_child(child, parent, entry_point)
    return child, edit.kind
