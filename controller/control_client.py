"""The CLI's client of a live run's control plane.

It finds the driver through RUN_DIR/control.json (its address, and the token the
driver drew for a loopback run); a run bound elsewhere takes the user's token from
ATOLL_CONTROL_TOKEN or `--token-file`. Every failure is one line: the run is not live,
its control plane cannot be reached from here though it is live, the token was refused, a
bad budget key or value.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import grpc

from controller import control
from controller.cli import UserError
from controller.control_server import pb, rpc

TIMEOUT_S = 40.0  # the driver answers at its loop's tick, and waits up to 30 s for it
CONNECT_S = 10.0  # a connection neither made nor refused by then is dropped on the way (a firewall, say)


class NotLive(UserError):
    """No driver answers for the run: it ended, or was never started."""


def not_live(run_dir: Path, why: str = "") -> UserError:
    return NotLive(f"{run_dir}: the run is not live (no driver is running it now{', ' + why if why else ''}); "
                     f"`atoll status {run_dir}` shows where it stands")


def no_control_plane(run_dir: Path) -> UserError:
    """The line for a run with no live control.json: not live, unless a process holds its archive (its
    driver before its search began or while it writes the held-out report, a run started with
    control.enabled = false, or `atoll report`), which was said to be "no driver is running it now"."""
    from controller.rundir import driver_holds

    if not driver_holds(run_dir):
        return not_live(run_dir)
    return NotLive(f"{run_dir}: a process holds the run's archive (its driver, or `atoll report`) but serves no "
                   "control plane now: the search has not begun yet, or it has ended and the held-out report is "
                   "being written, or the run was started with control.enabled = false. Ctrl-C in the driver's "
                   f"terminal stops it with everything finished kept; `atoll status {run_dir}` shows where it stands")


def not_readable(run_dir: Path) -> UserError | None:
    """The line for a live run whose control.json (mode 0600) this user may not read: another user's
    run was said to be "not live" while it ran. None where the record is readable, or the run not live."""
    from controller.rundir import driver_holds
    from store.readonly import owner_of

    try:
        (run_dir / control.RECORD).read_bytes()
    except PermissionError:
        if driver_holds(run_dir):
            owner = owner_of(run_dir / control.RECORD)
            return UserError(f"{run_dir}: the run is live, but its {control.RECORD} (the control plane's address "
                             "and token) is readable by the user who started it only, so only they can steer or "
                             f"watch it{f' (run this as {owner})' if owner else ''}")
    except OSError:
        pass
    return None


class Unreachable(UserError):
    """The run is live (its driver holds the archive), but its control plane does not answer from here."""


def unreachable(run_dir: Path, why: str) -> UserError:
    """The line for a call that could not connect: the run is live by `atoll status`'s
    test (its driver, named in control.json, holds the archive), or else it is not live."""
    from controller.rundir import driver_holds

    record = control.read_record(run_dir)
    if record is None or not driver_holds(run_dir):
        return not_live(run_dir, why)
    pid = record["pid"]
    return Unreachable(
        f"{run_dir}: the run is live (driver pid {pid}), but its control plane at {record['address']} cannot be "
        f"reached from here ({why}): this shell is likely in another network namespace or on another host than the "
        "run (a run started under `unshare -n`, say), or a firewall is in the way. `atoll status` and `atoll query` "
        f"still work; to steer it, run this command in the run's network namespace (as root: nsenter -n -t {pid} "
        "atoll ...)")


class ControlClient:
    """Calls on one live run's control plane; `token` overrides the run directory's and the environment's."""

    def __init__(self, run_dir: str | Path, token: str | None = None):
        self.run_dir = Path(run_dir)
        if not (self.run_dir / "archive.duckdb").is_file():
            raise UserError(f"{self.run_dir} is not a run directory (no archive.duckdb in it)")
        record = control.read_record(self.run_dir)
        if record is None:
            raise not_readable(self.run_dir) or no_control_plane(self.run_dir)
        token = token or record.get("token")
        if not token and os.environ.get(control.TOKEN_ENV):
            token = control.checked(os.environ[control.TOKEN_ENV].strip(), control.TOKEN_ENV)
        if not token:
            raise UserError(f"{self.run_dir}: this run's control plane needs its token: set {control.TOKEN_ENV} "
                            "or give --token-file")
        self.metadata = ((control.TOKEN_HEADER, token),)
        self.channel = grpc.insecure_channel(control.client_address(record["address"]))
        self.stub = rpc.ControlStub(self.channel)
        if not self._settled(CONNECT_S):
            self.close()
            raise unreachable(self.run_dir, f"no answer to a connection within {CONNECT_S:g} s")

    def _settled(self, timeout: float) -> bool:
        """Whether connecting ends within `timeout`, made or refused (a refusal is then the first
        call's UNAVAILABLE); False when it hangs, as where a firewall drops the packets."""
        settled = threading.Event()

        def watch(state):
            if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                         grpc.ChannelConnectivity.SHUTDOWN):
                settled.set()

        self.channel.subscribe(watch, try_to_connect=True)
        try:
            return settled.wait(timeout)
        finally:
            self.channel.unsubscribe(watch)

    def call(self, method: str, request):
        try:
            return getattr(self.stub, method)(request, metadata=self.metadata, timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            raise self.explained(exc) from None

    def status(self):
        return self.call("Status", pb.StatusRequest())

    def set_budget(self, key: str, value: str) -> str:
        return self.call("SetBudget", pb.SetBudgetRequest(key=key, value=value)).message

    def events(self):
        """The run's events from now on; ends when the search ends (or the driver goes away)."""
        stream = self.stub.Events(pb.EventsRequest(), metadata=self.metadata)
        try:
            yield from stream
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise self.explained(exc) from None
        finally:
            stream.cancel()

    def explained(self, exc: grpc.RpcError) -> UserError:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE:
            return unreachable(self.run_dir, details.splitlines()[0][:200] if details else "")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return UserError(f"{self.run_dir}: the control plane refused the token ({details}); use the run's own "
                             f"token ({control.TOKEN_ENV} or --token-file)")
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return UserError(details)
        if code == grpc.StatusCode.FAILED_PRECONDITION:  # the search ended while the driver still serves
            return NotLive(f"{self.run_dir}: {details}: its driver is finishing and takes no more commands; "
                           f"`atoll status {self.run_dir}` shows where it stands")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return UserError(f"{self.run_dir}: {details}")
        return UserError(f"{self.run_dir}: the control plane answered {code.name}: {details}")

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "ControlClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
