"""Where Atoll keeps what it can compute again: DP optima, generated MILP instances.

The cache is trusted data (a generated instance decides what a program is scored on), so it
lives in a folder only its user can write, and sandboxes never see it (each domain's
`sandbox_hide`).
"""
from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

ENV = "ATOLL_CACHE_DIR"


def cache_dir() -> Path:
    """$ATOLL_CACHE_DIR, else ~/.cache/atoll, else a folder of this user's own in the temp dir.

    The last is for a home that cannot be written (a batch job's or a container's user), where
    the cache had failed the run.
    """
    chosen = os.environ.get(ENV)
    if chosen:
        return Path(chosen)
    try:
        home = Path.home() / ".cache" / "atoll"
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK | os.X_OK):
            return home
    except (OSError, RuntimeError):  # RuntimeError: no home at all
        pass
    return _own_temp()


def _own_temp() -> Path:
    """/tmp/atoll-cache-UID, made 0700; refused if someone else made it or can write in it."""
    path = Path(tempfile.gettempdir()) / f"atoll-cache-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(f"the cache folder {path} is not this user's own (the home has no writable "
                              f"~/.cache); set {ENV} to a folder of your own")
    return path
