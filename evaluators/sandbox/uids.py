"""A uid of this evaluator's own for its candidates, claimed on the node.

Run as root, every live evaluator on a node holds a different unprivileged uid
from `FIRST_UID` on: the claim is an exclusive `flock` on a per-uid lock file in
a root-only folder, taken without waiting, so two evaluators can never hold the
same uid. The lock belongs to the evaluator's process: it is released when that
process exits, however it exits (a crash or kill -9 included), and the next
evaluator that asks may then claim the uid. An ordinary user has one uid to
give, its own; its candidates are kept apart by their namespaces instead (their
own pid, user and IPC namespaces, so neither signals nor process limits reach
across), and no claim is made.
"""
from __future__ import annotations

import fcntl
import os

FIRST_UID, UIDS = 61000, 2000
LOCK_DIRS = ("/run/atoll/sandbox-uids", "/tmp/atoll-sandbox-uids")  # the first one that can be made


class NoFreeUid(RuntimeError):
    """Every uid of the range is held by a live evaluator on this node."""


def _lock_dir(path: str) -> str:
    os.makedirs(path, mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(f"{path} must be a folder of uid {os.geteuid()} that others cannot write")
    return path


def claim(lock_dir: str = LOCK_DIRS[0], first: int = FIRST_UID, count: int = UIDS) -> tuple[int, int]:
    """(uid, lock fd): the lowest uid of the range no live evaluator holds; keep the fd open while you use it."""
    folder = _lock_dir(lock_dir)
    for uid in range(first, first + count):
        fd = os.open(os.path.join(folder, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return uid, fd
    raise NoFreeUid(f"all {count} sandbox uids from {first} are held by live evaluators on this node")


_CLAIM: tuple[int, int, int] | None = None  # (pid, uid, fd)


def evaluator_uid() -> int | None:
    """This process's claimed uid when it runs as root (claimed on first use), else None."""
    global _CLAIM
    if os.geteuid() != 0:
        return None
    if _CLAIM is None or _CLAIM[0] != os.getpid():  # a forked child claims its own
        for folder in LOCK_DIRS:
            try:
                uid, fd = claim(folder)
                break
            except OSError:  # no /run, or a folder someone else owns: the next place
                continue
        else:
            raise NoFreeUid(f"none of {', '.join(LOCK_DIRS)} can hold the sandbox's uid claims")
        _CLAIM = (os.getpid(), uid, fd)
    return _CLAIM[1]
