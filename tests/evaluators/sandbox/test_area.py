"""The shared memory of states: the candidate reads its requests there and can write none of it."""
import json
import mmap

import numpy as np
import pytest

from evaluators._base import CandidateError
from evaluators.sandbox import replies, wire
from evaluators.sandbox.area import StateArea
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.process import PolicyProcess
from store.records import Status

LIMITS = SandboxConfig(wall_s=20, memory_mb=1024, startup_s=10)


def _batches(t: int, leads=(1, 3, 2)):
    return [({"on_hand": np.arange(4, dtype=np.int64) + t, "pipeline": np.full((4, lead), t, np.int64),
              "period": t, "penalty": 9.0, "scale": np.array(2.0 + t)}, {"level": np.full(4, 15.0 + t)})
            for lead in leads]


def _read_only(area: StateArea) -> mmap.mmap:
    return mmap.mmap(area.fd, 0, mmap.MAP_SHARED, mmap.PROT_READ)


def test_states_placed_in_the_area_arrive_as_sent_and_stay_as_they_were():
    area = StateArea(1 << 16)
    view = _read_only(area)
    message, numbers = wire.flat_request(_batches(1), area)
    assert all("at" in column for column in message["flat"]["state"].values() if isinstance(column, dict))
    assert numbers == [4 + 4 * lead + 3 for lead in (1, 3, 2)]
    got = wire.unflatten(wire.unpack(wire.pack(message)[4:])["flat"], view)
    area.reset()
    wire.flat_request(_batches(2), area)  # the next period overwrites the area
    for (state, params), (want_state, want_params) in zip(got, _batches(1)):
        assert list(state) == list(want_state)
        for key, value in want_state.items():
            assert np.array_equal(state[key], value) and np.shape(state[key]) == np.shape(value)
        assert np.array_equal(params["level"], want_params["level"])
        assert not state["on_hand"].flags.writeable and not params["level"].flags.writeable
        assert type(state["scale"]) is np.ndarray and state["scale"].shape == ()


def test_a_request_larger_than_the_area_goes_on_the_pipe():
    area = StateArea(4096)
    batches = [({"x": np.arange(1000.0)}, {}), ({"x": np.arange(1000.0) + 1}, {})]
    message, _ = wire.flat_request(batches, area)
    assert "data" in message["flat"]["state"]["x"]
    got = wire.unflatten(wire.unpack(wire.pack(message)[4:])["flat"], _read_only(area))
    assert np.array_equal(got[1][0]["x"], np.arange(1000.0) + 1)


# Every way to write the area a candidate may try; each outcome is reported, none may succeed.
ATTACKS = '''import ctypes, json, os
import numpy as np
OUT = {}

def _area():
    for line in open("/proc/self/maps"):
        if "atoll-states" in line:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            return lo, hi, line.split()[1]

def _try(name, call):
    try:
        OUT[name] = repr(call())
    except Exception as exc:
        OUT[name] = type(exc).__name__

def _attack():
    libc = ctypes.CDLL(None, use_errno=True)
    lo, hi, perms = _area()
    OUT["perms"] = perms
    OUT["mprotect"] = (libc.mprotect(ctypes.c_void_p(lo), hi - lo, 3), ctypes.get_errno())
    OUT["madvise remove"] = (libc.madvise(ctypes.c_void_p(lo), hi - lo, 9), ctypes.get_errno())
    _try("map_files", lambda: os.open("/proc/self/map_files/%x-%x" % (lo, hi), os.O_RDWR))
    OUT["fds"] = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            OUT["fds"].append(os.readlink("/proc/self/fd/" + fd))
        except OSError:  # the listing's own descriptor, closed by now
            pass

def policy(state, params):
    if state["period"] == 1:
        _attack()
    if state["period"] == 3:
        raise RuntimeError("REPORT" + json.dumps(OUT))
    return state["on_hand"] + state["pipeline"].sum(axis=1) + params["level"]
'''


def _expected(t: int):
    return [s["on_hand"] + s["pipeline"].sum(axis=1) + p["level"] for s, p in _batches(t)]


def test_a_candidate_can_write_none_of_the_area_and_its_states_stay_true():
    with PolicyProcess(ATTACKS, "policy", LIMITS) as proc:
        for t in (1, 2):
            got = proc(_batches(t))
            assert all(np.array_equal(a, b) for a, b in zip(got, _expected(t)))
        with pytest.raises(CandidateError) as caught:
            proc(_batches(3))
    # the report is the exception's message, the traceback's last line (its source line above it also names REPORT)
    report = json.loads(caught.value.reason.rsplit("REPORT", 1)[1].splitlines()[0])
    assert report["perms"] == "r--s"  # shared, read-only
    assert report["mprotect"] == [-1, 13]  # EACCES: the mapping may never become writable
    assert report["madvise remove"] == [-1, 13]
    assert report["map_files"] in ("PermissionError", "FileNotFoundError")
    assert not any("atoll-states" in link for link in report["fds"])  # its descriptor was closed


WRITE_THROUGH = '''import ctypes

def policy(state, params):
    for line in open("/proc/self/maps"):
        if "atoll-states" in line:
            ctypes.memset(int(line.split("-")[0], 16), 255, 64)
    return state["x"]
'''


def test_a_write_to_the_area_kills_only_the_candidate():
    batch = [({"x": np.arange(8.0)}, {})]
    with pytest.raises(CandidateError) as caught, PolicyProcess(WRITE_THROUGH, "policy", LIMITS) as proc:
        seen = np.frombuffer(proc._area._map, np.float64, 8, 0)  # the evaluator's own view, kept past the end
        proc(batch)
    assert caught.value.status == Status.FAILED and "SIGSEGV" in caught.value.reason, caught.value.reason
    assert np.array_equal(seen, np.arange(8.0))


# The reply read from the layout of the last one: whatever differs from it is read in full.
def _reply(actions):
    return wire.pack(wire.flat_actions(actions))[4:]


def test_a_reply_like_the_last_one_is_read_from_its_layout_and_any_change_is_checked():
    reader, bounds = replies.Replies(), [1040, 1040]
    first = reader.read(_reply([np.zeros(4), np.ones(4)]), bounds)["actions"]
    assert [a.tolist() for a in first] == [[0.0] * 4, [1.0] * 4]
    again = reader.read(_reply([np.full(4, 2.0), np.full(4, 3.0)]), bounds)["actions"]
    assert [a.tolist() for a in again] == [[2.0] * 4, [3.0] * 4]
    with pytest.raises(wire.WireError, match="bytes after its end"):
        reader.read(_reply([np.zeros(4), np.ones(4)]) + b"\0", bounds)
    with pytest.raises(wire.WireError, match="allows at most 3"):
        reader.read(_reply([np.zeros(4), np.ones(4)]), [4, 3])  # the same bytes under tighter bounds
    with pytest.raises(wire.WireError, match="allows at most 1040"):
        reader.read(_reply([np.zeros(4), np.ones(2000)]), bounds)
    swapped = bytearray(_reply([np.zeros(4), np.ones(4)]))
    swapped[swapped.index(b"<f8")] = ord(">")  # the same length, another dtype
    with pytest.raises(wire.WireError, match="is not allowed"):
        reader.read(bytes(swapped), bounds)


# After one honest reply (whose layout the evaluator learns), a forged one with the same head.
LEARNED_THEN_FORGED = '''import os, struct, sys, time
import numpy as np
CALLS = []

def policy(state, params):
    CALLS.append(1)
    if len(CALLS) == 2:
        wire = sys.modules["wire"]
        frame = wire.pack(wire.flat_actions([np.zeros(4)]))
        body = frame[4:] + TAIL
        for fd in range(3, 32):
            try:
                os.write(fd, struct.pack(">I", len(body)) + body)
            except OSError:
                pass
        time.sleep(30)
    return np.zeros(4)
'''


def test_a_forged_reply_after_an_honest_one_is_still_read_in_full():
    batch = [({"x": np.zeros(4)}, {})]
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess(LEARNED_THEN_FORGED.replace("TAIL", 'b"\\0"'), "policy", LIMITS) as proc:
        proc(batch)
        proc(batch)
    assert caught.value.status == Status.INVALID and "bytes after its end" in caught.value.reason, caught.value.reason


def test_where_the_area_cannot_be_sealed_states_go_on_the_pipe(monkeypatch):
    from evaluators.sandbox import server

    def unsealable(*_):
        raise OSError(22, "this kernel cannot seal a memfd")

    monkeypatch.setattr(server, "StateArea", unsealable)
    limits = SandboxConfig(wall_s=20, memory_mb=1024, startup_s=10, cpu_s=299)  # no spare of another test fits
    with PolicyProcess(ATTACKS.replace('state["period"] == 1', "False"), "policy", limits, spare=False) as proc:
        assert proc._area is None
        for t in (1, 2):
            got = proc(_batches(t))
            assert all(np.array_equal(a, b) for a, b in zip(got, _expected(t)))
