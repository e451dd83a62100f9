"""Pieces of hostile candidate programs that every domain's integrity tests use.

Each piece is program text. The domain's test supplies its own entry point and
its honest answer, so a hostile program that gains nothing scores exactly what the
honest one does, and one that gains something shows up as a different score.
`assert_outcome` checks the one outcome each attack must get: a status and its
reason, or the honest score to the last digit.
"""

# Writes a well-formed result frame into every descriptor it can reach, then answers honestly.
_FORGE = '''\
import os, struct
import numpy as np

def {head}:
    import msgpack
    body = msgpack.packb({fake!r})
    for fd in range(3, 64):
        try:
            os.write(fd, struct.pack(">I", len(body)) + body)
        except OSError:
            pass
    return {answer}
'''

# Replies to its first request with a 16 MiB frame of sixteen million empty lists (decoded
# blindly, that once grew the evaluator by 1.1 GiB), written to every descriptor it can reach.
_HUGE_REPLY = '''\
import os, struct
import numpy as np

def {head}:
    body = b"\\x81\\xa7actions\\xdd" + ((1 << 24) - 16).to_bytes(4, "big") + b"\\x90" * ((1 << 24) - 16)
    for fd in range(3, 32):
        try:
            os.write(fd, struct.pack(">I", len(body)) + body)
        except OSError:
            pass
    return {answer}
'''

# At load, before the real start-up reply, a "ready" message whose field has the wrong type.
_WRONG_READY = '''\
import os, struct
import msgpack
import numpy as np
_body = msgpack.packb({{"ready": 5}})
for _fd in range(3, 32):
    try:
        os.write(_fd, struct.pack(">I", len(_body)) + _body)
    except OSError:
        pass

def {head}:
    return {answer}
'''

# Defines FOUND, _try(label, fn) and _snoop_processes(): what the parent (the fork server)
# and the grandparent (the evaluator, which holds the data) expose through /proc.
SNOOP_PRELUDE = '''\
import os, sys
import numpy as np
FOUND = []

def _try(label, fn):
    try:
        got = fn()
    except Exception:
        return
    if got:
        FOUND.append(label + ": " + str(got)[:200])

def _grandparent():
    try:
        status = open("/proc/%d/status" % os.getppid()).read()
    except OSError:  # no parent in sight (the candidate is pid 1 of its own pid namespace)
        return 0
    return int(status.split("PPid:")[1].split()[0])

def _snoop_processes():
    for pid in (os.getppid(), _grandparent()):
        _try("environ", lambda: open("/proc/%d/environ" % pid, "rb").read())
        _try("memory", lambda: open("/proc/%d/mem" % pid, "rb").read(64))
        _try("maps", lambda: open("/proc/%d/maps" % pid).read())
        _try("open files", lambda: os.listdir("/proc/%d/fd" % pid))

def _snoop_packages():
    """Other packages and any copy of Atoll, installed or editable: listed, imported or read."""
    import site
    for top in site.getsitepackages():
        _try("packages", lambda: [d for d in os.listdir(top) if d not in ("numpy", "numpy.libs")])
    for name in ("evaluators", "controller", "store", "atoll", "pyscipopt", "gymnasium", "skfolio"):
        _try("imported " + name, lambda: __import__(name))

def _walk(top, words):
    hits = []
    for dirpath, dirnames, filenames in os.walk(top):
        if dirpath.startswith((sys.prefix, sys.base_prefix, "/tmp/.keep")) or "site-packages" in dirpath:
            continue  # the interpreter and its libraries are readable by design
        hits += [os.path.join(dirpath, f) for f in filenames
                 if any(w in f for w in words) or f.endswith((".duckdb", ".toml"))]
        if len(hits) > 20:
            break
    return hits
'''

# Defines REMEMBERED: whether an earlier evaluation left a note in any of SPOTS (a list
# expression the test fills in) or in System V shared memory, a System V message queue or
# a POSIX message queue, and leaves one in each for the next evaluation.
_REMEMBER = '''\
import ctypes, os
import numpy as np
SPOTS = {spots}
_libc = ctypes.CDLL(None, use_errno=True)
_KEY, _IPC_CREAT = 0x41544F4C, 0o1000

def _mqueue(flags):
    return _libc.mq_open(b"/atoll_note", flags, 0o666, None) if hasattr(_libc, "mq_open") else -1

REMEMBERED = (any(os.path.exists(p) for p in SPOTS) or _libc.shmget(_KEY, 0, 0) != -1
              or _libc.msgget(_KEY, 0) != -1 or _mqueue(os.O_RDONLY) != -1)  # at load: only an earlier evaluation
for _p in SPOTS:
    try:
        with open(_p, "w") as _f:
            _f.write("seen")
    except OSError:
        pass
_libc.shmget(_KEY, 4096, _IPC_CREAT | 0o666)
_libc.msgget(_KEY, _IPC_CREAT | 0o666)
_mqueue(os.O_CREAT | os.O_RDWR)
'''

COMMON_SPOTS = ('["/tmp/atoll_note", "/var/tmp/atoll_note", "/dev/shm/atoll_note", "/run/lock/atoll_note", '
                '"/run/atoll_note", os.path.expanduser("~/atoll_note"), os.path.join(os.getcwd(), "atoll_note"), '
                'PROJECT + "/atoll_note"]')


def assert_outcome(result, status, reason: str = "", score: float | None = None, tolerance: float = 1e-12) -> None:
    """The exact outcome an attack must get: `status`; its `reason` in the error, or (OK) the honest `score`."""
    from store.records import Status

    assert result.status == status, (result.status, result.error)
    if status == Status.OK:
        assert score is not None and abs(result.score - score) <= tolerance, (result.score, score)
    else:
        assert reason and reason in result.error, result.error


def huge_reply(head: str, answer: str) -> str:
    """A program `def {head}:` that answers with a 16 MiB frame, then would return `answer`."""
    return _HUGE_REPLY.format(head=head, answer=answer)


def wrong_ready(head: str, answer: str) -> str:
    """A program that forges a start-up reply of the wrong type at load; `def {head}:` returns `answer`."""
    return _WRONG_READY.format(head=head, answer=answer)


# What each reply above must get: INVALID, with these reasons.
HUGE_REASON = "where this request allows at most"
WRONG_READY_REASON = "malformed reply from the program: 'ready' is not a list"


def forge_frame(head: str, answer: str, fake: dict) -> str:
    """A program `def {head}:` that forges the result frame `fake`, then returns `answer`."""
    return _FORGE.format(head=head, answer=answer, fake=fake)


def remember_prelude(extra_spots: str = "") -> str:
    """The REMEMBERED prelude over the common spots plus `extra_spots` (`+ [...]` source text)."""
    return _REMEMBER.format(spots=COMMON_SPOTS + extra_spots)
