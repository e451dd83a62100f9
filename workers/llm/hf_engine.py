"""The stand-in for vLLM where only torch and transformers are installed: batched generation
behind a small OpenAI-compatible HTTP server (POST /v1/chat/completions, GET /health).

Requests queue up; one generation thread takes up to `max_batch` of them at once,
left-pads their chat-templated prompts into one batch and generates them together,
so concurrent mutation calls share the GPU the way vLLM's batching shares it. Each
reply is cut at its own `max_tokens` and end-of-sequence token; usage counts are
real token counts. The tokenizer must carry a chat template.
"""
from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class _Job:
    messages: list
    max_tokens: int
    temperature: float
    seed: int | None
    done: Future = field(default_factory=Future)


class BatchedEngine:
    """A transformers causal LM generating queued chat requests in batches."""

    def __init__(self, model_path, max_batch: int = 16, max_model_len: int = 4096):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch, self.max_batch, self.max_model_len = torch, max_batch, max_model_len
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_path), padding_side="left")
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=dtype).to(self.device).eval()
        self.batches: list[int] = []  # sizes of the batches generated, for tests and benchmarks
        self._queue: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def submit(self, messages: list, max_tokens: int, temperature: float, seed: int | None = None) -> Future:
        job = _Job(messages, max_tokens, temperature, seed)
        self._queue.put(job)
        return job.done

    def close(self) -> None:
        self._closed.set()
        self._queue.put(None)

    def _loop(self) -> None:
        while not self._closed.is_set():
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            while len(jobs) < self.max_batch:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._closed.set()
                    break
                jobs.append(job)
            try:
                self._generate(jobs)
            except Exception as exc:  # noqa: BLE001  the error goes to each waiting request, the loop lives on
                for job in jobs:
                    if not job.done.done():
                        job.done.set_exception(exc)

    def _generate(self, jobs: list[_Job]) -> None:
        torch, tok = self.torch, self.tokenizer
        texts = [tok.apply_chat_template(j.messages, tokenize=False, add_generation_prompt=True) for j in jobs]
        enc = tok(texts, return_tensors="pt", padding=True, truncation=True,
                  max_length=self.max_model_len).to(self.device)
        longest = max(j.max_tokens for j in jobs)
        sample = any(j.temperature > 0 for j in jobs)
        if jobs[0].seed is not None:
            torch.manual_seed(jobs[0].seed)
        with torch.no_grad():
            out = self.model.generate(**enc, max_new_tokens=longest, do_sample=sample,
                                      temperature=max(jobs[0].temperature, 1e-5) if sample else None,
                                      pad_token_id=tok.pad_token_id)
        self.batches.append(len(jobs))
        prompt_len = enc["input_ids"].shape[1]
        for row, job in enumerate(jobs):
            new = out[row, prompt_len:prompt_len + job.max_tokens].tolist()
            if tok.eos_token_id in new:
                new = new[:new.index(tok.eos_token_id)]
            used = int(enc["attention_mask"][row].sum())
            job.done.set_result((tok.decode(new, skip_special_tokens=True), used, len(new)))


def serve(engine: BatchedEngine, port: int, model_name: str) -> ThreadingHTTPServer:
    """Start the HTTP front of `engine` on 127.0.0.1:`port` in a thread; returns the server."""
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # no per-request lines on stderr
            pass

        def do_GET(self):
            self._send(200, {"status": "ok"} if self.path == "/health" else {"error": "not found"})

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._send(404, {"error": {"message": "not found"}})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                done = engine.submit(body["messages"], int(body.get("max_tokens") or 256),
                                     float(body.get("temperature", 1.0) or 0.0), body.get("seed"))
                text, tokens_in, tokens_out = done.result()
            except (ValueError, KeyError, TypeError) as exc:
                return self._send(400, {"error": {"message": f"bad request: {exc}"}})
            except Exception as exc:  # noqa: BLE001  the engine failed: a 500 the client retries
                return self._send(500, {"error": {"message": f"generation failed: {exc}"}})
            self._send(200, _completion(model_name, text, tokens_in, tokens_out))

        def _send(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            head = (f"HTTP/1.1 {code} {'OK' if code == 200 else 'Error'}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
            self.wfile.write(head + data)  # one write: no small-packet delay on loopback

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.engine = engine
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _completion(model: str, text: str, tokens_in: int, tokens_out: int) -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "finish_reason": "stop",
                                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                      "total_tokens": tokens_in + tokens_out}}
