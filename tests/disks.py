"""A small disk of its own for a test that fills it: a tmpfs mounted on a folder."""
import contextlib
import os
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(folder: Path, size: str):
    """A tmpfs of `size` (e.g. "2m") mounted on `folder`, made here; unmounted when the block ends.

    Mounting needs root: another user's test is skipped. As root (the suite's own `unshare -n` needs
    CAP_SYS_ADMIN too) a failed mount is a failure, not a skip."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0 and os.geteuid() != 0:
        pytest.skip(f"mounting a tmpfs needs root: {mounted.stderr.strip()}")
    assert mounted.returncode == 0, f"cannot mount a tmpfs here: {mounted.stderr.strip()}"
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)
