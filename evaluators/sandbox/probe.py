"""Which protections the sandbox holds on this machine, checked before a run starts.

`required(limits)` runs one trusted no-op program through the real sandbox,
reads which protections its process reports in force and why any other is
missing, and refuses, with one line naming the protection, why it cannot hold
and how to proceed, when `limits.require` lists one that is missing. Every
candidate's process checks the same list again before it loads any code, so a
node where a protection stops holding fails its candidates instead of running
them unprotected.
"""
from __future__ import annotations

from pathlib import Path

from evaluators._base import CandidateError
from evaluators.sandbox import server
from evaluators.sandbox.config import SandboxConfig
from evaluators.sandbox.process import PolicyProcess

PROBE = "def policy(state, params):\n    return 0\n"
# Kernel switches that refuse user namespaces: (sysctl, value that refuses, the setting that allows them).
_SWITCHES = (("user.max_user_namespaces", "0", "sysctl -w user.max_user_namespaces=10000"),
             ("kernel.unprivileged_userns_clone", "0", "sysctl -w kernel.unprivileged_userns_clone=1"),
             ("kernel.apparmor_restrict_unprivileged_userns", "1",
              "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile that allows this "
              "Python to create user namespaces"))


class SandboxRefused(Exception):
    """A required protection cannot hold here; the message is one line: which, why, and how to proceed."""


def probe(limits: SandboxConfig) -> tuple[list[str], dict[str, str]]:
    """(protections in force, {missing protection: why}) for a candidate's process on this machine."""
    proc = PolicyProcess(PROBE, "policy", limits.model_copy(update={"require": ()}), spare=False)
    try:
        with proc:
            return list(proc.protections), dict(proc.missing)
    finally:  # nothing of the probe stays in the driver
        server.stop(proc.server_key())


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return None


def why_not(name: str, reason: str) -> tuple[str, str]:
    """(why `name` cannot hold, how to proceed), naming the kernel switch where one is the cause."""
    drop = f"or remove '{name}' from evaluator.sandbox.require (candidates then run without it)"
    if reason.startswith("no namespaces"):
        for switch, refusing, allow in _SWITCHES:
            if _sysctl(switch) == refusing:
                return (f"the kernel refuses unprivileged user namespaces (sysctl {switch} = {refusing})",
                        f"allow them ({allow}) {drop}")
        return f"user namespaces are unavailable ({reason})", f"run where the kernel allows them, {drop}"
    if name == "unprivileged-uid":
        return reason, f"run the evaluators as root, {drop}"
    return reason, f"fix that, {drop}"


def required(limits: SandboxConfig) -> list[str]:
    """The protections in force; raises `SandboxRefused` if one that `limits.require` lists is missing."""
    try:
        held, missing = probe(limits)
    except CandidateError as exc:  # the probe's own trusted program failed: the sandbox does not work here
        raise SandboxRefused(f"the sandbox does not work here: {exc.reason.splitlines()[0]}") from None
    except server.ForkServerFailed as exc:
        raise SandboxRefused(str(exc)) from None
    for name in limits.require:
        if name not in held:
            why, how = why_not(name, missing.get(name, "not reported by the sandbox"))
            raise SandboxRefused(f"the sandbox cannot hold {name}: {why}; {how}".replace("\n", " "))
    return held
