"""Pieces of hostile candidate programs that every domain's integrity tests use.

Each piece is program text. The domain's test supplies its own entry point and
its honest answer, so a hostile program that gains nothing scores exactly what the
honest one does, and one that gains something shows up as a better score.
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
    status = open("/proc/%d/status" % os.getppid()).read()
    return int(status.split("PPid:")[1].split()[0])

def _snoop_processes():
    for pid in (os.getppid(), _grandparent()):
        _try("environ", lambda: open("/proc/%d/environ" % pid, "rb").read())
        _try("memory", lambda: open("/proc/%d/mem" % pid, "rb").read(64))
        _try("maps", lambda: open("/proc/%d/maps" % pid).read())
        _try("open files", lambda: os.listdir("/proc/%d/fd" % pid))

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
# expression the test fills in), and leaves one for the next evaluation.
_REMEMBER = '''\
import os
import numpy as np
SPOTS = {spots}
REMEMBERED = any(os.path.exists(p) for p in SPOTS)  # at load: only an earlier evaluation can have left it
for _p in SPOTS:
    try:
        with open(_p, "w") as _f:
            _f.write("seen")
    except OSError:
        pass
'''

COMMON_SPOTS = ('["/tmp/atoll_note", "/var/tmp/atoll_note", "/dev/shm/atoll_note", '
                'os.path.expanduser("~/atoll_note"), os.path.join(os.getcwd(), "atoll_note"), '
                'PROJECT + "/atoll_note"]')


def assert_no_better(result, honest_score: float, tolerance: float) -> None:
    """A hostile program either scores no better than the honest one or fails with a readable reason."""
    from store.records import Status

    if result.status == Status.OK:
        assert result.score <= honest_score + tolerance, result
    else:
        assert result.error and len(result.error.strip()) > 10


def forge_frame(head: str, answer: str, fake: dict) -> str:
    """A program `def {head}:` that forges the result frame `fake`, then returns `answer`."""
    return _FORGE.format(head=head, answer=answer, fake=fake)


def remember_prelude(extra_spots: str = "") -> str:
    """The REMEMBERED prelude over the common spots plus `extra_spots` (`+ [...]` source text)."""
    return _REMEMBER.format(spots=COMMON_SPOTS + extra_spots)
