"""One chat-completions call to an OpenAI-compatible endpoint, as data.

The `openai` client pools connections, enforces a per-attempt timeout and retries
429s, 5xx answers, timeouts and dropped connections with exponential backoff and
jitter (honouring Retry-After). Whatever happens, `chat` returns a `ChatResult`
whose status is 'ok', 'timeout' or 'http_error'; it never raises for the
endpoint's behaviour. The API key is read here and goes nowhere but the request
header: it is not logged, returned or stored.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import openai

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


class ChatClient:
    """A pooled, thread-safe client for one model at one endpoint."""

    def __init__(self, base_url: str, model: str, key: str, timeout_s: float, max_retries: int,
                 max_tokens: int, temperature: float):
        self.model, self.max_tokens, self.temperature = model, max_tokens, temperature
        self._client = openai.OpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=max_retries)
        self._max_retries = max_retries

    def chat(self, messages: list[dict], seed: int | None = None) -> ChatResult:
        start = time.monotonic()
        try:
            raw = self._client.chat.completions.with_raw_response.create(
                model=self.model, messages=list(messages), max_tokens=self.max_tokens,
                temperature=self.temperature, seed=seed)
            reply = raw.parse()
        except openai.APITimeoutError:
            return self._failed(TIMEOUT, "the endpoint did not answer in time", start)
        except openai.APIStatusError as exc:
            retried = exc.status_code in (408, 409, 429) or exc.status_code >= 500
            return self._failed(HTTP_ERROR, f"HTTP {exc.status_code}: {str(exc.message)[:300]}", start, retried)
        except (openai.APIError, ValueError) as exc:  # a dropped connection, a malformed answer
            return self._failed(HTTP_ERROR, f"{type(exc).__name__}: {str(exc)[:300]}", start)
        return self._result(reply, raw.retries_taken + 1, time.monotonic() - start, messages)

    def _failed(self, status: str, error: str, start: float, retried: bool = True) -> ChatResult:
        attempts = self._max_retries + 1 if retried else 1
        return ChatResult(status, latency_s=time.monotonic() - start, attempts=attempts, error=error)

    @staticmethod
    def _result(reply, attempts: int, latency: float, messages) -> ChatResult:
        choices = getattr(reply, "choices", None) or []
        text = (choices[0].message.content or "") if choices and choices[0].message else ""
        usage = getattr(reply, "usage", None)
        if usage is not None and usage.prompt_tokens is not None:
            return ChatResult(OK, text, int(usage.prompt_tokens), int(usage.completion_tokens or 0), latency, attempts)
        prompt_chars = sum(len(m.get("content", "")) for m in messages)
        return ChatResult(OK, text, prompt_chars // 4, len(text) // 4, latency, attempts, estimated_tokens=True)

    def close(self) -> None:
        self._client.close()
