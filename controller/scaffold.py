"""`atoll new-domain NAME`: write a working example domain to start a user's own from.

The example (dynamic pricing of a perishable stock) is a real problem in
miniature: a state, an action, a simulator, a seed program and a baseline. The
files come from templates in `controller/templates/new_domain/`, filled in with
`string.Template` (only `$name`, `$Class` and `$folder`).
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).with_name("templates") / "new_domain"
_NAME = re.compile(r"[a-z][a-z0-9_]{0,40}")


class ScaffoldError(Exception):
    """Bad input to `new-domain`: the message is one line that says what to change."""


def files_for(name: str, folder: Path) -> dict[Path, str]:
    """Path -> text of every file the example domain `name` needs in `folder`."""
    if not _NAME.fullmatch(name):
        raise ScaffoldError(f"domain name {name!r}: use lowercase letters, digits and underscores, "
                            f"starting with a letter (e.g. pricing)")
    shadowed = _module_named(name)
    if shadowed:
        raise ScaffoldError(f"domain name {name!r} is also the name of {shadowed}: the example's {name}.py would "
                            f"hide it from its own tests (python -m pytest puts the folder on the path); choose "
                            f"another name (e.g. {name}_domain)")
    words = {"name": name, "Class": "".join(part.title() for part in name.split("_") if part),
             "folder": folder.name or str(folder)}
    targets = {"domain.py.tmpl": f"{name}.py", "config.toml.tmpl": f"{name}.toml",
               "test_domain.py.tmpl": f"test_{name}.py"}
    return {folder / target: Template((TEMPLATES / source).read_text()).substitute(words)
            for source, target in targets.items()}


def _module_named(name: str) -> str | None:
    """What importable module `name` names (the standard library's, one in use, or one installed, editable
    installs included), else None. The current folder does not count: a folder or file of the user's there
    is not what the tests import."""
    if name in sys.stdlib_module_names:
        return "a module of Python's standard library"
    module = sys.modules.get(name)
    try:
        spec = module.__spec__ if module is not None else importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if not origin or (module is None and Path.cwd().resolve() in Path(origin).resolve().parents[:2]):
        return None
    return f"an installed module ({origin})"


def write_domain(name: str, folder: Path) -> list[Path]:
    """Write the example domain `name` into `folder` (created); never overwrites a file."""
    files = files_for(name, folder)
    taken = [str(path) for path in files if path.exists()]
    if taken:
        raise ScaffoldError(f"{taken[0]} already exists; choose another --dir or name")
    if folder.exists() and not folder.is_dir():
        raise ScaffoldError(f"{folder} exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
    return list(files)
