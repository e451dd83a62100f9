"""The control plane's gRPC server, in the driver, beside its run loop.

The service is `controller/control.proto`; its Python classes are generated from it
when this module is imported (grpcio-tools' `grpc.protos_and_services`), so the
.proto is the only definition and no generated code can drift from it. Each call
is checked for the token first (metadata `x-atoll-token`, compared in constant
time; UNAUTHENTICATED otherwise), then handed to the run loop through `Steering`
(controller/steering.py): the server's threads never touch the search or the archive.
"""
from __future__ import annotations

import hmac
import json
import queue
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc

from controller import control
from controller.steering import Command, Ended, Refused, Steering

PROTO = "controller/control.proto"
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # protoc finds the .proto on sys.path; an editable install puts no entry there
    sys.path.append(_ROOT)
pb, rpc = grpc.protos_and_services(PROTO)
WORKERS = 16  # the server's threads; an event stream holds one for as long as its watcher follows
WATCHERS = 8  # event streams served at once, so the other threads always answer pause, stop, set and status


class _TokenCheck(grpc.ServerInterceptor):
    """Refuses every call that does not carry the run's token."""

    def __init__(self, token: str):
        self._token = token.encode()

    def intercept_service(self, continuation, details):
        given = dict(details.invocation_metadata or ()).get(control.TOKEN_HEADER, "")
        handler = continuation(details)
        if handler is None or hmac.compare_digest(str(given).encode(), self._token):
            return handler

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong or missing control token")

        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(deny)
        return grpc.unary_unary_rpc_method_handler(deny)


class ControlService(rpc.ControlServicer):
    """Each method asks the run loop and turns its answer into the service's messages."""

    def __init__(self, steering: Steering):
        self.steering = steering
        self._streams = threading.BoundedSemaphore(WATCHERS)

    def _ask(self, context, command: Command):
        try:
            return self.steering.ask(command)
        except Refused as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Ended as exc:  # not UNAVAILABLE: the client took that for a control plane out of its reach
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except TimeoutError:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "the run loop did not answer within 30 s")

    def Status(self, request, context):
        return status_reply(self._ask(context, Command("status")))

    def Pause(self, request, context):
        return pb.CommandReply(message=self._ask(context, Command("pause")))

    def Resume(self, request, context):
        return pb.CommandReply(message=self._ask(context, Command("resume")))

    def Stop(self, request, context):
        return pb.CommandReply(message=self._ask(context, Command("stop")))

    def SetBudget(self, request, context):
        return pb.CommandReply(message=self._ask(context, Command("set", request.key, request.value)))

    def Events(self, request, context):
        """The run's events; past WATCHERS streams at once, RESOURCE_EXHAUSTED (16 watchers, or clients that
        opened a stream and never read it, held every thread, and each pause or stop waited out its deadline)."""
        if not self._streams.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{WATCHERS} watchers already follow this run, the most it serves at once (so pause, "
                          "continue, stop and set are always answered); end one (Ctrl-C in its `atoll watch`) and "
                          "watch again")
        events = self.steering.subscribe()
        try:
            while context.is_active():
                try:
                    event = events.get(timeout=0.5)
                except queue.Empty:
                    continue
                if event is None:
                    return
                yield pb.Event(time=event.time, kind=event.kind, detail_json=json.dumps(event.detail, default=str))
        finally:
            self.steering.unsubscribe(events)
            self._streams.release()


def status_reply(s: dict):
    budgets = [pb.Budget(name=name, used=float(used),
                         **({} if limit is None else {"limit": float(limit), "left": float(limit) - float(used)}))
               for name, used, limit in s["budgets"]]
    return pb.StatusReply(
        run_id=s["run_id"], paused=s["paused"], evaluations=s["evaluations"], elapsed_s=s["elapsed_s"],
        evals_per_s=s["evals_per_s"], proposals_per_s=s["proposals_per_s"], in_flight=s["in_flight"],
        islands=[pb.IslandBest(island=i, **({} if b is None else {"score": b})) for i, b in enumerate(s["islands"])],
        failures=[pb.FailureKind(kind=k, count=n) for k, n in sorted(s["failures"].items())],
        protections=s["protections"], budgets=budgets, **({} if s["best"] is None else {"best": s["best"]}))


class ControlPlane:
    """Serves the control plane while the search runs; records its address in the run directory.

    `end(status)` tells the streams the search ended; leaving the block stops the server
    and removes RUN_DIR/control.json.
    """

    def __init__(self, setup: control.Setup | None, run_dir: Path, steering: Steering):
        self.setup, self.run_dir, self.steering = setup, Path(run_dir), steering
        self.server = None
        self.address = ""

    def __enter__(self) -> "ControlPlane":
        if self.setup is None:
            return self
        # no SO_REUSEPORT (gRPC sets it by default): two runs given one control.port both bound it, and the
        # kernel shared the connections between them, so `atoll stop A` stopped run B where they had one token
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="atoll-control"),
                                  interceptors=[_TokenCheck(self.setup.token)], maximum_concurrent_rpcs=64,
                                  options=[("grpc.so_reuseport", 0)])
        rpc.add_ControlServicer_to_server(ControlService(self.steering), self.server)
        port = self._bind()
        self.address = control.address_of(self.setup.host, port)
        self.server.start()
        control.write_record(self.run_dir, self.setup, port)
        return self

    def _bind(self) -> int:
        where = control.address_of(self.setup.host, self.setup.port)
        try:
            port = self.server.add_insecure_port(where)
        except RuntimeError:
            port = 0
        if not port:
            from controller.cli import UserError

            raise UserError(f"control.host/control.port: cannot bind {where} for the control "
                            "plane (in use, or not an address of this machine)")
        return port

    def end(self, status: str) -> None:
        self.steering.end(status)

    def __exit__(self, *exc) -> None:
        self.steering.end("error" if exc[0] is not None and not issubclass(exc[0], KeyboardInterrupt)
                          else "interrupted")
        if self.server is not None:
            control.remove_record(self.run_dir)
            self.server.stop(grace=2).wait()
