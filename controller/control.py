"""The control plane's settings, its token, and where a live run records its address.

The driver serves a gRPC service (`controller/control.proto`, `control_server.py`)
while its search runs. By default it binds 127.0.0.1 on a free port, draws a token
and writes both into RUN_DIR/control.json (mode 0600), so whoever can read the run
directory can steer the run and nobody else on the machine can. Binding any other
address needs the user's own token (ATOLL_CONTROL_TOKEN, or `control.token_file`),
which is then never written to the run directory; without one the run refuses to
start. A run that is not live has no control.json (the driver removes it when the
search ends; a killed driver's file names a dead pid and is ignored).
"""
from __future__ import annotations

import ipaddress
import json
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

RECORD = "control.json"
TOKEN_ENV = "ATOLL_CONTROL_TOKEN"
TOKEN_HEADER = "x-atoll-token"
MIN_TOKEN_CHARS = 16


class ControlConfig(BaseModel):
    """The gRPC control plane of a live run (`atoll watch`, `pause`, `continue`, `stop`, `set`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Serve the control plane while the search runs.")
    host: str = Field("127.0.0.1", min_length=1, description="Address to bind. Anything but a loopback address "
                      f"needs a token: {TOKEN_ENV} or control.token_file.")
    port: int = Field(0, ge=0, le=65535, description="Port to bind; 0 picks a free one. One in use "
                      "(another run's, say) is refused before the run starts: runs never share a port.")
    token_file: str | None = Field(None, description="File holding the token every request must carry "
                                   f"(at least {MIN_TOKEN_CHARS} characters); overrides {TOKEN_ENV}.")


@dataclass(frozen=True)
class Setup:
    """What the driver serves with: its bind address and token (`own`: drawn here, kept in the run directory)."""

    host: str
    port: int
    token: str
    own: bool


def _user_error(message: str) -> Exception:
    # imported here: the config tree imports this module, and the CLI imports the config
    from controller.cli import UserError

    return UserError(message)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def prepare(config: ControlConfig) -> Setup | None:
    """The control plane's setup, checked before the run starts (None when disabled).

    Bad input (a token file that is missing, empty or short; a non-loopback host without a
    token) is one line. The token leaves the environment, so no process started later inherits it.
    """
    if not config.enabled:
        return None
    given = os.environ.pop(TOKEN_ENV, None)
    if config.token_file:
        given = read_token(Path(config.token_file), "control.token_file")
    elif given is not None:
        given = checked(given.strip(), TOKEN_ENV)
    if given is None and not is_loopback(config.host):
        raise _user_error(f"control.host={config.host} is not a loopback address, so the control plane needs a "
                        f"token: put one of at least {MIN_TOKEN_CHARS} characters in {TOKEN_ENV} or in a file "
                        "named by control.token_file (or keep control.host=127.0.0.1)")
    if config.port:
        check_bindable(config.host, config.port)
    return Setup(config.host, config.port, given or secrets.token_urlsafe(24), given is None)


def check_bindable(host: str, port: int) -> None:
    """One line, before the run exists, where control.host:control.port cannot be bound: in use (another run's
    control plane, say) or not an address of this machine. The server binds without SO_REUSEPORT, so a run
    never shares its port with another (`control_server.ControlPlane`)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: a closed run's port is free
            sock.bind(address)
    except OSError as exc:
        raise _user_error(f"control.port: cannot bind {address_of(host, port)} for the control plane "
                          f"({exc.strerror or exc}): give another control.port, or 0 for a free one") from None


def read_token(path: Path, what: str) -> str:
    try:
        text = path.expanduser().read_bytes().decode("ascii", errors="replace").strip()
    except OSError as exc:
        raise _user_error(f"{what}: cannot read {path}: {exc.strerror}") from None
    return checked(text, f"{what} {path}")


def checked(token: str, what: str) -> str:
    """The token, if every call can carry it: gRPC metadata holds printable ASCII only (a token of
    other characters, or random bytes, made a run nobody could steer)."""
    if len(token) < MIN_TOKEN_CHARS:
        raise _user_error(f"{what}: the token must have at least {MIN_TOKEN_CHARS} characters")
    if not (token.isascii() and token.isprintable()):
        raise _user_error(f"{what}: the token must be printable ASCII (letters, digits, punctuation), as gRPC "
                          "carries no other characters; make one with: openssl rand -hex 24")
    return token


def address_of(host: str, port: int) -> str:
    """HOST:PORT as gRPC reads it: an IPv6 address in brackets ("::1:5000" is no address to gRPC, so a
    run bound to control.host = "::1" could be steered by nobody)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def write_record(run_dir: Path, setup: Setup, port: int) -> None:
    """RUN_DIR/control.json, readable by the owner only (temp file and `os.replace`)."""
    record = {"address": address_of(setup.host, port), "pid": os.getpid(),
              "token": setup.token if setup.own else None,  # a user's own token is never written here
              "token_from": "this file" if setup.own else f"{TOKEN_ENV} or --token-file"}
    tmp = run_dir / f".{RECORD}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
    os.replace(tmp, run_dir / RECORD)


def remove_record(run_dir: Path) -> None:
    """Remove control.json if this process wrote it."""
    record = read_record(run_dir)
    if record is not None and record.get("pid") == os.getpid():
        (run_dir / RECORD).unlink(missing_ok=True)


def read_record(run_dir: Path) -> dict | None:
    """The live driver's record, or None (no file, an unreadable one, or one of a dead driver)."""
    try:
        record = json.loads((run_dir / RECORD).read_text())
        pid = int(record["pid"])
        str(record["address"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    from controller.rundir import alive  # here: rundir imports the CLI, whose config imports this module

    return record if alive(pid) else None


def client_address(address: str) -> str:
    """Where a client on this machine connects: a wildcard bind is reached on loopback."""
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "::", "[::]", "") else address
