"""Joining a Ray cluster by address: a bad address is one clear line before anything starts.

`ray.init` takes a malformed address as a bare ValueError and waits a minute or
more on an address where nothing listens; a run checks the address first, so it
refuses before its run directory or run row exists.
"""
from __future__ import annotations

import socket

import ray

from controller.cli import UserError

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
    """Check `address`, then join the cluster there; any refusal is a UserError."""
    check_address(address, source)
    try:
        ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{source} {address}: cannot join the Ray cluster there: {detail}") from None
