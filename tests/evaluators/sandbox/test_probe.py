"""Protections as data: the probe before a run, the one-line refusal, and what a candidate is never run without."""
import os
import subprocess
import sys

import numpy as np
import pytest

from evaluators._base import CandidateError
from evaluators.sandbox import server
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.probe import SandboxRefused, required, why_not
from evaluators.sandbox.process import PolicyProcess
from store.records import Status

EVERYTHING = ("no-network", "private-filesystem", "own-ipc", "own-pids", "no-capabilities", "seccomp", "rlimits")
ROOT_ONLY = ("unprivileged-uid",)


def test_every_protection_this_user_can_have_is_required_and_holds():
    wanted = EVERYTHING + (ROOT_ONLY if os.geteuid() == 0 else ())
    assert sorted(required(SandboxConfig(require=wanted))) == sorted(wanted)


def test_unknown_protections_are_a_config_error():
    with pytest.raises(ValueError, match="require"):
        SandboxConfig(require=("no-netwrk",))


@pytest.mark.skipif(os.geteuid() == 0, reason="as root every protection holds; the unprivileged pass runs this")
def test_a_protection_that_cannot_hold_refuses_with_one_line():
    with pytest.raises(SandboxRefused) as refused:
        required(SandboxConfig(require=("no-network", "unprivileged-uid")))
    line = str(refused.value)
    assert "\n" not in line and line.startswith("the sandbox cannot hold unprivileged-uid: the evaluator runs as uid")
    assert line.endswith("or remove 'unprivileged-uid' from evaluator.sandbox.require (candidates then run without it)")


@pytest.mark.skipif(os.geteuid() == 0, reason="as root every protection holds; the unprivileged pass runs this")
def test_a_candidate_is_never_run_without_a_required_protection():
    code = "open('/tmp/ran', 'w')\ndef policy(s, p):\n    return s['x']"
    with pytest.raises(CandidateError) as caught, \
            PolicyProcess(code, "policy", SandboxConfig(require=("unprivileged-uid",))) as proc:
        proc([({"x": np.zeros(1)}, {})])
    assert caught.value.status == Status.FAILED
    assert caught.value.reason.startswith("the sandbox cannot hold what evaluator.sandbox.require asks (unprivileged-uid")


@pytest.mark.skipif(os.geteuid() == 0, reason="as root every protection holds; the unprivileged pass runs this")
def test_the_cli_refuses_before_any_run_row_exists(atoll_cli, tmp_path):
    run_dir = tmp_path / "run"
    out = atoll_cli("run", "configs/inventory.toml", "--run-dir", str(run_dir), "--set",
                    'evaluator.sandbox.require=["no-network", "unprivileged-uid"]', check=False)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "the sandbox cannot hold unprivileged-uid" in out.stderr
    assert not (run_dir / "archive.duckdb").exists()


def test_a_kernel_that_refuses_user_namespaces_is_named():
    """Here the kernel allows them (the tests above pass), so the reason is passed on as it came."""
    why, how = why_not("no-network", "no namespaces: Operation not permitted (errno 1)")
    assert why == "user namespaces are unavailable (no namespaces: Operation not permitted (errno 1))"
    assert how.startswith("run where the kernel allows them, ")
    assert how.endswith("or remove 'no-network' from evaluator.sandbox.require (candidates then run without it)")


def test_a_fork_server_that_cannot_start_says_why_in_one_line(tmp_path, monkeypatch):
    """An interpreter whose packages come from PYTHONPATH or the user's site-packages, which the
    fork server's `python -I` ignores: the refusal names the import it could not make."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    monkeypatch.setattr(server.sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    monkeypatch.setattr(server, "_ZYGOTES", {})
    with pytest.raises(SandboxRefused) as refused:
        required(SandboxConfig())
    line = str(refused.value)
    assert "\n" not in line and "-I, which ignores PYTHONPATH and user site-packages) did not start: " \
        "ModuleNotFoundError: No module named" in line, line
