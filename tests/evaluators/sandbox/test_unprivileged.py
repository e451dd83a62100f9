"""The non-root path, on purpose: the sandbox and hostile-program tests again, as an ordinary user
(and a run that user may not write, or a temp folder where Ray cannot make its session,
`tests/controller/test_not_yours.py`).

Run as root (CI is), this test re-runs them through `setpriv` as uid and gid
65534 with no supplementary groups and no capabilities, so every protection
must hold through unprivileged user namespaces alone. The interpreter may sit
under a folder that user cannot enter (pyenv under /root, mode 700): the run
happens in a private mount namespace in which each such folder is replaced by
a tmpfs holding only the way through to what is needed, with nothing on the
host changed. Elsewhere the test says why it cannot run.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
USER = 65534
INNER = "ATOLL_UNPRIVILEGED_PASS"
TESTS = ["tests/evaluators/sandbox", "tests/evaluators/test_integrity_inventory.py",
         "tests/evaluators/test_integrity_trading.py", "tests/evaluators/test_integrity_control.py",
         "tests/evaluators/test_integrity_milp.py", "tests/controller/test_not_yours.py"]


def _needed() -> list[str]:
    """What the unprivileged run must reach: the interpreter, its libraries and the project."""
    import numpy

    paths = {sys.executable, os.path.realpath(sys.executable), sys.prefix, sys.base_prefix, str(ROOT),
             os.path.dirname(os.path.dirname(numpy.__file__))}
    return sorted(p for p in paths if p)


def _closed() -> dict[str, set[str]]:
    """Each folder on the way to what is needed that others may not enter, with the entries needed in it."""
    closed: dict[str, set[str]] = {}
    for path in _needed():
        parts = Path(path).parts
        for i in range(2, len(parts)):
            folder = str(Path(*parts[:i]))
            if not os.stat(folder).st_mode & 0o001:
                closed.setdefault(folder, set()).add(str(Path(*parts[:i + 1])))
    return closed


def _openings(hold: str) -> list[str]:
    """Shell lines that, in a private mount namespace, replace each closed folder by a passable tmpfs
    holding only its needed entries (bound back from where they were), shallowest first."""
    lines = []
    for n, (folder, entries) in enumerate(sorted(_closed().items(), key=lambda item: len(Path(item[0]).parts))):
        moves = []
        for m, entry in enumerate(sorted(entries)):
            make = "mkdir -p" if os.path.isdir(entry) else "touch"
            lines += [f"{make} {hold}/{n}-{m}", f"mount --rbind {entry} {hold}/{n}-{m}"]
            moves += [f"{make} {entry}", f"mount --move {hold}/{n}-{m} {entry}"]
        lines += [f"mount -t tmpfs -o mode=755,size=64k atoll-unprivileged {folder}", *moves]
    return lines


def test_sandbox_and_hostile_tests_pass_as_an_ordinary_user():
    if os.environ.get(INNER):
        pytest.skip("this is the unprivileged pass itself")
    if os.geteuid() != 0:
        pytest.skip(f"needs root to switch to uid {USER}; running as uid {os.geteuid()}, the other sandbox tests "
                    "already exercise the unprivileged path")
    missing = [tool for tool in ("setpriv", "unshare", "mount") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (util-linux) to switch users in a private mount namespace")
    unreadable = [p for p in _needed() if os.path.isdir(p) and os.stat(p).st_mode & 0o005 != 0o005]
    if unreadable:
        pytest.skip(f"uid {USER} cannot read {unreadable[0]} (mode {os.stat(unreadable[0]).st_mode & 0o777:o}); "
                    "make it readable by others (chmod o+rX) to run the unprivileged pass")
    hold = tempfile.mkdtemp(prefix="atoll-unprivileged-")
    try:
        script = "\n".join(["set -e", *_openings(hold), " ".join([
            "exec setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", "--inh-caps=-all",
            sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *TESTS])])
        env = dict(os.environ, **{INNER: "1"}, HOME="/nonexistent", PYTHONDONTWRITEBYTECODE="1")
        env.pop("ATOLL_CACHE_DIR", None)
        out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(hold, ignore_errors=True)
    summary = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert out.returncode == 0 and " passed" in summary and "failed" not in summary, \
        (out.stdout[-4000:] + out.stderr[-2000:])
