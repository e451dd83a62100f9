"""A domain defined in a user's own Python file, loaded from the file's text.

The text, not the path, is what a run carries (`DomainConfig.source`): every
process that scores or mutates programs, on any Ray node, executes the same
code, and a resume reads it from the archive even if the file has moved or
changed since. The file is the user's own, so it runs on the trusted side like
Atoll's code; only candidate programs run in the sandbox.

A file is loaded once per process, text and path, as a module of its own named
after their hash (so the dataclasses and pydantic models it defines
resolve their annotations); its `__file__` is the file's path, so it can find
its neighbours where the path exists. A file's domain is the `Domain` subclass
it defines (usually through `evaluators.simple.SimpleDomain`); a file that
defines several picks one with `domain.name`.
"""
from __future__ import annotations

import hashlib
import inspect
import sys
import traceback
import types
from pathlib import Path

from evaluators._base import Domain

MODULE_PREFIX = "atoll_domain_"


def _error(message: str) -> Exception:
    from evaluators.registry import DomainLoadError

    return DomainLoadError(message)


def read_source(path: str | Path) -> str:
    """The text of the domain file at `path` (absolute), or a one-line error."""
    path = Path(path)
    if not path.is_file():
        raise _error(f"domain.path: {path} does not exist" if not path.exists()
                     else f"domain.path: {path} is not a file")
    if path.suffix != ".py":
        raise _error(f"domain.path: {path} is not a Python file (.py)")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise _error(f"domain.path: cannot read {path}: {exc}") from None


def load_module(source: str, path: str | None) -> types.ModuleType:
    """Execute `source` as a module (once per process, text and path), or raise a one-line error.

    The path is part of the key: the same text in two folders is two modules, each
    with its own `__file__`, so each folder is the one hidden from candidates.
    """
    digest = hashlib.sha256(f"{path}\0{source}".encode()).hexdigest()[:16]
    name = MODULE_PREFIX + digest
    if name in sys.modules:
        return sys.modules[name]
    label = path or f"<domain {digest}>"
    module = types.ModuleType(name, f"The domain file {label}.")
    module.__file__ = label
    module.__atoll_domain_file__ = True
    sys.modules[name] = module
    try:
        exec(compile(source, label, "exec"), module.__dict__)
    except (Exception, SystemExit) as exc:  # noqa: BLE001  whatever the user's file raises is bad input
        del sys.modules[name]
        raise _error(f"domain.path: {label} failed to load: {_describe(exc, label)}") from None
    return module


def _describe(exc: BaseException, label: str) -> str:
    """`Type: message (line N)`, N the deepest line of the file itself in the traceback."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == label]
    where = f" (line {lines[-1]})" if lines else ""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}): the file exits as it is imported{where}"
    return f"{type(exc).__name__}: {one_line(exc)}{where}{_beside(exc, label)}"


def _beside(exc: BaseException, label: str) -> str:
    """Why a module that lies beside the file is not found: a domain file is loaded from its text alone."""
    top = (getattr(exc, "name", None) or "").split(".")[0] if isinstance(exc, ModuleNotFoundError) else ""
    folder = Path(label).parent
    if not top or not ((folder / f"{top}.py").is_file() or (folder / top).is_dir()):
        return ""
    return (f"; {top} lies beside the file, but a domain file is one self-contained module (its text travels "
            "with the run): put that code in the file, or make the domain an installed package")


def one_line(exc: BaseException) -> str:
    """`exc`'s message on one line: a pydantic error's first error (`Model.key: what`), else its lines
    joined, so a message that spans lines (pydantic's, a user's own) stays the one line an error prints."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError) and exc.errors():
        first, more = exc.errors()[0], len(exc.errors()) - 1
        where = ".".join([exc.title, *(str(part) for part in first["loc"])])
        return f"{where}: {first['msg']}" + (f" (and {more} more)" if more else "")
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def domain_class(source: str | None, path: str | None, name: str | None) -> type[Domain]:
    """The domain class a file defines (the one called `name`, when given)."""
    if source is None:
        source = read_source(path)
    module = load_module(source, path)
    label = path or "the domain file"
    defined = [obj for obj in vars(module).values()
               if isinstance(obj, type) and issubclass(obj, Domain) and obj.__module__ == module.__name__]
    ready = [cls for cls in defined if not inspect.isabstract(cls)]
    if name is not None:
        ready = [cls for cls in ready if getattr(cls, "name", None) == name]
    if len(ready) == 1:
        return _checked(ready[0], label)
    if not ready:
        raise _error(f"domain.path: {label} {_missing(defined, name)}")
    raise _error(f"domain.path: {label} {_several(ready)}")


def _several(ready: list[type]) -> str:
    """Why several domain classes cannot be told apart: by name, or not even by name (a subclass that kept
    its parent's `name`, where domain.name cannot choose)."""
    names = [str(getattr(cls, "name", cls.__name__)) for cls in ready]
    twice = sorted(n for n in set(names) if names.count(n) > 1)
    if twice:
        classes = ", ".join(cls.__name__ for cls, n in zip(ready, names) if n == twice[0])
        return (f"defines several domains named {twice[0]!r} ({classes}): give each class its own `name`, "
                "then choose one with domain.name")
    return f"defines several domains ({', '.join(sorted(names))}); choose one with domain.name"


def _missing(defined: list[type], name: str | None) -> str:
    """Why no domain class was found: none at all, none of that name, or unfinished ones."""
    unfinished = [cls for cls in defined if inspect.isabstract(cls)]
    if unfinished:
        cls = unfinished[0]
        return f"defines {cls.__name__} but it lacks {', '.join(sorted(cls.__abstractmethods__))}"
    if name is not None and defined:
        return f"defines no domain named {name!r}"
    return ("defines no domain: expected a class deriving from SimpleDomain (evaluators.simple) "
            "or Domain (evaluators._base)")


def _checked(cls: type[Domain], label: str) -> type[Domain]:
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise _error(f"domain.path: {label}: {cls.__name__} needs a class attribute `name` (a string)")
    if not hasattr(cls, "config_model"):
        raise _error(f"domain.path: {label}: {cls.__name__} needs a `config_model` (a pydantic model of its "
                     "options); SimpleDomain provides one")
    return cls
