"""`atoll new-domain NAME`: write a working example domain to start a user's own from.

The example (dynamic pricing of a perishable stock) is a real problem in
miniature: a state, an action, a simulator, a seed program and a baseline. The
files come from templates in `controller/templates/new_domain/`, filled in with
`string.Template` (only `$name`, `$Class` and `$folder`).
"""
from __future__ import annotations

import re
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
    words = {"name": name, "Class": "".join(part.title() for part in name.split("_") if part),
             "folder": folder.name or str(folder)}
    targets = {"domain.py.tmpl": f"{name}.py", "config.toml.tmpl": f"{name}.toml",
               "test_domain.py.tmpl": f"test_{name}.py"}
    return {folder / target: Template((TEMPLATES / source).read_text()).substitute(words)
            for source, target in targets.items()}


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
