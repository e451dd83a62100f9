"""One chat-completions call to an OpenAI-compatible endpoint, as data.

The client is urllib3's pooled connections and its `Retry`: a per-attempt timeout,
and 408, 409, 429 and 5xx answers, timeouts and dropped connections retried with
exponential backoff and jitter (honouring Retry-After). It costs a fraction of a
millisecond a call where a full SDK costs several, which matters when a fast
endpoint answers hundreds of calls a second. Whatever happens, `chat` returns a
`ChatResult` whose status is 'ok', 'timeout' or 'http_error'; it never raises for
the endpoint's behaviour. The API key is read here and goes nowhere but the request
header: it is not logged, returned or stored.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

import urllib3
from urllib3.exceptions import (HTTPError, MaxRetryError, NewConnectionError, ProtocolError,
                                TimeoutError as Urllib3Timeout)

OK, TIMEOUT, HTTP_ERROR = "ok", "timeout", "http_error"


@dataclass(frozen=True)
class ChatResult:
    """The outcome of one call, retries included."""

    status: str
    text: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    attempts: int = 1
    error: str = ""
    estimated_tokens: bool = False  # the server sent no usage: counted as characters / 4
    cut: bool = False  # the reply stopped at max_tokens (finish_reason "length")
    reasoning: str = ""  # reasoning the server sent apart from the answer (vLLM's reasoning parsers)
    adapted: tuple[str, ...] = ()  # what this call changed for good in what the client sends (`ChatClient._adapted`)

    @property
    def reasoning_chars(self) -> int:
        return len(self.reasoning)


def api_key(env: str | None, file: Path | None) -> str:
    """The key from the named environment variable or file; a placeholder for keyless servers."""
    if env:
        key = os.environ.get(env, "")
        if not key:
            raise ValueError(f"the API key variable {env} is not set")
        return key
    if file:
        try:
            return Path(file).expanduser().read_text().strip().splitlines()[0]
        except (OSError, IndexError):
            raise ValueError(f"cannot read an API key from {file}") from None
    return "no-key"


RETRIED = frozenset({408, 409, 429, *range(500, 600)})  # statuses worth another attempt


class ChatClient:
    """A pooled, thread-safe client for one model at one endpoint."""

    def __init__(self, base_url: str, model: str, key: str, timeout_s: float, max_retries: int,
                 max_tokens: int, temperature: float, extra_body: dict | None = None):
        self.model, self.max_tokens, self.temperature = model, max_tokens, temperature
        self.extra_body = dict(extra_body or {})  # the model's `extra_body`: more request fields, as given
        # what the endpoint refused once and is then sent without (see `_adapted`)
        self.limit_field, self.send_temperature = "max_tokens", True
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        self._key = key if len(key) >= 8 else ""  # blanked out of what the endpoint sends back (`_failed`)
        self._max_retries, self._timeout_s = max_retries, timeout_s
        retry = urllib3.Retry(total=max_retries, allowed_methods=None, status_forcelist=RETRIED,
                              backoff_factor=0.5, backoff_max=8.0, backoff_jitter=0.25,
                              respect_retry_after_header=True, raise_on_status=False, raise_on_redirect=False)
        self._pool = urllib3.PoolManager(maxsize=64, retries=retry, timeout=urllib3.Timeout(total=timeout_s))

    def chat(self, messages: list[dict], seed: int | None = None) -> ChatResult:
        start, refused, changed = time.monotonic(), 0, []
        while True:
            body = {**self.extra_body, "model": self.model, "messages": list(messages),
                    self.limit_field: self.max_tokens}
            if self.send_temperature:
                body["temperature"] = self.temperature
            if seed is not None:
                body["seed"] = seed
            result = self._call(body, messages, start)
            change = self._adapted(result)
            if not change:
                return replace(result, attempts=result.attempts + refused, adapted=tuple(changed)) if refused else result
            refused += result.attempts
            changed.append(change)

    def _adapted(self, result: ChatResult) -> str:
        """What the client changed for good after the endpoint refused a field that some models do not
        take ('' for nothing): OpenAI's reasoning models take `max_completion_tokens`, not
        `max_tokens`, and only their default temperature. Each is changed once; anything else stands."""
        refused = result.error.lower() if result.status == HTTP_ERROR and result.error.startswith("HTTP 400") else ""
        if "max_completion_tokens" in refused and self.limit_field == "max_tokens":
            self.limit_field = "max_completion_tokens"
            return "sends max_completion_tokens instead of max_tokens"
        if "temperature" in refused and "support" in refused and self.send_temperature:
            self.send_temperature = False
            return "sends no temperature (the endpoint's default)"
        return ""

    def _call(self, body: dict, messages: list[dict], start: float) -> ChatResult:
        attempts = 1
        try:
            response = self._pool.request("POST", self.url, body=json.dumps(body).encode(), headers=self._headers,
                                          preload_content=False)
            attempts = len(response.retries.history) + 1 if response.retries else 1
            data = _read(response, self._timeout_s)
        except _Unread as exc:
            return self._failed(exc.status, str(exc), start, attempts=attempts)
        except MaxRetryError as exc:
            if isinstance(exc.reason, NewConnectionError):  # refused, unreachable, no such host (urllib3
                # makes it a kind of connect timeout, but nothing there is slow: nothing is there)
                detail = str(exc.reason).split(": ", 1)[-1][:200]
                return self._failed(HTTP_ERROR, f"cannot connect to {self.url} ({detail})", start)
            if isinstance(exc.reason, Urllib3Timeout):
                return self._failed(TIMEOUT, "the endpoint did not answer in time", start)
            return self._failed(HTTP_ERROR, f"{type(exc.reason).__name__}: {str(exc.reason)[:300]}", start)
        except Urllib3Timeout:
            return self._failed(TIMEOUT, "the endpoint did not answer in time", start, retried=False)
        except (HTTPError, ProtocolError, OSError) as exc:
            return self._failed(HTTP_ERROR, f"{type(exc).__name__}: {str(exc)[:300]}", start, retried=False)
        if response.status >= 300:
            return self._failed(HTTP_ERROR, f"HTTP {response.status}: {_message(data)}", start, attempts=attempts)
        try:
            reply = json.loads(data)
            if not isinstance(reply, dict) or not reply.get("choices"):  # e.g. a proxy's error sent with a 200
                return self._failed(HTTP_ERROR, f"HTTP 200 with no completion: {_message(data)}", start,
                                    attempts=attempts)
            return self._result(reply, attempts, time.monotonic() - start, messages)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:  # a malformed answer
            return self._failed(HTTP_ERROR, f"malformed answer ({type(exc).__name__}: {str(exc)[:200]})", start,
                                attempts=attempts)

    def _failed(self, status: str, error: str, start: float, retried: bool = True, attempts: int = 0) -> ChatResult:
        """A call that got no reply. The error may quote the endpoint, and one that quotes the key it was sent
        (a proxy that does not mask it) has it blanked: errors go to llm_calls.error and to stderr."""
        attempts = attempts or (self._max_retries + 1 if retried else 1)
        if self._key:
            error = error.replace(self._key, "(the API key)")
        return ChatResult(status, latency_s=time.monotonic() - start, attempts=attempts, error=error)

    @staticmethod
    def _result(reply: dict, attempts: int, latency: float, messages) -> ChatResult:
        choices = reply["choices"]
        message = choices[0].get("message")
        text = (message.get("content") or "") if message else ""
        if isinstance(text, list):  # content parts, as some servers send them: their text, in order
            text = "".join(part.get("text") or "" for part in text
                           if isinstance(part, dict) and part.get("type") in ("text", "output_text"))
        if not isinstance(text, str):
            raise TypeError(f"the reply's content is {type(text).__name__}, not text")
        # a server that parses a reasoning model's thinking sends it apart (`reasoning_content`, or
        # `reasoning`): kept beside the answer (llm_calls.reasoning), never parsed for an edit
        reasoning = (message.get("reasoning_content") or message.get("reasoning")) if message else None
        text, reasoning = _encodable(text), _encodable(reasoning if isinstance(reasoning, str) else "")
        extra = {"cut": choices[0].get("finish_reason") == "length", "reasoning": reasoning}
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        tokens_in, tokens_out = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens") or 0)
        if tokens_in is not None and tokens_out is not None:
            return ChatResult(OK, text, tokens_in, tokens_out, latency, attempts, **extra)
        prompt_chars = sum(len(m.get("content", "")) for m in messages)
        return ChatResult(OK, text, prompt_chars // 4, (len(text) + len(reasoning)) // 4, latency, attempts,
                          estimated_tokens=True, **extra)

    def close(self) -> None:
        self._pool.clear()


MAX_ANSWER_BYTES = 16 * 2 ** 20  # far above any real reply (a token is a few bytes, 6 for an escaped character)


class _Unread(Exception):
    """An answer given up while it came: too long, or too slow; `status` is the call's."""

    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status


def _read(response, timeout_s: float) -> bytes:
    """The answer's body as it comes, at most MAX_ANSWER_BYTES and for at most `timeout_s`: the socket's
    timeout bounds each read alone, so a server that trickled its answer held the call without end,
    and a body of any size was read whole into memory."""
    deadline, chunks, size = time.monotonic() + timeout_s, [], 0
    try:
        while chunk := response.read1(65536):
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise _Unread(HTTP_ERROR, f"the answer ran past {MAX_ANSWER_BYTES // 2 ** 20} MiB; not read further")
            if time.monotonic() > deadline:
                raise _Unread(TIMEOUT, f"the endpoint did not finish its answer in time ({size} bytes in {timeout_s:g} s)")
            chunks.append(chunk)
    except _Unread:
        response.close()  # the rest is never read: the connection is not used again
        raise
    finally:
        response.release_conn()
    return b"".join(chunks)


MAX_COUNTED = 10 ** 9  # tokens no call reaches; two such counts still add up inside llm_calls' 32-bit columns


def _count(value) -> int | None:
    """A usage token count, or None when it is none a call can have (absent, not a number, negative,
    not finite, beyond MAX_COUNTED): such usage is estimated, as if the server had sent none, for a
    count taken as it is would give a budget back, or fail the driver's commit of the call's row."""
    try:
        n = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return int(n) if 0 <= n <= MAX_COUNTED else None  # NaN fails both comparisons


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _encodable(text: str) -> str:
    """`text` with each lone surrogate (JSON's `\\ud83d` with no pair: half an emoji, cut at max_tokens
    or split between tokens) as U+FFFD: such a string has no UTF-8, so storing the call failed the
    driver's commit and ended the run with a traceback."""
    return _SURROGATE.sub("\ufffd", text)


def _message(data: bytes) -> str:
    """The error message an endpoint sent (its JSON `error.message`, else the body's start)."""
    try:
        error = json.loads(data).get("error")
        text = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        text = None
    return _encodable(str(text if text else data[:300].decode(errors="replace"))[:300])
