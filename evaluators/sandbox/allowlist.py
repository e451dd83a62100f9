"""What a candidate's root holds, resolved once per evaluator on the trusted side.

An allow-list: the interpreter's standard library, the packages a domain's
programs may import (`Domain.program_modules()`, numpy by default) with their
companion library folders, the system shared libraries those need (found as the
loader finds them, file by file), the loader's cache and four devices (null, zero, urandom,
random). Each is bound read-only at its own path in an otherwise empty tmpfs;
the fork server builds that root (`_isolate.build_root`). Folders of other
packages that sit inside a bound folder (site-packages inside the standard
library, the bundled wheels of ensurepip) are covered by an empty tmpfs, as is
any path the caller asks to hide. Nothing else exists in a candidate's world:
no copy of Atoll, no other package, no home, no run directory.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import site
import sys
import sysconfig

from evaluators.sandbox import elfdeps

DEVICES = ("null", "zero", "urandom", "random")


class ModuleUnavailable(ValueError):
    """A domain names a program module that is not installed."""


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _inside(path: str, tops) -> bool:
    return any(_under(path, top) for top in tops)


def standard_library() -> list[str]:
    """The standard library's folders (pure and compiled) and its zip, if there is one."""
    found = [sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"), sysconfig.get_config_var("DESTSHARED")]
    found += [p for p in sys.path if p.endswith(".zip") and os.path.isfile(p)]
    return sorted({os.path.normpath(p) for p in found if p and os.path.exists(p)})


def module_paths(name: str) -> list[str]:
    """A top-level module's package folders (or its one file) and companion library folders."""
    spec = importlib.util.find_spec(name)
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        raise ModuleUnavailable(f"the program module {name!r} is not installed")
    if not spec.submodule_search_locations:
        return [os.path.normpath(spec.origin)] if spec.origin not in ("built-in", "frozen") else []
    paths = [os.path.normpath(p) for p in spec.submodule_search_locations]
    return paths + [p + suffix for p in paths for suffix in (".libs", "_libs") if os.path.isdir(p + suffix)]


def _shared_objects(tops: list[str], covers: list[str]) -> list[str]:
    files = []
    for top in tops:
        if os.path.isfile(top):
            files += [top] if ".so" in os.path.basename(top) else []
            continue
        for dirpath, dirnames, names in os.walk(top):
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in covers]
            files += [os.path.join(dirpath, n) for n in names if n.endswith(".so") or ".so." in n]
    return files


def system_libraries(tops: list[str], covers: list[str] = ()) -> list[str]:
    """Shared libraries that the compiled modules under `tops` (not under `covers`) load from outside them."""
    return sorted(p for p in elfdeps.libraries(_shared_objects(tops, list(covers))) if not _inside(p, tops))


def _covers(dirs: list[str], keep: list[str], hide: tuple[str, ...]) -> list[str]:
    """Folders inside a bound folder that must stay out of sight: other packages, wheels, `hide`.

    Shallowest first; a folder already under a cover needs none of its own.
    """
    others = site.getsitepackages() + [site.getusersitepackages()] + [p for p in sys.path if p]
    others += [os.path.join(p, "ensurepip", "_bundled") for p in dirs]
    found = {os.path.normpath(p) for p in others}
    found = {p for p in found if p not in keep and not _inside(p, [k for k in keep if k not in dirs])}
    found |= {os.path.normpath(h) for h in hide}
    covers: list[str] = []
    for path in sorted((p for p in found if os.path.isdir(p) and p not in dirs), key=lambda p: p.count("/")):
        if _nearest(path, dirs + covers) in dirs:
            covers.append(path)
    return covers


def _hidden_files(dirs: list[str], covers: list[str], hide: tuple[str, ...]) -> list[str]:
    """Files of `hide` inside a bound folder and under no cover: each gets /dev/null bound over it
    (a tmpfs covers only a folder), read-only and without devices, so it cannot be opened. A hidden
    symbolic link is followed: what it names is covered, never a mount made through the link."""
    files = {os.path.normpath(p) for h in hide for p in (h, os.path.realpath(h))
             if os.path.isfile(p) and not os.path.islink(p)}
    return sorted(f for f in files if _nearest(f, dirs + covers) in dirs)


def _nearest(path: str, tops: list[str]) -> str | None:
    enclosing = [t for t in tops if _under(path, t) and t != path]
    return max(enclosing, key=len) if enclosing else None


@functools.lru_cache(maxsize=16)
def root_entries(modules: tuple[str, ...] = ("numpy",), hide: tuple[str, ...] = ()) -> tuple:
    """The candidate's root as (kind, source, target) entries, sorted so parents come first.

    Kinds: "dir" and "file" (bound read-only), "device" (bound as it is),
    "cover" (over a folder an empty read-only tmpfs; over a file, its source
    /dev/null, which a cover's flags forbid opening). Raises `ModuleUnavailable`
    for a module that is not installed.
    """
    everything = standard_library()
    stdlib = [p for p in everything if not _inside(p, [q for q in everything if q != p])]  # lib-dynload sits inside
    sites = [os.path.normpath(p) for p in site.getsitepackages() + [site.getusersitepackages()]]
    packages = [p for name in modules for p in module_paths(name) if _inside(p, sites) or not _inside(p, stdlib)]
    tops = sorted(p for p in set(stdlib + packages) if not _inside(p, hide))
    dirs = [p for p in tops if os.path.isdir(p)]
    covers = _covers(dirs, everything + packages, hide)
    entries = {p: ("dir" if os.path.isdir(p) else "file", p) for p in tops}
    entries.update({p: ("file", p) for p in system_libraries(tops, covers)})
    if os.path.isfile("/etc/ld.so.cache"):
        entries["/etc/ld.so.cache"] = ("file", "/etc/ld.so.cache")
    entries.update({f"/dev/{d}": ("device", f"/dev/{d}") for d in DEVICES})
    entries.update({p: ("cover", "") for p in covers})
    entries.update({p: ("cover", "/dev/null") for p in _hidden_files(dirs, covers, hide)})
    ordered = sorted(entries.items(), key=lambda item: item[0].split("/"))
    return tuple((kind, src, dst) for dst, (kind, src) in ordered)
