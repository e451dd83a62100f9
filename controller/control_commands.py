"""`atoll watch`, `pause`, `continue`, `stop` and `set`: steering a live run through its control plane.

Each prints one line (the driver's answer) and exits 0; a run that is not live, a
refused token or a bad budget is one line on stderr and exit status 2.
"""
from __future__ import annotations

from pathlib import Path

from controller.cli import UserError


def _client(args):
    from controller import control
    from controller.control_client import ControlClient

    token_file = getattr(args, "token_file", None)
    token = control.read_token(Path(token_file), "--token-file") if token_file else None
    return ControlClient(args.run_dir, token)


def _command(args, method: str) -> int:
    from controller.control_server import pb

    request = {"Pause": pb.PauseRequest, "Resume": pb.ResumeRequest, "Stop": pb.StopRequest}[method]()
    with _client(args) as client:
        print(client.call(method, request).message)
    return 0


def cmd_pause(args) -> int:
    return _command(args, "Pause")


def cmd_continue(args) -> int:
    return _command(args, "Resume")


def cmd_stop(args) -> int:
    return _command(args, "Stop")


def cmd_set(args) -> int:
    pairs = []
    for item in args.assignments:
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise UserError(f"{item!r}: expected KEY=VALUE, e.g. run.max_evals=500")
        pairs.append((key.strip(), value.strip()))
    with _client(args) as client:
        for key, value in pairs:
            print(client.set_budget(key, value))
    return 0


def cmd_watch(args) -> int:
    from controller.read_commands import console
    from controller.watch import Watch

    with _client(args) as client:
        return Watch(client, console, args.every).run()
