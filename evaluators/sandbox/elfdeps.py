"""The shared libraries a set of compiled modules loads, found the way the dynamic loader finds them.

Reads each ELF file's dynamic section (DT_NEEDED, DT_RPATH, DT_RUNPATH) and
resolves every name through the object's own run paths ($ORIGIN expanded),
the loader's cache (`ldconfig -p`) and the default folders, transitively. No
file is executed (`ldd` runs the loader on each file and takes seconds for
numpy's). Only trusted files are read: the interpreter's and installed packages'.
"""
from __future__ import annotations

import functools
import mmap
import os
import struct
import subprocess
import sysconfig

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NEEDED, _DT_STRTAB, _DT_RPATH, _DT_RUNPATH = 1, 5, 15, 29


def _header(data: bytes):
    """(program headers, e_machine) of a 64-bit little-endian ELF file, or None."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    machine = struct.unpack_from("<H", data, 0x12)[0]
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    heads = [struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize) for i in range(phnum)]
    return heads, machine


def _offset(heads, vaddr: int) -> int:
    for p_type, _, offset, start, _, filesz, _, _ in heads:
        if p_type == _PT_LOAD and start <= vaddr < start + filesz:
            return vaddr - start + offset
    raise ValueError("address outside the file")


@functools.lru_cache(maxsize=4096)
def dynamic(path: str):
    """(needed names, run paths, e_machine) of an ELF file; None if it is not one."""
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        parsed = _header(data)
        if parsed is None:
            return None
        heads, machine = parsed
        dyn = next((h for h in heads if h[0] == _PT_DYNAMIC), None)
        if dyn is None:
            return (), (), machine
        tags = [struct.unpack_from("<qQ", data, dyn[2] + i * 16) for i in range(dyn[5] // 16)]
        strtab = _offset(heads, next(v for t, v in tags if t == _DT_STRTAB))
    except (OSError, ValueError, StopIteration, struct.error):
        return None

    def text(at: int) -> str:
        return data[strtab + at:data.find(b"\0", strtab + at)].decode(errors="replace")

    needed = tuple(text(v) for t, v in tags if t == _DT_NEEDED)
    runpath = [text(v) for t, v in tags if t == _DT_RUNPATH] or [text(v) for t, v in tags if t == _DT_RPATH]
    origin = os.path.dirname(os.path.realpath(path))
    dirs = tuple(d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for rp in runpath for d in rp.split(":") if d)
    return needed, dirs, machine


@functools.lru_cache(maxsize=1)
def _loader_cache() -> dict[str, list[str]]:
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30, check=False,
                             env={"PATH": "/usr/sbin:/sbin:/usr/bin:/bin", "LC_ALL": "C"}).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        if " => " in line:
            name, path = line.strip().split(" ", 1)[0], line.rsplit(" => ", 1)[1]
            found.setdefault(name, []).append(path)
    return found


def _defaults() -> list[str]:
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    return [d for d in (f"/lib/{arch}", f"/usr/lib/{arch}", "/lib64", "/usr/lib64", "/lib", "/usr/lib") if d]


@functools.lru_cache(maxsize=4096)
def _resolve(name: str, dirs: tuple[str, ...], machine: int) -> str | None:
    if "/" in name:
        return name if os.path.isfile(name) else None
    candidates = [os.path.join(d, name) for d in dirs] + _loader_cache().get(name, [])
    candidates += [os.path.join(d, name) for d in _defaults()]
    for path in candidates:
        info = dynamic(path) if os.path.isfile(path) else None
        if info is not None and info[2] == machine:
            return os.path.normpath(path)
    return None


def libraries(files: list[str]) -> set[str]:
    """Every library that `files` load, directly or through each other (their own paths excluded)."""
    seen, todo = set(), list(files)
    while todo:
        path = todo.pop()
        info = dynamic(path)
        if info is None:
            continue
        needed, dirs, machine = info
        for name in needed:
            lib = _resolve(name, dirs, machine)
            if lib and lib not in seen:
                seen.add(lib)
                todo.append(lib)
    return seen - set(files)
