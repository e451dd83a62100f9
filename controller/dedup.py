"""Dropping proposals that are the same program as one already tried, before evaluation.

Exact text first (the archive's code hashes, before and after tuning), then the
normal form (`workers.normal_form`): layout, comments and docstrings gone, and the
PARAMS defaults where the domain tunes them. Both are kept as 8-byte hashes, so the driver's memory does not grow
with the programs' text; each evaluation stores its normal form's hash
(`metrics.form_hash`), so a resume rebuilds the set without parsing any code.
`saved` counts what each rule dropped.
"""
from __future__ import annotations

import functools
import hashlib
from collections import Counter
from typing import Iterable

from store.hash_index import HashSet
from store.records import code_hash
from workers.normal_form import normal_form


@functools.lru_cache(maxsize=512)  # a proposal is checked, then added, then added again as evaluated
def form_hash(code: str, tuned: bool = True) -> str | None:
    """The 16-hex-digit hash of `code`'s normal form, or None if it does not parse (`tuned`: the
    domain tunes PARAMS, `Domain.tunes_params`)."""
    form = normal_form(code, tuned)
    return None if form is None else _hashed(form)


def _hashed(form: str) -> str:
    return hashlib.sha256(form.encode()).hexdigest()[:16]


class Dedup:
    """The run's tried programs, by exact hash and by normal form."""

    def __init__(self, exact: HashSet | None = None, forms: Iterable[str] = (), tuned: bool = True):
        self.exact = exact if exact is not None else HashSet()  # shared with the loop's `known`
        self.tuned = tuned  # the domain tunes PARAMS: programs that differ only in their defaults are one
        self.forms = HashSet(int(h, 16) for h in forms if h and len(h) == 16)
        self.saved: Counter = Counter()
        self._given: dict[str, str] = {}  # code -> hash of the normal form its worker sent

    def _form(self, code: str) -> str | None:
        given = self._given.get(code)
        return given if given is not None else form_hash(code, self.tuned)

    def check(self, code: str, form: str | None = None) -> str | None:
        """'exact' or 'normal_form' when `code` was tried already (and counts it), else None.

        `form`: the program's normal form when the worker that made it sent it (an LLM worker
        computes it for its own check, the embedded mutator for the driver), so the driver
        does not parse it again; it is kept for the `add` calls that follow."""
        if form is not None:
            if len(self._given) >= 1024:  # only the next few seconds need it: without it, it is recomputed
                self._given.clear()
            self._given[code] = _hashed(form)
        if code_hash(code) in self.exact:
            self.saved["exact"] += 1
            return "exact"
        form = self._form(code)
        if form is not None and form in self.forms:
            self.saved["normal_form"] += 1
            return "normal_form"
        return None

    def tried(self, code: str) -> bool:
        """Whether `code` (or its normal form) was tried; unlike `check`, counts nothing as saved."""
        form = self._form(code)
        return code_hash(code) in self.exact or (form is not None and form in self.forms)

    def add(self, code: str) -> str | None:
        """Remember `code` as tried; returns its normal form's hash (None if it does not parse)."""
        self.exact.add(code_hash(code))
        form = self._form(code)
        if form is not None:
            self.forms.add(form)
        return form
