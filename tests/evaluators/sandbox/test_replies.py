"""Replies that could hurt the trusted side: each is INVALID (or clipped) and costs the evaluator little memory."""
import json
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

from evaluators._base import CandidateError
from evaluators.sandbox import wire
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.process import PolicyProcess
from store.records import Status

ROOT = Path(__file__).resolve().parents[3]
LIMITS = SandboxConfig(wall_s=10, memory_mb=1024, startup_s=10)
BATCH = [({"x": np.zeros(4)}, {})]

# Writes a frame (a msgpack body made by the source expression `body`, with a length header) to
# every descriptor it can reach, at import or when asked for actions, then waits.
FORGE = '''import os, struct, time
BODY = {body}

def _forge():
    for fd in range(3, 32):
        try:
            os.write(fd, struct.pack(">I", {length} if {length} >= 0 else len(BODY)) + BODY)
        except OSError:
            pass
    time.sleep(30)

if {at_load}:
    _forge()

def policy(s, p):
    _forge()
'''


def _no_numbers(shape: list) -> msgpack.ExtType:
    """An array extension that holds no numbers, of `shape` (one of whose dimensions is 0)."""
    return msgpack.ExtType(wire.ARRAY_EXT, msgpack.packb(["<f8", shape]))


NESTED = 'b"\\x81\\xa7actions\\xdd" + ((1 << 24) - 16).to_bytes(4, "big") + b"\\x90" * ((1 << 24) - 16)'
ATTACKS = {  # name: (body, declared length or None, at load, status, reason)
    "16 MiB of empty lists": (NESTED, None, False, Status.INVALID, "where this request allows at most"),
    "a header that claims 4 GiB": (b"", (1 << 32) - 1, False, Status.INVALID, "where this request allows at most"),
    "ready of the wrong type": (wire.pack({"ready": 5})[4:], None, True, Status.INVALID, "'ready' is not a list"),
    "ready with a stray field": (wire.pack({"ready": [], "score": 1.0})[4:], None, True, Status.INVALID,
                                 "unexpected field 'score'"),
    "actions of the wrong type": (wire.pack({"actions": "xyz"})[4:], None, False, Status.INVALID,
                                  "'actions' is not a list"),
    "a list where an array belongs": (wire.pack({"actions": [[1.0] * 4]})[4:], None, False, Status.INVALID,
                                      "action array 0 is not an array of numbers"),
    "an array larger than asked": (wire.pack({"actions": [np.zeros(2000, np.int8)]})[4:], None, False, Status.INVALID,
                                   "an array of 2000 numbers where this request allows at most 1040"),
    "an array whose shape lies": (b"\x81\xa7actions\x91\xc7\x0c\x01\x92\xa3<f8\x91\xcd\x27\x10" + b"\0" * 3, None,
                                  False, Status.INVALID, "an array of 10000 numbers"),
    "bytes after the end": (wire.pack({"actions": [np.zeros(4)]})[4:] + b"\xc0", None, False, Status.INVALID,
                            "the reply has bytes after its end"),
    "a flat shape larger than asked": (wire.pack({"flat": [[[2000]], np.zeros(2000)]})[4:], None, False,
                                       Status.INVALID, "an array of 2000 numbers where this request allows at most 1040"),
    "flat data longer than its shapes": (wire.pack({"flat": [[[4]], np.zeros(8)]})[4:], None, False, Status.INVALID,
                                         "an array of 8 numbers where this request allows at most 4"),
    "flat data of two dimensions": (wire.pack({"flat": [[[4]], np.zeros((2, 2))]})[4:], None, False, Status.INVALID,
                                    "the flat actions do not match their shapes"),
    "more flat shapes than batches": (wire.pack({"flat": [[[1], [1]], np.zeros(2)]})[4:], None, False,
                                      Status.INVALID, "'flat' shapes has 2 items where at most 1 are allowed"),
    "a flat shape that is not a number": (wire.pack({"flat": [[["4"]], np.zeros(4)]})[4:], None, False,
                                          Status.INVALID, "is not a non-negative integer"),
    "no numbers, in a shape numpy cannot hold": (msgpack.packb({"actions": [_no_numbers([0, (1 << 64) - 1])]}), None,
                                                 False, Status.INVALID, "shape [0, 18446744073709551615] is not allowed"),
    "a flat shape of no numbers numpy cannot hold": (msgpack.packb({"flat": [[[0, 1 << 62, 1 << 62]], _no_numbers([0])]}),
                                                     None, False, Status.INVALID, "is not allowed"),
    "flat with a third item": (wire.pack({"flat": [[[4]], np.zeros(4), 1]})[4:], None, False, Status.INVALID,
                               "'flat' has 3 items where at most 2 are allowed"),
}


def _attack(name):
    body, length, at_load, _, _ = ATTACKS[name]
    return FORGE.format(body=body if isinstance(body, str) else repr(body), length=-1 if length is None else length,
                        at_load=at_load)


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_malformed_reply_is_invalid_with_its_reason(name):
    *_, status, reason = ATTACKS[name]
    with pytest.raises(CandidateError) as caught, PolicyProcess(_attack(name), "policy", LIMITS) as proc:
        proc(BATCH)
    assert caught.value.status == status and reason in caught.value.reason, caught.value.reason
    assert len(caught.value.reason) < 300


def test_a_huge_error_text_is_clipped_or_refused():
    code = ("import sys\nsys.modules['__main__']._error = lambda exc: {'error': 'x' * SIZE}\n"
            "def policy(s, p):\n    raise ValueError")
    with pytest.raises(CandidateError) as caught, PolicyProcess(code.replace("SIZE", "20000"), "policy", LIMITS) as p:
        p(BATCH)
    assert caught.value.status == Status.FAILED and len(caught.value.reason) < 4200
    with pytest.raises(CandidateError) as caught, PolicyProcess(code.replace("SIZE", "(16 << 20)"), "policy", LIMITS) as p:
        p(BATCH)
    assert caught.value.status == Status.INVALID and "where this request allows at most" in caught.value.reason


MEASURE = '''
import json, resource, sys
sys.path.insert(0, {root!r})
import numpy as np
from evaluators._base import CandidateError
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.process import PolicyProcess
from tests.evaluators.sandbox.test_replies import ATTACKS, BATCH, _attack

def peak_kib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

with PolicyProcess("def policy(s, p):\\n    return s['x']", "policy", SandboxConfig()) as proc:
    proc(BATCH)  # warm: the fork server runs, the wire is imported
growth = {{}}
for name in sorted(ATTACKS):
    before = peak_kib()
    try:
        with PolicyProcess(_attack(name), "policy", SandboxConfig(wall_s=10)) as proc:
            proc(BATCH)
    except CandidateError:
        pass
    growth[name] = peak_kib() - before
print(json.dumps(growth))
'''


def test_hostile_replies_cost_the_evaluator_little_memory():
    """In a fresh process (its peak RSS is its own): no attack grows the evaluator by 16 MiB."""
    out = subprocess.run([sys.executable, "-c", MEASURE.format(root=str(ROOT))], capture_output=True, text=True,
                         timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    growth = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(growth) == set(ATTACKS)
    assert max(growth.values()) < 16 << 10, growth  # KiB; decoding the 16 MiB reply once cost about 1.1 GiB
