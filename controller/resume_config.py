"""The config a resume goes on with: the run's stored one, changed by the resume's `--set` where it may be.

A resume may change budgets, models, islands and limits. Like `atoll set` on a live run, it
never lowers `run.max_evals` below the evaluations done, nor `islands.count` below the islands
the run's programs were made on (a resume puts each back on its island). It never changes the domain or its
options: the run's scores so far were measured with them, and its islands, its best and the
library's elites compare them all. Pointing a data option (`evaluators.userdata`) at a copy
of the content the run pinned changes nothing that was measured: that is how a run and its
data restored to new paths (a lost machine) go on, and the new path is stored with the
config, so later resumes read it too.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

from controller.cli import UserError
from controller.config import AtollConfig, apply_overrides, validate


class DataMissing(UserError):
    """The run's pinned data is not at its path any more, and no `--set` points at a moved copy."""


def resumed_config(stored: dict, overrides: list[str], done: int) -> tuple[AtollConfig, list[str]]:
    """(the checked config, a line for each data option now read from a new path); UserError, one line,
    for a change a resume cannot take. `done`: the run's search evaluations."""
    from controller.helm import evals_floor_checked
    from controller.steering import Refused

    before, after = copy.deepcopy(stored), apply_overrides(copy.deepcopy(stored), list(overrides))
    moves = _data_moves(before, after)
    for name, (_, path) in moves.items():
        before["domain"]["options"][name]["path"] = path  # the run's data, where it lies now
    old = validate(before)
    new = validate(after) if overrides else old
    _same_domain(old, new, done)
    _no_fewer_islands(old, new)
    try:
        if new.run.max_evals != old.run.max_evals:
            evals_floor_checked(new, done)
    except Refused as exc:
        raise UserError(str(exc)) from None
    return new, [f"domain.options.{name}: the run now reads its data from {path} (the same content as {was}, "
                 f"sha256 {old.domain.options[name]['sha256'][:12]}...)" for name, (was, path) in moves.items()]


def edited_domain_file(config: AtollConfig, scored: int) -> str | None:
    """A line for a run whose domain file (`domain.path`) now holds other text than the copy the run stored:
    the run keeps its copy, which a resume and a report load silently otherwise, so a user who fixed the
    file would think the fix took part."""
    path, source = config.domain.path, config.domain.source
    if not path or source is None:
        return None
    try:
        if Path(path).read_text() == source:
            return None
    except (OSError, UnicodeDecodeError):
        return None  # moved or gone: the stored copy is all there is, as documented
    return (f"domain.path: {path} has changed since the run began; this run keeps the copy it stored (its "
            f"{scored} search scores were measured with it); a new run takes the edited file (atoll run CONFIG)")


def repoints_data(key: list[str]) -> bool:
    """Whether a `--set` key names a data option's path (`domain.options.NAME.path`), which a resume takes
    when it points at the same content (`atoll submit --resume` leaves that to the job's resume)."""
    return len(key) == 4 and key[:2] == ["domain", "options"] and key[3] == "path"


def _data_moves(before: dict, after: dict) -> dict[str, tuple[str, str]]:
    """{option: (its pinned path, the new one)} for each data option that `after` points at a new path
    holding the pinned content (a path alone, as in a config, counts too); UserError for other content,
    and for pinned data missing from its path and not pointed elsewhere (with the way to point at it)."""
    moves = {}
    for name, cls in _data_classes(before).items():
        pinned, given = _options(before).get(name), _options(after).get(name)
        if not (isinstance(pinned, dict) and pinned.get("sha256") and isinstance(pinned.get("path"), str)):
            continue
        if isinstance(given, (str, os.PathLike)):
            given = _options(after)[name] = dict(pinned, path=str(given))
        path = given.get("path") if isinstance(given, dict) else None
        if not isinstance(path, (str, os.PathLike)):
            continue  # not a path: a change of the domain's options, refused as such
        path, kind = str(Path(path).expanduser().resolve()), "folder" if cls.folder else "file"
        if path != pinned["path"]:
            moves[name] = (pinned["path"], _same_content(name, path, cls, pinned["sha256"]))
        elif not Path(path).exists():
            raise DataMissing(f"domain.options.{name}: {kind} {path} does not exist; if it moved, point the run at "
                            f"the moved copy (it must hold the same content): --set domain.options.{name}.path="
                            "NEWPATH")
    return moves


def _same_content(name: str, path: str, cls, sha256: str) -> str:
    """`path`, if its content is the run's pinned data; else UserError naming both digests."""
    from evaluators.userdata import content_digest

    try:
        digest = content_digest(Path(path), cls.folder)
    except ValueError as exc:
        raise UserError(f"--set domain.options.{name}.path: {exc}") from None
    if digest != sha256:
        kind = "folder" if cls.folder else "file"
        raise UserError(f"--set domain.options.{name}.path: {path} is not the run's data (its content's sha256 is "
                        f"{digest[:12]}..., the run's is {sha256[:12]}...): a resume must read the same {kind} the "
                        f"run was scored on; point at a copy of it, or start a new run on this one")
    return path


def _options(tree: dict) -> dict:
    domain = tree.get("domain")
    options = domain.get("options") if isinstance(domain, dict) else None
    return options if isinstance(options, dict) else {}


def _data_classes(tree: dict) -> dict:
    """The stored domain's data options with their UserData classes; none when it does not load
    (then validating the stored config says why)."""
    from pydantic import ValidationError

    from evaluators.registry import DomainConfig, DomainLoadError, get_domain_class
    from evaluators.userdata import data_options

    try:
        return data_options(get_domain_class(DomainConfig.model_validate(tree.get("domain"))).config_model)
    except (ValidationError, DomainLoadError):
        return {}


def _same_domain(before: AtollConfig, after: AtollConfig, scored: int) -> None:
    """Refuse a change of the domain or its options (defaults filled in, as the library's fingerprint
    sees them: a data option by its content and settings; a new path to the same content was taken,
    and one to other content refused, by `_data_moves`)."""
    from controller.fingerprint import fingerprint

    if fingerprint(before.domain) == fingerprint(after.domain):
        return
    changed = _differences(before.model_dump(mode="json")["domain"], after.model_dump(mode="json")["domain"],
                           "domain") or [("domain", "", "")]
    key, old, new = changed[0]
    raise UserError(f"--set {key}: a resume cannot change the domain or its options ({key} was {json.dumps(old)}, "
                    f"would be {json.dumps(new)}): the run's {scored} search scores were measured with the old "
                    "ones, and its islands and best compare them all. Start a new run with the new value instead "
                    "(atoll run CONFIG --set ...)")


def _no_fewer_islands(before: AtollConfig, after: AtollConfig) -> None:
    """Refuse fewer islands: the run's programs name the islands they were made on, and a resume
    rebuilds each island from them (more islands start from the seed)."""
    if after.islands.count < before.islands.count:
        raise UserError(f"--set islands.count: {after.islands.count} is below the run's {before.islands.count} "
                        f"islands, whose programs a resume puts back on them; a resume may add islands, never "
                        f"remove them (give at least {before.islands.count})")


def _differences(before, after, where: str) -> list[tuple[str, object, object]]:
    """(dotted key, before, after) for each leaf that differs between two config trees."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [change for key in sorted(set(before) | set(after))
                for change in _differences(before.get(key), after.get(key), f"{where}.{key}")]
    return [] if before == after else [(where, before, after)]
