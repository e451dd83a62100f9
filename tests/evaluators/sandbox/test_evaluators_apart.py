"""Evaluators that cannot harm each other: a uid each, claimed on the node; clean-up that touches only its own."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from evaluators.sandbox import uids

ROOT = Path(__file__).resolve().parents[3]
HOLD = "import sys, time\nsys.path.insert(0, {root!r})\nfrom evaluators.sandbox import uids\n" \
       "uid, fd = uids.claim({folder!r}, 70000, 3)\nprint(uid, flush=True)\ntime.sleep(60)\n"


def _holder(folder):
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(root=str(ROOT), folder=str(folder))],
                            stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def test_live_evaluators_hold_different_uids_and_a_crash_frees_its_uid(tmp_path):
    first, a = _holder(tmp_path)
    second, b = _holder(tmp_path)
    try:
        assert (a, b) == (70000, 70001)
        first.send_signal(signal.SIGKILL)  # a crash: the lock dies with the process
        first.wait(timeout=30)
        third, c = _holder(tmp_path)
        third.kill()
        third.wait(timeout=30)
        assert c == 70000
        held = [uids.claim(str(tmp_path), 70000, 3) for _ in range(2)]
        assert [uid for uid, _ in held] == [70000, 70002]  # 70001 is still the second one's
        with pytest.raises(uids.NoFreeUid):
            uids.claim(str(tmp_path), 70000, 3)
        for _, fd in held:
            os.close(fd)
    finally:
        second.kill()
        second.wait(timeout=30)


def test_a_lock_folder_others_can_write_is_refused(tmp_path):
    folder = tmp_path / "locks"
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    with pytest.raises(PermissionError):
        uids.claim(str(folder), 70000, 3)


# One evaluator process: candidates that fork a child and sleep, so they are alive while the
# others start, finish and clean up; it prints its claimed uid and every candidate's outcome.
EVALUATOR = '''
import json, os, sys, time
sys.path.insert(0, {root!r})
import numpy as np
from evaluators._base import CandidateError
from evaluators.sandbox import uids
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.process import PolicyProcess

CODE = """import os, time
def policy(s, p):
    if os.fork() == 0:
        time.sleep(5)
        os._exit(0)
    time.sleep(0.4)
    return s['x'] + 1
"""
def barrier(name):  # every evaluator is alive (and holds its uid) until all have passed
    open(os.path.join({meet!r}, name + "-" + str(os.getpid())), "w").close()
    while sum(f.startswith(name) for f in os.listdir({meet!r})) < {count}:
        time.sleep(0.05)

uids.evaluator_uid()
barrier("claimed")
outcomes = []
for _ in range(4):
    try:
        with PolicyProcess(CODE, "policy", SandboxConfig(wall_s=60, startup_s=60)) as proc:
            outcomes.append(float(proc([({{"x": np.zeros(1)}}, {{}})])[0][0]))
    except CandidateError as exc:
        outcomes.append(exc.reason)
barrier("done")
print(json.dumps({{"uid": uids.evaluator_uid(), "outcomes": outcomes}}))
'''


def test_more_evaluators_than_cores_never_kill_each_others_candidates(tmp_path):
    count = max(4, 2 * (os.cpu_count() or 1))
    script = EVALUATOR.format(root=str(ROOT), meet=str(tmp_path), count=count)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for _ in range(count)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=280)
        assert proc.returncode == 0, err[-2000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["outcomes"] == [1.0] * 4 for r in reports), reports  # no candidate was killed by another
    held = [r["uid"] for r in reports]
    assert held == [None] * len(held) if os.geteuid() else len(set(held)) == len(held), held
