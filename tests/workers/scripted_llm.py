"""A real HTTP server on loopback that speaks chat completions and replays scripted behaviour.

The double for LLM error cases only (the real model is tested elsewhere). Each request
takes the next step of the script (cycling when `cycle`): a reply text, or a callable
that builds one from the request's prompt, an HTTP status, a hang, or a slow reply.
Every answer goes out in one write, so loopback adds no small-packet delay.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Step:
    kind: str  # "reply", "status", "hang", "stall", "slow", "no_usage", "strict", "raw", "trickle"
    value: object = None  # reply text or callable(prompt) -> text; HTTP status; seconds
    delay: float = 0.0
    finish: str = "stop"  # the choice's finish_reason ("length": cut off at max_tokens)
    reasoning: str | None = None  # sent apart as `reasoning_content`, as vLLM's reasoning parsers do


def reply(text) -> Step:
    return Step("reply", text)


def cut(text) -> Step:
    """A reply that stopped at max_tokens."""
    return Step("reply", text, finish="length")


def reasoned(reasoning: str, text, finish: str = "stop") -> Step:
    """A reasoning model's reply as a server with a reasoning parser sends it: the thinking apart."""
    return Step("reply", text, finish=finish, reasoning=reasoning)


def strict(text) -> Step:
    """A reply only to a request as OpenAI's reasoning models take it: `max_completion_tokens`, not
    `max_tokens`, and no temperature but the default (each refused with their HTTP 400 otherwise)."""
    return Step("strict", text)


def status(code: int) -> Step:
    return Step("status", code)


def echo_key() -> Step:
    """A 401 whose message quotes in full the key the request carried (a proxy that does not mask it)."""
    return Step("echo_key")


def hang(seconds: float) -> Step:
    return Step("hang", seconds)


def stall(seconds: float) -> Step:
    """Hang this request and every repeat of it (a retry sends the same body): the call it belongs
    to times out on every attempt, whatever other calls take the script's steps meanwhile."""
    return Step("stall", seconds)


def slow(seconds: float, text) -> Step:
    return Step("slow", text, seconds)


def raw(payload) -> Step:
    """A 200 answer with this JSON body (or these bytes) as it is: what a server that is not quite
    OpenAI's, or a proxy in front of one, sends."""
    return Step("raw", payload)


def trickle(seconds: float, text) -> Step:
    """A reply whose body comes a byte each `seconds` after its headers: each read is quick, the whole never."""
    return Step("trickle", text, seconds)


def parent_code(prompt: str) -> str:
    """The current program shown in a prompt."""
    found = re.search(r"## Current program\n```python\n(.*?)```", prompt, re.S)
    return found.group(1) if found else ""


class ScriptedLLM:
    """Serve `script` on 127.0.0.1; `requests` keeps every request body received."""

    def __init__(self, script: list[Step], cycle: bool = False):
        self.script, self.cycle, self.requests, self.count = list(script), cycle, [], 0
        self._lock = threading.Lock()
        self._stalled: dict[str, float] = {}  # request bodies that hang whenever they come again
        self._stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send(200, {"status": "ok"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                step = outer._next(body)
                prompt = "".join(m["content"] for m in body["messages"])
                if step.kind == "strict" and ("max_tokens" in body or body.get("temperature", 1) != 1):
                    message = ("Unsupported parameter: 'max_tokens' is not supported with this model. Use "
                               "'max_completion_tokens' instead." if "max_tokens" in body else
                               f"Unsupported value: 'temperature' does not support {body['temperature']} with this "
                               "model. Only the default (1) value is supported.")
                    with outer._lock:  # the step is not used up: the next request takes it again
                        outer.count -= 1
                    return self._send(400, {"error": {"message": message, "type": "invalid_request_error"}})
                if step.kind == "raw":
                    return self._send(200, step.value)
                if step.kind == "status":
                    return self._send(step.value, {"error": {"message": f"scripted {step.value}"}},
                                      {"retry-after-ms": "5"})
                if step.kind == "echo_key":
                    key = self.headers.get("Authorization", "").removeprefix("Bearer ")
                    return self._send(401, {"error": {"message": f"Incorrect API key provided: {key}."}})
                if step.kind == "hang":
                    outer._stop.wait(step.value)
                    return self.close_connection
                if step.kind == "slow":
                    outer._stop.wait(step.delay)
                text = step.value(prompt) if callable(step.value) else step.value
                message = {"role": "assistant", "content": text or None}
                if step.reasoning is not None:
                    message["reasoning_content"] = step.reasoning
                payload = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": step.finish, "message": message}]}
                if step.kind != "no_usage":
                    payload["usage"] = {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4,
                                        "total_tokens": len(prompt) // 4 + len(text) // 4}
                self._send(200, payload, delay=step.delay if step.kind == "trickle" else 0.0)

            def _send(self, code, payload, headers=None, delay=0.0):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
                head = (f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                        f"{extra}\r\n").encode()
                try:
                    if not delay:
                        return self.wfile.write(head + data)
                    self.wfile.write(head)
                    for i in range(len(data)):
                        if outer._stop.wait(delay):
                            return
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                except OSError:
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _next(self, body) -> Step:
        key = json.dumps(body, sort_keys=True)
        with self._lock:
            self.requests.append(body)
            if key in self._stalled:
                return Step("hang", self._stalled[key])
            index = self.count
            self.count += 1
        if index >= len(self.script) and not self.cycle:
            return Step("status", 503)
        step = self.script[index % len(self.script)]
        if step.kind == "stall":
            with self._lock:
                self._stalled[key] = step.value
            return Step("hang", step.value)
        return step

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
