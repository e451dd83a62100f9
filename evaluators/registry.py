"""Domains by name. A domain module registers its class when imported."""
from __future__ import annotations

import importlib

from evaluators._base import Domain
from evaluators.secrets import RunSecrets

_DOMAINS: dict[str, type[Domain]] = {}
_BUILTIN = tuple(f"evaluators.domains.{name}.domain" for name in ("inventory", "trading", "milp", "control"))


def register(cls: type[Domain]) -> type[Domain]:
    """Class decorator: make `cls` available as `cls.name`."""
    if cls.name in _DOMAINS and _DOMAINS[cls.name] is not cls:
        raise ValueError(f"domain {cls.name!r} is registered twice")
    _DOMAINS[cls.name] = cls
    return cls


def _load_builtins() -> None:
    for module in _BUILTIN:
        importlib.import_module(module)


def domain_names() -> list[str]:
    _load_builtins()
    return sorted(_DOMAINS)


def get_domain_class(name: str) -> type[Domain]:
    _load_builtins()
    try:
        return _DOMAINS[name]
    except KeyError:
        raise KeyError(f"unknown domain {name!r}; known: {', '.join(sorted(_DOMAINS))}") from None


def get_domain(name: str, *, secrets: RunSecrets | None = None, **options) -> Domain:
    """An instance of domain `name`, its options validated by its config model.

    `secrets` are the run's secret randomness (see `evaluators.secrets`); without
    them the instance draws fresh ones, so its streams are unknown to everybody.
    """
    cls = get_domain_class(name)
    domain = cls(cls.config_model.model_validate(options))
    domain.secrets = secrets if secrets is not None else RunSecrets.draw()
    return domain
