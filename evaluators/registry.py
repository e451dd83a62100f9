"""Domains by name, by installed package or by file; the `[domain]` branch of a run's config.

Every domain is found one of two ways:

- by name, through the `atoll.domains` entry point group: the built-in domains are
  declared there in Atoll's own pyproject.toml, and any installed package can
  declare its own (`name = "package.module:DomainClass"`);
- by file: `DomainConfig.path` names a Python file that defines one. Its text
  travels in `DomainConfig.source`, so every process of a run (the driver, the
  evaluators and the mutators, on any Ray node) loads the same code, and the
  run's archive keeps it for a resume (see `evaluators.domain_file`).

Running from a source checkout, the installed metadata may be older than the
code (an editable install made before a domain was added): the checkout's own
pyproject.toml is then the list of built-ins, and installed entry points only
add other packages' domains.
"""
from __future__ import annotations

import importlib.metadata
import sys
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evaluators._base import Domain
from evaluators.secrets import RunSecrets

GROUP = "atoll.domains"
_ROOT = Path(__file__).resolve().parents[1]
_CLASSES: dict[str, type[Domain]] = {}


class DomainLoadError(Exception):
    """A domain could not be found or loaded; the message is one line that says why."""


class DomainConfig(BaseModel):
    """Which domain scores the programs (a registered name, or a file of the user's) and its options."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = Field(None, description="A registered domain: built in (e.g. 'inventory') or installed "
                                               "by a package under the 'atoll.domains' entry point group. With "
                                               "`path`, picks one of the file's domains by name.")
    path: str | None = Field(None, description="A Python file that defines the domain, relative to the config "
                                               "file; read when the config loads.")
    source: str | None = Field(None, description="The domain file's text, filled in from `path` when the config "
                                                 "loads, so the domain travels with the run to every process and "
                                                 "into its archive. Not written by hand.")
    options: dict = Field(default_factory=dict, description="Options validated by the domain's own config model.")

    @model_validator(mode="after")
    def _names_a_domain(self):
        if not (self.name or self.path or self.source):
            raise ValueError("give domain.name (a registered domain) or domain.path (a file that defines one)")
        return self

    def described(self) -> str:
        """How the config names this domain, for messages."""
        return f"domain file {self.path}" if self.path else f"domain {self.name!r}"


def _source_builtins() -> dict[str, str] | None:
    """The checkout's declared built-ins when running from source, else None (an installed copy)."""
    pyproject = _ROOT / "pyproject.toml"
    if not pyproject.is_file():
        return None
    project = tomllib.loads(pyproject.read_text()).get("project", {})
    if project.get("name") != "atoll":
        return None
    return dict(project.get("entry-points", {}).get(GROUP, {}))


def declared() -> dict[str, importlib.metadata.EntryPoint]:
    """Name -> entry point of every domain declared, built-ins first."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    builtins = _source_builtins()
    if builtins is not None:
        found.update({name: importlib.metadata.EntryPoint(name, value, GROUP) for name, value in builtins.items()})
    for ep in importlib.metadata.entry_points(group=GROUP):
        if builtins is not None and _distribution(ep) == "atoll":
            continue  # this checkout's pyproject.toml is newer than its installed metadata
        if ep.name in found and found[ep.name].value != ep.value:
            raise DomainLoadError(f"domain {ep.name!r} is declared twice: {found[ep.name].value} and {ep.value} "
                                  f"(uninstall one of the packages)")
        found.setdefault(ep.name, ep)
    return found


def _distribution(ep: importlib.metadata.EntryPoint) -> str | None:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else None


def domain_names() -> list[str]:
    """Every domain that a config can name with `domain.name`."""
    return sorted(declared())


def _by_name(name: str) -> type[Domain]:
    if name in _CLASSES:
        return _CLASSES[name]
    entries = declared()
    if name not in entries:
        raise DomainLoadError(f"unknown domain {name!r}; known: {', '.join(sorted(entries))} "
                              f"(or give domain.path, a file that defines one)")
    ep = entries[name]
    origin = f"domain {name!r} (entry point {name} = {ep.value}" + (
        f" of package {_distribution(ep)})" if _distribution(ep) else ")")
    try:
        cls = ep.load()
    except (Exception, SystemExit) as exc:  # noqa: BLE001  any import failure of a plug-in is bad user input
        from evaluators.domain_file import one_line

        raise DomainLoadError(f"{origin} failed to import: {type(exc).__name__}: {one_line(exc)}") from None
    if not (isinstance(cls, type) and issubclass(cls, Domain)):
        raise DomainLoadError(f"{origin} is not a Domain class (evaluators._base.Domain)")
    if getattr(cls, "name", None) != name:
        raise DomainLoadError(f"{origin} names itself {getattr(cls, 'name', None)!r}; the entry point's name "
                              f"and the class's `name` must agree")
    _CLASSES[name] = cls
    return cls


def get_domain_class(domain: str | DomainConfig) -> type[Domain]:
    """The class of `domain`: a registered name, or a whole `[domain]` branch (a file's domain included)."""
    from evaluators import domain_file

    if isinstance(domain, str):
        return _by_name(domain)
    if domain.path or domain.source:
        return domain_file.domain_class(domain.source, domain.path, domain.name)
    return _by_name(domain.name)


def get_domain(domain: str | DomainConfig, *, secrets: RunSecrets | None = None, **options) -> Domain:
    """An instance of `domain`, its options validated by its config model.

    `domain` is a registered name (options as keywords) or the run's `DomainConfig`
    (its options, updated by any keywords). `secrets` are the run's secret
    randomness (see `evaluators.secrets`); without them the instance draws fresh
    ones, so its streams are unknown to everybody.
    """
    if isinstance(domain, DomainConfig):
        options = {**domain.options, **options}
    cls = get_domain_class(domain)
    instance = cls(cls.config_model.model_validate(options))
    instance.secrets = secrets if secrets is not None else RunSecrets.draw()
    return instance


def domain_folders(domain: Domain) -> tuple[str, ...]:
    """Where `domain`'s own code and data live, for the sandbox to hide.

    A file domain's folder, or the top-level package folder of an installed one
    (a built-in's is Atoll's own, hidden anyway). Never the filesystem root, and
    nothing for a domain that is a lone module (it cannot be told apart from its
    neighbours; ship such a domain as a package).
    """
    module = sys.modules.get(type(domain).__module__)
    if module is None or not getattr(module, "__file__", None):
        return ()
    top = sys.modules.get(module.__name__.split(".")[0], module)
    if getattr(module, "__atoll_domain_file__", False):
        folder = Path(module.__file__).resolve().parent
    elif getattr(top, "__path__", None) and getattr(top, "__file__", None):
        folder = Path(top.__file__).resolve().parent
    else:
        return ()
    return (str(folder),) if folder.parent != folder and folder.is_dir() else ()
