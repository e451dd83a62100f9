"""Dropping proposals that are the same program as one already tried, before evaluation.

Exact text first (the archive's code hashes, before and after tuning), then the
normal form (`workers.normal_form`): layout, comments, docstrings and PARAMS
defaults gone. `saved` counts what each rule dropped.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable

from store.records import code_hash
from workers.normal_form import normal_form


class Dedup:
    """The run's tried programs, by exact hash and by normal form."""

    def __init__(self, hashes: Iterable[str] = (), codes: Iterable[str] = ()):
        self.exact = set(hashes)
        self.forms = {form for form in map(normal_form, codes) if form is not None}
        self.saved: Counter = Counter()

    def check(self, code: str) -> str | None:
        """'exact' or 'normal_form' when `code` was tried already (and counts it), else None."""
        if code_hash(code) in self.exact:
            self.saved["exact"] += 1
            return "exact"
        if normal_form(code) in self.forms:
            self.saved["normal_form"] += 1
            return "normal_form"
        return None

    def add(self, code: str) -> None:
        self.exact.add(code_hash(code))
        form = normal_form(code)
        if form is not None:
            self.forms.add(form)
