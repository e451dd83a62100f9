"""Hostile programs against the real sandbox: each is contained with the status and reason it must get."""
import os
import time
from pathlib import Path

import numpy as np
import pytest

from evaluators._base import CandidateError
from evaluators.sandbox import server
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.process import PolicyProcess
from store.records import Status

LIMITS = SandboxConfig(wall_s=4, memory_mb=1024, startup_s=10)
BATCH = [({"x": np.arange(3.0)}, {"k": np.ones(3)})]

HOSTILE = {
    "infinite loop": ("def policy(s, p):\n    while True:\n        pass", Status.TIMEOUT, "wall-clock limit of 4 s exceeded"),
    "memory bomb": ("def policy(s, p):\n    x = bytearray(10**10)\n    return s['x']", Status.FAILED, "MemoryError"),
    "fork bomb": ("import os\ndef policy(s, p):\n    while True:\n        os.fork()", Status.FAILED, "Resource temporarily unavailable"),
    "disk fill": ("def policy(s, p):\n    f = open('big', 'wb')\n    while True:\n        f.write(b'x' * 10**6)", Status.FAILED, "File too large"),
    "network connect": ("import socket\ndef policy(s, p):\n    socket.create_connection(('127.0.0.1', 22), timeout=2)", Status.FAILED, "Operation not permitted"),
    "write outside scratch": ("def policy(s, p):\n    open('/etc/atoll-was-here', 'w').write('x')", Status.FAILED, "Read-only file system"),
    "huge output": ("import sys\ndef policy(s, p):\n    while True:\n        sys.stdout.write('x' * 100000)", Status.FAILED, "File too large"),
    "parent's environment": ("import os\ndef policy(s, p):\n    return len(open('/proc/%d/environ' % os.getppid(), 'rb').read())", Status.FAILED, "No such file or directory: '/proc/0/environ'"),
    "closes its channel": ("import os, time\ndef policy(s, p):\n    os.closerange(3, 64)\n    time.sleep(30)",
                           Status.FAILED, "closed its channel and did not exit (killed after 5 s)"),
    "os._exit": ("import os\ndef policy(s, p):\n    os._exit(3)", Status.FAILED, "exited with code 3"),
    "deep recursion": ("def f(n):\n    return f(n + 1)\ndef policy(s, p):\n    return f(0)", Status.FAILED, "RecursionError"),
    "raises at import": ("raise ValueError('boom')\ndef policy(s, p):\n    return 0", Status.FAILED, "boom"),
    "no entry point": ("def act(s, p):\n    return 0", Status.FAILED, "no function named 'policy'"),
    "returns strings": ("def policy(s, p):\n    return ['a', 'b', 'c']", Status.FAILED, "not numbers"),
    "forged frame": ("import os, struct\ndef policy(s, p):\n    for fd in range(3, 64):\n        try:\n            os.write(fd, struct.pack('>I', 5) + b'\\xc1' * 5)\n        except OSError:\n            pass\n    import time\n    time.sleep(30)",
                     Status.INVALID, "malformed reply from the program: the reply is not a map"),
    "slow to load": ("import time\ntime.sleep(30)\ndef policy(s, p):\n    return 0", Status.TIMEOUT,
                     "start-up limit of 2 s exceeded"),
    "cpu burner": ("def policy(s, p):\n    while True:\n        pass", Status.TIMEOUT, "CPU-time limit of 1 s exceeded"),
    "segfault": ("import ctypes\ndef policy(s, p):\n    ctypes.string_at(0)", Status.FAILED, "killed by signal SIGSEGV"),
}
OWN_LIMITS = {"slow to load": SandboxConfig(wall_s=4, startup_s=2), "cpu burner": SandboxConfig(wall_s=30, cpu_s=1)}


def run(code, limits=LIMITS, batch=BATCH):
    with PolicyProcess(code, "policy", limits) as proc:
        return proc(batch)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` that has not ended (through /proc's children lists; zombies left out)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in open(f"/proc/{current}/task/{task}/children").read().split()]
            except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
                kids = []
            found += [k for k in kids if _running(k)]
            todo += kids
    return found


def _running(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # it ended meanwhile
        return False


def settles(condition, timeout: float = 10.0) -> bool:
    """Whether `condition()` holds within `timeout` s (a killed process takes a moment to end)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_program_is_contained(name):
    code, status, reason = HOSTILE[name]
    with pytest.raises(CandidateError) as caught:
        run(code, OWN_LIMITS.get(name, LIMITS))
    assert caught.value.status == status, caught.value.reason
    assert reason in caught.value.reason
    assert not os.path.exists("/etc/atoll-was-here")


def spares() -> set[int]:
    """The processes made ready for the next candidates (they wait for code they have not had)."""
    return {pid for spares in server._SPARES.values() for ready in spares
            for pid in [ready.pid, *descendants(ready.pid)]}


def test_honest_program_answers_and_leaves_no_process():
    assert np.array_equal(run("def policy(s, p):\n    return s['x'] * p['k'] * 2")[0], [0.0, 2.0, 4.0])
    assert server._ZYGOTES
    for zygote in server._ZYGOTES.values():
        assert settles(lambda: set(descendants(zygote.proc.pid)) - spares() == set())


def test_a_process_that_leaves_its_group_dies_with_the_candidate():
    code = ("import os, time\ndef policy(s, p):\n    if os.fork() == 0:\n        os.setsid()\n"
            "        if os.fork() == 0:\n            time.sleep(60)\n        os._exit(0)\n"
            "    time.sleep(0.3)\n    return s['x']")
    with PolicyProcess(code, "policy", LIMITS) as proc:
        proc(BATCH)
        fork_server = proc._server.proc.pid
        assert len(set(descendants(fork_server)) - spares()) >= 2  # the candidate (pid 1 of its namespace) and the orphan
    assert settles(lambda: set(descendants(fork_server)) - spares() == set()), (
        f"left running: {described(set(descendants(fork_server)) - spares())}; protections missing: {proc.missing}")


def described(pids) -> list[str]:
    """What a failed check needs to say about processes left behind: their state, parent and namespaces."""
    found = []
    for pid in sorted(pids):
        try:
            status = dict(line.split(":\t", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":\t" in line)
            ns = {name: os.readlink(f"/proc/{pid}/ns/{name}") for name in ("pid", "net", "mnt")}
        except OSError as exc:
            found.append(f"{pid}: {exc}")
            continue
        found.append(f"{pid}: state {status.get('State')}, ppid {status.get('PPid')}, nspid {status.get('NSpid')}, {ns}")
    return found


def test_environment_and_project_files_are_invisible(monkeypatch):
    monkeypatch.setenv("ATOLL_SECRET_TOKEN", "hunter2")
    code = ("import os\ndef ls(path):\n    try:\n        return os.listdir(path)\n    except OSError:\n        return []\n"
            "def policy(s, p):\n"
            "    seen = str(dict(os.environ)) + str(ls(%r)) + str(ls(%r)) + str(ls(os.path.expanduser('~root')))\n"
            "    raise RuntimeError(seen)") % (os.path.dirname(os.path.abspath(__file__)),
                                          str(Path(__file__).resolve().parents[2]))
    with pytest.raises(CandidateError) as caught:
        run(code)
    assert "hunter2" not in caught.value.reason
    assert "test_sandbox.py" not in caught.value.reason and "conftest.py" not in caught.value.reason
    assert "RuntimeError" in caught.value.reason


def test_scratch_does_not_outlive_an_evaluation():
    write = "def policy(s, p):\n    open('note', 'w').write('left behind')\n    return s['x']"
    read = "import os\ndef policy(s, p):\n    return s['x'] + float(os.path.exists('note') or os.path.exists('/tmp/note'))"
    run(write)
    assert np.array_equal(run(read)[0], [0.0, 1.0, 2.0])


def test_sandbox_survives_and_keeps_working_after_a_crash():
    with pytest.raises(CandidateError):
        run("import os\ndef policy(s, p):\n    os._exit(1)")
    assert np.array_equal(run("def policy(s, p):\n    return s['x']")[0], [0.0, 1.0, 2.0])


def test_a_dead_fork_server_is_replaced():
    run("def policy(s, p):\n    return s['x']")
    dead = next(iter(server._ZYGOTES.values())).proc  # held: a later start may already have replaced it
    os.kill(dead.pid, 9)
    dead.wait(timeout=30)
    assert np.array_equal(run("def policy(s, p):\n    return s['x'] + 1")[0], [1.0, 2.0, 3.0])


def test_candidates_cannot_reach_the_fork_server():
    code = ("import os, socket\ndef policy(s, p):\n    found = []\n    for fd in range(3, 256):\n"
            "        try:\n            socket.socket(fileno=os.dup(fd)).send(b'{\"op\": \"spawn\"}')\n"
            "            found.append(fd)\n        except OSError:\n            pass\n"
            "    return s['x'] * 0 + len(found)")
    assert np.array_equal(run(code)[0], [0.0, 0.0, 0.0])


def test_an_exit_by_a_signal_without_a_name_is_described_not_raised():
    """A real-time signal (34 to 64) has no name in Python: describing such an exit raised ValueError
    out of the evaluator (reachable where the sandbox runs without a pid namespace, `require = []`)."""
    import signal

    from evaluators.sandbox.process import _describe_exit

    realtime = signal.SIGRTMIN + 3
    assert _describe_exit(-realtime, SandboxConfig()) == (Status.FAILED, f"the program was killed by signal {realtime}")
    assert _describe_exit(-signal.SIGSEGV, SandboxConfig())[1] == "the program was killed by signal SIGSEGV"
