"""The config a resume goes on with: the run's stored one, changed by the resume's `--set` where it may be.

A resume may change budgets, models, islands and limits. Like `atoll set` on a live run, it
never lowers `run.max_evals` below the evaluations done. It never changes the domain or its
options: the run's scores so far were measured with them, and its islands, its best and the
library's elites compare them all.
"""
from __future__ import annotations

import copy
import json

from controller.cli import UserError
from controller.config import AtollConfig, apply_overrides, validate


def resumed_config(stored: dict, overrides: list[str], done: int) -> AtollConfig:
    """The checked config; UserError, one line, for a change a resume cannot take. `done`: the run's
    search evaluations."""
    from controller.helm import evals_floor_checked
    from controller.steering import Refused

    old = validate(copy.deepcopy(stored))
    new = validate(apply_overrides(copy.deepcopy(stored), list(overrides))) if overrides else old
    _same_domain(old, new, done)
    try:
        if new.run.max_evals != old.run.max_evals:
            evals_floor_checked(new, done)
    except Refused as exc:
        raise UserError(str(exc)) from None
    return new


def _same_domain(before: AtollConfig, after: AtollConfig, scored: int) -> None:
    """Refuse a change of the domain or its options (defaults filled in, as the library's fingerprint
    sees them)."""
    from controller.memory import fingerprint

    if fingerprint(before.domain) == fingerprint(after.domain):
        return
    changed = _differences(before.model_dump(mode="json")["domain"], after.model_dump(mode="json")["domain"],
                           "domain") or [("domain", "", "")]
    key, old, new = changed[0]
    raise UserError(f"--set {key}: a resume cannot change the domain or its options ({key} was {json.dumps(old)}, "
                    f"would be {json.dumps(new)}): the run's {scored} search scores were measured with the old "
                    "ones, and its islands and best compare them all. Start a new run with the new value instead "
                    "(atoll run CONFIG --set ...)")


def _differences(before, after, where: str) -> list[tuple[str, object, object]]:
    """(dotted key, before, after) for each leaf that differs between two config trees."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [change for key in sorted(set(before) | set(after))
                for change in _differences(before.get(key), after.get(key), f"{where}.{key}")]
    return [] if before == after else [(where, before, after)]
