"""The run's one typed config tree, loaded from TOML and validated strictly.

Each component owns the model of its own branch (islands, mutator, sandbox,
domain); this module only assembles them. Any error becomes a `ConfigError`
whose one-line message names the key and what is allowed.
"""
from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.control import ControlConfig
from controller.memory_config import MemoryConfig
from evaluators.registry import DomainConfig, DomainLoadError
from evaluators.racing import RacingConfig
from evaluators.sandbox.config import SandboxConfig
from islands.config import IslandsConfig
from workers.config import EmbeddedMutatorConfig
from workers.llm.config import LLMConfig


class ConfigError(Exception):
    """Bad user configuration: the message says which key and how to fix it."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunConfig(_Strict):
    """What the search is and how long it may run."""

    name: str = Field("atoll", min_length=1, description="A label for the run, shown in status.")
    seed: int = Field(0, ge=0, description="Seed of every random decision of the search (parents, mutations); never of the data programs are scored on.")
    replay_seed: int | None = Field(None, ge=0, description="Fix the run's secret randomness (demand, instances, episode seeds, markets) to this number so its scores can be replayed; anyone who knows it can regenerate the data. None: drawn from the OS and kept in the run's archive.")
    max_evals: int = Field(400, ge=1, description="Budget: search-split evaluations, failed ones included.")
    max_wall_s: float = Field(480.0, gt=0, description="Budget: wall-clock seconds of searching (resumes add theirs).")


class MutatorConfig(_Strict):
    """Which mutation backend proposes children."""

    kind: Literal["embedded"] = Field("embedded", description="Mutation backend; 'embedded' needs no model "
                                      "(LLM models mix in through [mutator.llm]).")
    workers: int = Field(1, ge=1, le=64, description="Mutation actors.")
    embedded: EmbeddedMutatorConfig = Field(default_factory=EmbeddedMutatorConfig, description="Embedded mutator settings.")
    llm: LLMConfig | None = Field(None, description="LLM models mixed with the embedded mutator per island "
                                                   "(see workers/llm/config.py); none by default.")


class EvaluatorConfig(_Strict):
    """The pool of evaluator actors and the sandbox they run candidates in."""

    actors: int = Field(0, ge=0, le=512, description="Evaluator actors; 0 means one per CPU of the cluster.")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Limits for each candidate's process.")
    racing: RacingConfig = Field(default_factory=RacingConfig, description="Stop search evaluations early once "
                                 "they are clearly worse than their parent (evaluators.racing); off by default.")


class ControllerConfig(_Strict):
    """Scheduling and persistence of the run loop."""

    in_flight_per_actor: int = Field(2, ge=1, le=16, description="Evaluations queued per evaluator actor.")
    commit_every_s: float = Field(1.0, gt=0, description="Longest time a finished result waits before it is committed.")
    snapshot_every_s: float = Field(3.0, gt=0, description="How often the islands are saved into the archive (with the first commit due after that time), so a resume replays only the results committed since.")
    backup_every_s: float = Field(1800.0, ge=0, description="How often the run's archive is copied whole to archive.backup.duckdb in its run directory (between two commits, so the copy is consistent), for a resume from it if the archive is ever damaged: `atoll resume DIR --from-backup`. The first copy is made this long after the run or resume starts; 0: no backups.")
    backup_dir: str = Field("", description="A folder on another disk or machine (a network mount) that each backup is also copied into, as RUN_ID.duckdb, so the run outlives the loss of its machine: on another one, `atoll resume NEWDIR --from-backup BACKUP_DIR/RUN_ID.duckdb`. The library's backups go there too, as library-HOST-KEY.duckdb. Absolute or under '~' (the driver's home); it must exist and be writable when a run starts or resumes (it is not made: an unmounted disk would leave the copies here). A file there that holds another run is never overwritten. '': no copy.")
    heldout_on_new_best: bool = Field(True, description="Check every new best program on the held-out split (never shown to the mutator).")
    actor_death_retries: int = Field(1, ge=0, le=10, description="Times a job that was running when its actor's process died is run again (on a fresh actor); after that an evaluation is stored FAILED with the reason and a mutation request is dropped.")


class ClusterConfig(_Strict):
    """Running on a Ray cluster: where submitted runs keep their archives, and how the evaluators follow the nodes."""

    storage_root: str = Field("~/atoll-runs", min_length=1, description="Folder on the driver's node under which `atoll submit` puts each run directory (never inside the job's unpacked working directory, which Ray deletes); '~' is the driver node's home.")
    scale_every_s: float = Field(2.0, gt=0, description="How often the driver looks at the cluster's CPUs and, with evaluator.actors = 0, starts an evaluator for each CPU that joined.")


class AtollConfig(_Strict):
    """The whole run."""

    run: RunConfig = Field(default_factory=RunConfig, description="Budget and seed.")
    domain: DomainConfig = Field(description="The domain being searched.")
    islands: IslandsConfig = Field(default_factory=IslandsConfig, description="Island-model population.")
    mutator: MutatorConfig = Field(default_factory=MutatorConfig, description="Mutation backend.")
    evaluator: EvaluatorConfig = Field(default_factory=EvaluatorConfig, description="Evaluator pool and sandbox.")
    controller: ControllerConfig = Field(default_factory=ControllerConfig, description="Run loop.")
    control: ControlConfig = Field(default_factory=ControlConfig, description="Steering the live run over gRPC.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Ray cluster: storage root, scaling.")
    memory: MemoryConfig = Field(default_factory=MemoryConfig, description="The library shared by runs: "
                                 "catalog, elites, skills, warm starts.")


def _first_error(exc: ValidationError, prefix: str = "", model: type[BaseModel] | None = None) -> str:
    """`section.key: what is wrong`; a check across several keys of a section names the section.
    An unknown key of `model` (the validated one) comes with the known key it is closest to."""
    err = exc.errors()[0]
    key = prefix + ".".join(str(p) for p in err["loc"])
    msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden" and model is not None:
        msg += _known_keys(model, err["loc"])
    more = len(exc.errors()) - 1
    return f"{key.rstrip('.') or '(top level)'}: {msg}" + (f" (and {more} more)" if more else "")


def _known_keys(model: type[BaseModel], loc: tuple) -> str:
    """' (did you mean X?)' for the key at `loc` of `model`, or the section's keys when none is close."""
    models = [model]
    for part in loc[:-1]:  # down to the section that holds the unknown key
        if isinstance(part, int):
            continue  # an entry of a list of tables
        holding = [m for m in models if part in m.model_fields]
        if holding:
            models = _models_in(holding[0].model_fields[part].annotation)
        else:  # a tagged union's tag (e.g. a model's backend): the tables it names
            models = [m for m in models if any(part in get_args(f.annotation) for f in m.model_fields.values())]
        if not models:
            return ""
    names = list(models[0].model_fields)
    close = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]}?)"
    return f"; its section knows {', '.join(names)}" if len(names) <= 24 else ""


def _models_in(annotation) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (itself, or inside a list, an optional or a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def parse_override(item: str) -> tuple[list[str], object]:
    """`section.key=value` with value in TOML syntax (bare words are strings)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    key, raw = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except ValueError:  # TOMLDecodeError, or an integer of more than 4,300 digits, which crashed a live run's `set`
        value = raw
    return [part.strip() for part in key.split(".")], value


def apply_overrides(tree: dict, overrides: list[str]) -> dict:
    """Each `section.key=value` into `tree`. In a list of tables (`[[mutator.llm.models]]`) the part
    after the list's name picks one by its `name`, or by its place from 0:
    `mutator.llm.models.hosted.base_url=...` or `mutator.llm.models.0.base_url=...`."""
    for item in overrides:
        path, value = parse_override(item)
        node = tree
        for i, part in enumerate(path[:-1]):
            node = _entry(node, part, item, ".".join(path[:i])) if isinstance(node, list) \
                else node.setdefault(part, {})
            if isinstance(node, list) and i == len(path) - 2:
                raise ConfigError(f"--set {item!r}: {part} is a list of tables; name one of them: "
                                  f"{'.'.join(path[:-1])}.NAME.{path[-1]} ({_names(node)})")
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"--set {item!r}: {part} is not a section")
        node[path[-1]] = value
    return tree


def _entry(items: list, part: str, item: str, where: str):
    """The table of `items` whose name is `part`, else the one at place `part` (from 0)."""
    named = [entry for entry in items if isinstance(entry, dict) and entry.get("name") == part]
    if named:
        return named[0]
    if part.isdigit() and int(part) < len(items):
        return items[int(part)]
    raise ConfigError(f"--set {item!r}: {where} has no entry {part!r} ({_names(items)})")


def _names(items: list) -> str:
    names = [str(entry.get("name")) for entry in items if isinstance(entry, dict) and entry.get("name")]
    return (f"its names: {', '.join(names)}; or " if names else "") + f"a place from 0 to {len(items) - 1}"


def validate(tree: dict, folder: Path | None = None) -> AtollConfig:
    """Validate a config tree, including the domain's own options (loading the domain to get its model).

    Data files named in the options resolve against `folder` (the config's) and are pinned by their
    content's digest in the returned config (`evaluators.userdata`), so the stored config says what the
    run was scored on.
    """
    from evaluators.registry import get_domain_class
    from evaluators.userdata import pinned

    try:
        config = AtollConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_first_error(exc, model=AtollConfig)) from None
    _no_bool_as_number(config, tree)
    try:
        model = get_domain_class(config.domain).config_model
    except DomainLoadError as exc:
        raise ConfigError(str(exc) if str(exc).startswith("domain.") else f"domain.name: {exc}") from None
    try:
        options = model.model_validate(config.domain.options,
                                       context={"config_dir": str(folder) if folder else None})
    except ValidationError as exc:
        message = _first_error(exc, model=model)  # "(top level): ..." for a rule across several options
        raise ConfigError("domain.options" + (message[len("(top level)"):] if message.startswith("(top level)")
                                              else "." + message)) from None
    _no_bool_as_number(options, config.domain.options, "domain.options.")
    _check_descriptors(config.islands, get_domain_class(config.domain))
    domain = config.domain.model_copy(update={"options": pinned(config.domain.options, options)})
    return config.model_copy(update={"domain": domain})


def _no_bool_as_number(model: BaseModel, given: dict, where: str = "") -> None:
    """Refuse true or false given for a number: pydantic takes them as 1 and 0, so `wall_s = true`
    made every sandbox limit 1 s and `run.max_evals=true` a budget of 1, without a word."""
    for key, value in given.items() if isinstance(given, dict) else ():
        if key not in type(model).model_fields:
            continue
        held = getattr(model, key)
        if isinstance(value, bool) and not isinstance(held, bool) and isinstance(held, (int, float)):
            raise ConfigError(f"{where}{key}: {str(value).lower()} given where a number is expected")
        if isinstance(held, BaseModel):
            _no_bool_as_number(held, value, f"{where}{key}.")
        elif isinstance(held, (list, tuple)) and isinstance(value, list):
            for i, (inner, raw) in enumerate(zip(held, value)):
                if isinstance(inner, BaseModel):
                    _no_bool_as_number(inner, raw, f"{where}{key}[{i}].")


def _check_descriptors(islands, domain) -> None:
    """MAP-Elites needs the domain's descriptors, and one [low, high] pair per descriptor."""
    names = domain.descriptor_names
    if islands.niche != "map_elites" or names is None:
        return
    if not names:
        raise ConfigError(f"islands.niche: domain {domain.name!r} reports no descriptors for 'map_elites'; "
                          "use 'signature'")
    bounds = islands.descriptor_bounds
    if bounds and len(bounds) != len(names):
        raise ConfigError(f"islands.descriptor_bounds: {len(bounds)} [low, high] pairs, but domain "
                          f"{domain.name!r} reports {len(names)} descriptors ({', '.join(names)}); give "
                          f"{len(names)} pairs, or none to learn the ranges")


def load_config(path: str | Path, overrides: list[str] = ()) -> tuple[AtollConfig, str]:
    """Load, override and validate; returns the config and the resolved TOML-ish text."""
    path = Path(path)
    text = read_config_text(path)
    try:
        tree = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    config = validate(read_domain_file(apply_overrides(tree, list(overrides)), path.parent), path.parent.resolve())
    return config, text


def read_config_text(path: Path) -> str:
    """The config file's text, or a one-line error: missing, a folder, unreadable, or not UTF-8 (TOML's encoding)."""
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if not path.is_file():
        raise ConfigError(f"config file {path} is not a file; give a TOML file, e.g. configs/inventory.toml")
    try:
        return path.read_text(encoding="utf-8-sig")  # a BOM (as some editors write) is no part of TOML
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); TOML files are "
                          "UTF-8: save it as UTF-8") from None


def read_domain_file(tree: dict, folder: Path) -> dict:
    """Resolve `domain.path` against the config's folder and put the file's text in `domain.source`."""
    from evaluators.domain_file import read_source

    domain = tree.get("domain")
    if not isinstance(domain, dict) or not isinstance(domain.get("path"), str):
        return tree
    path = (folder / Path(domain["path"]).expanduser()).resolve()
    try:
        source = read_source(path)
    except DomainLoadError as exc:
        raise ConfigError(str(exc)) from None
    return dict(tree, domain=dict(domain, path=str(path), source=source))
