"""The user's own MILP instances for the branching domain (`instances`): a folder of .mps or .lp files.

The split is a stated, deterministic rule, the same on every machine and in
every run (it depends on the file names only, never on the run's secrets):
the instances are ordered (by name, or by the SHA-256 of the name: a fixed
shuffle), the last `heldout_share` of them are the held-out split, the
`validation_share` before those the validation split, and the rest the search
split. With no validation share, the validation split solves the search
instances under SCIP seeds of the validation secret. Every file is read by SCIP
when the config loads, so a file SCIP cannot read is one line then, not a
failure in the middle of a run.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from evaluators.userdata import UserData

SUFFIXES = (".mps", ".lp", ".mps.gz", ".lp.gz")


class InstanceFolder(UserData):
    """A folder of your own instances (`[domain.options.instances]`, or just its path)."""

    folder = True

    order: Literal["name", "hash"] = Field("name", description="How the files are ordered before the split: "
                                           "'name' (sorted names: the last files are held out, e.g. the latest "
                                           "if names carry dates) or 'hash' (sorted by the SHA-256 of each name: "
                                           "a fixed shuffle).")
    heldout_share: float = Field(0.25, gt=0.0, lt=1.0, description="Share of the files held out (at least one), "
                                 "taken from the end of the order.")
    validation_share: float = Field(0.0, ge=0.0, lt=1.0, description="Share of the files for the validation "
                                    "split, taken just before the held-out ones (0: the validation split "
                                    "solves the search files under other SCIP seeds).")

    @model_validator(mode="after")
    def _split_and_read(self):
        splits = self.splits()
        if not splits["search"]:
            n = sum(len(v) for v in splits.values())
            raise ValueError(f"{self.path} holds {n} instance file(s): too few for a search and a held-out split "
                             f"with heldout_share {self.heldout_share:g} and validation_share "
                             f"{self.validation_share:g}; add instances or lower the shares")
        for path in files(self.path, self.sha256):
            check_readable(path, self.sha256)
        return self

    def splits(self) -> dict[str, list[str]]:
        """split -> the paths of its files, by the stated rule (validation empty: none of its own)."""
        found = files(self.path, self.sha256)
        if not found:
            raise ValueError(f"{self.path} holds no instance files (names ending in {', '.join(SUFFIXES)})")
        key = (lambda p: Path(p).name) if self.order == "name" else (
            lambda p: hashlib.sha256(Path(p).name.encode()).hexdigest())
        ordered = sorted(found, key=key)
        n = len(ordered)
        held = max(1, round(self.heldout_share * n))
        valid = round(self.validation_share * n) if self.validation_share else 0
        cut = max(0, n - held - valid)
        return {"search": ordered[:cut], "validation": ordered[cut:n - held], "heldout": ordered[n - held:]}


@functools.lru_cache(maxsize=8)
def files(folder: str, digest: str | None) -> tuple[str, ...]:
    """The instance files directly in `folder` (the digest keys the cache to the folder's content)."""
    return tuple(str(p) for p in sorted(Path(folder).iterdir())
                 if p.is_file() and p.name.lower().endswith(SUFFIXES))


@functools.lru_cache(maxsize=1024)
def check_readable(path: str, digest: str | None) -> None:
    """Read `path` with SCIP; a file it refuses, or one without variables, is one line naming the file."""
    from pyscipopt import Model

    model = Model()
    model.hideOutput()
    with _captured() as said:
        try:
            model.readProblem(path)
            variables = model.getNVars()
        except Exception as exc:  # noqa: BLE001  SCIP's reader raises OSError (or others) for a bad file
            variables, error = None, str(exc)
    if variables is None:
        detail = next((line.split("ERROR:", 1)[1].strip() for line in said() if "ERROR:" in line), error)
        raise ValueError(f"SCIP cannot read {path}: {detail}")
    model.freeProb()
    if variables == 0:
        raise ValueError(f"SCIP read no variables from {path}; is it an instance in the format its name says?")


@contextlib.contextmanager
def _captured():
    """Catch what SCIP's C code writes to the process's stdout and stderr (its reader errors), for the message."""
    lines: list[str] = []
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+") as sink:
        saved = [os.dup(1), os.dup(2)]
        try:
            for fd in (1, 2):
                os.dup2(sink.fileno(), fd)
            yield lambda: lines
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
            sink.seek(0)
            lines.extend(sink.read().splitlines())
