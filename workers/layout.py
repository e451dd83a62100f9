"""A child written in its parent's own text wherever the two agree.

The embedded mutator edits syntax trees and writes the changed tree out whole (`ast.unparse`),
which drops the parent's comments and blank lines and rewrites its quotes: after one edit a
user's seed had lost every comment that said what its state fields mean, and a diff between
parent and child showed every line as changed. `keep_layout` rewrites the child so that every
statement it shares with the parent keeps the parent's text (comments and blank lines before
it included), and only the statements that changed take the child's text. A function whose
body changed keeps its own lines (decorators, signature, docstring) and is compared statement
by statement inside; so is an if, a loop or a with whose test or header and else part stayed.

The result is checked: its syntax tree must equal the child's, so what runs, and the child's
normal form, stay exactly the child's. Where the check fails (or the text has statements that
share a line), the child's own text is returned.
"""
from __future__ import annotations

import ast
import copy
import difflib
import functools
import io
import itertools
import tokenize
from dataclasses import dataclass, field

__all__ = ["keep_layout"]


def keep_layout(parent: str, child: str) -> str:
    """`child` in `parent`'s text wherever their statements agree; `child` itself when that fails."""
    view = _parent_view(parent)
    try:
        ctree = ast.parse(child)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return child
    if view is None:
        return child
    writer = _Writer(view, child.split("\n"))
    try:
        writer.body(view.tree.body, ctree.body, top=True)
    except _Shared:
        return child
    text = "\n".join(writer.out)
    try:  # statement by statement: the child's were dumped once already
        same = [ast.dump(s) for s in ast.parse(text).body] == writer.keys(ctree.body, writer.dumped)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        same = False
    return text if same else child


@dataclass(frozen=True)
class _Parent:
    """What keep_layout reads of a parent, kept for its next children (a worker's requests share
    parents: the islands' best few are drawn often)."""

    tree: ast.Module
    lines: list[str]
    double: bool  # writes its strings in double quotes
    dumped: dict = field(default_factory=dict)  # id of a statement -> its ast.dump


@functools.lru_cache(maxsize=32)
def _parent_view(parent: str) -> _Parent | None:
    try:
        return _Parent(ast.parse(parent), parent.split("\n"), _double_quoted(parent))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None


class _Shared(Exception):
    """Two statements on one line: the parent's text cannot be cut between them."""


class _Writer:
    """Walks both bodies in step, writing lines; `at` is the parent's next line not yet written (0-based)."""

    def __init__(self, parent: _Parent, child_lines: list[str]):
        self.parent, self.plines, self.clines = parent, parent.lines, child_lines
        self.out: list[str] = []
        self.at = 0
        self.dumped: dict[int, str] = {}  # the child's statements dumped so far, by id

    @staticmethod
    def keys(stmts: list[ast.stmt], dumped: dict[int, str]) -> list[str]:
        """Each statement's ast.dump, each dumped once."""
        for s in stmts:
            if id(s) not in dumped:
                dumped[id(s)] = ast.dump(s)
        return [dumped[id(s)] for s in stmts]

    def body(self, pstmts: list[ast.stmt], cstmts: list[ast.stmt], top: bool = False) -> None:
        _separate(pstmts)
        indent = _indent(self.plines[pstmts[0].lineno - 1]) if pstmts else ""
        keys = (self.keys(pstmts, self.parent.dumped), self.keys(cstmts, self.dumped))
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, *keys, autojunk=False).get_opcodes():
            if tag == "equal":
                for s in pstmts[i1:i2]:
                    self._parent_through(s.end_lineno)
                continue
            k = i1  # the block's first parent statement not yet matched
            for j in range(j1, j2):  # each child statement: the parent's counterpart of it, or new
                i = next((i for i in range(k, i2) if _counterparts(pstmts[i], cstmts[j])), None)
                if i is None:
                    self._child(cstmts[j], indent, cstmts[j - 1] if j else None)
                    continue
                self._drop(pstmts[k:i])
                self._replace(pstmts[i], cstmts[j], indent)
                k = i + 1
            self._drop(pstmts[k:i2])
        if top:  # what follows the last statement: trailing comments
            self.out.extend(self.plines[self.at:])
            self.at = len(self.plines)

    def _replace(self, p: ast.stmt, c: ast.stmt, indent: str) -> None:
        """A changed statement: the comments above it stay; a function, if, loop or with that changed only in
        its body keeps its own lines around that body, compared statement by statement; anything else
        takes the child's text."""
        self._parent_through(_start(p) - 1)  # the comments and blank lines above it
        if _same_but_body(p, c) and p.body and c.body:
            self._parent_through(p.body[0].lineno - 1)  # decorators, signature or test, lines before the body
            self.body(p.body, c.body)
            self._parent_through(p.end_lineno)  # an else part, the same in both
            return
        self._child(c, indent)
        self.at = max(self.at, p.end_lineno)

    def _drop(self, stmts: list[ast.stmt]) -> None:
        """Parent statements the child no longer has, with the comments above them."""
        if stmts:
            self.at = max(self.at, stmts[-1].end_lineno)

    def _parent_through(self, line: int) -> None:
        """The parent's lines up to `line` (1-based, inclusive)."""
        self.out.extend(self.plines[self.at:line])
        self.at = max(self.at, line)

    def _child(self, c: ast.stmt, indent: str, after: ast.stmt | None = None) -> None:
        """The child's text of a statement, moved to the parent's indentation of its body; a new one
        (`after` the child's statement before it) with the blank lines the child has above it."""
        start = _start(c) - 1
        while after is not None and start > after.end_lineno and not self.clines[start - 1].strip():
            start -= 1
        lines = self.clines[start:c.end_lineno]
        if self.parent.double:
            lines = _with_double_quotes(lines)
        have = _indent(self.clines[c.lineno - 1])
        self.out.extend(indent + line[len(have):] if line.startswith(have) else line for line in lines)


def _strings(lines: list[str]):
    """The plain string tokens (no prefix, one line) of `lines`: (row from 0, start column, end column, text)."""
    try:
        for token in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline):
            if token.type == tokenize.STRING and token.start[0] == token.end[0] and token.string[0] in "'\"":
                yield token.start[0] - 1, token.start[1], token.end[1], token.string
    except (tokenize.TokenError, SyntaxError):  # a statement cut out of its body; its text stays as it is
        return


def _double_quoted(code: str) -> bool:
    """Whether the program writes its strings in double quotes more often than in single ones."""
    quotes = [text[0] for *_, text in _strings(code.split("\n"))]
    return quotes.count('"') > quotes.count("'")


def _with_double_quotes(lines: list[str]) -> list[str]:
    """`lines` with each single-quoted string that holds no quote or backslash in double quotes (the
    child's text comes from `ast.unparse`, which prefers single ones)."""
    lines = list(lines)
    for row, start, end, text in reversed(list(_strings(lines))):
        body = text[1:-1]
        if text[0] == "'" and text[:3] != "'''" and not any(c in body for c in "'\"\\"):
            lines[row] = lines[row][:start] + '"' + body + '"' + lines[row][end:]
    return lines


def _counterparts(p: ast.stmt, c: ast.stmt) -> bool:
    """Whether the child's statement `c` is the parent's `p` changed (rather than a new one): of one
    kind, and for an assignment one to the same target, for a function or class one of the same name."""
    if type(p) is not type(c):
        return False
    if isinstance(p, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = (lambda s: [ast.dump(t) for t in getattr(s, "targets", None) or [s.target]])
        return targets(p) == targets(c)
    if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return p.name == c.name
    return True


def _start(stmt: ast.stmt) -> int:
    """A statement's first line, its decorators included."""
    return min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", ())])


def _separate(stmts: list[ast.stmt]) -> None:
    for a, b in itertools.pairwise(stmts):
        if _start(b) <= a.end_lineno:
            raise _Shared


def _same_but_body(p: ast.stmt, c: ast.stmt) -> bool:
    """Two compound statements (a function, an if, a loop, a with, a try) that differ in their bodies alone."""
    if type(p) is not type(c) or not isinstance(getattr(p, "body", None), list):
        return False
    return _without_body(p) == _without_body(c)


def _without_body(node: ast.stmt) -> str:
    bare = copy.copy(node)
    bare.body = []
    return ast.dump(bare)


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]
