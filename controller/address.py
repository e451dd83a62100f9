"""Joining a Ray cluster by address: a bad address is one clear line before anything starts.

`ray.init` takes a malformed address as a bare ValueError and waits a minute or
more on an address where nothing listens; a run checks the address first, so it
refuses before its run directory or run row exists.
"""
from __future__ import annotations

import contextlib
import socket

import ray

from controller.cli import UserError
from store import signals

FORMS = ("HOST:PORT (the head's address printed by `ray start --head`, e.g. 10.0.0.5:6379), "
         "ray://HOST:PORT (Ray Client) or auto (the cluster started on this machine)")


def check_address(address: str, source: str = "--ray-address") -> None:
    """Raise UserError unless a Ray cluster's head answers at `address` (as `ray.init` reads it)."""
    if address == "local":  # `ray.init` starts a cluster of its own
        return
    host_port = _resolve(address, source)
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"{source} {address!r}: not an address; expected {FORMS}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise UserError(f"{source} {address}: no Ray cluster answers at {host_port} ({exc.strerror or exc}); "
                        f"start one with `ray start --head`, or give its head's address") from None


def _resolve(address: str, source: str) -> str:
    if address.startswith("ray://"):
        return address.removeprefix("ray://").split("/", 1)[0]
    if address != "auto":
        return address
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError):
        found = None
    if not found:
        raise UserError(f"{source} auto: no Ray cluster was started on this machine; start one with "
                        "`ray start --head`, or give its head's address")
    return found


def join(address: str, runtime_env: dict, source: str = "--ray-address") -> None:
    """Check `address`, then join the cluster there; any refusal is a UserError. A Ctrl-C or SIGTERM
    (`ray job stop`) meanwhile waits for the join, then stops the command as anywhere else."""
    check_address(address, source)
    try:
        with signals.held(), ray_leaves_sigterm():
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{source} {address}: cannot join the Ray cluster there: {detail}") from None


@contextlib.contextmanager
def ray_leaves_sigterm():
    """`ray.init` without the SIGTERM handler it puts in place (a `sys.exit(15)`, silent, that stopped
    a command halfway through Ray's start and left its agents running): Atoll's own stays."""
    with patched(getattr(ray._private, "utils", None), "set_sigterm_handler", lambda handler: None):
        yield


@contextlib.contextmanager
def patched(owner, name: str, replacement):
    """`owner.name` is `replacement` within the block; where Ray has no such attribute, nothing changes."""
    original = getattr(owner, name, None)
    if original is None:
        yield
        return
    setattr(owner, name, replacement)
    try:
        yield
    finally:
        setattr(owner, name, original)
