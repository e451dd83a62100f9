"""A model from a local path served on a GPU actor: vLLM's OpenAI server as a managed process,
or, where vLLM is not installed, the batched transformers engine behind the same interface.

vLLM pins its own torch, so it runs from its own interpreter (`python` in the model's
config, e.g. a venv's) as `python -m vllm.entrypoints.openai.api_server` on loopback;
`pip install .` of Atoll never installs it. A watchdog restarts the process when it
exits or stops answering /health. `controller.llm_backends` makes this class a Ray
actor with `num_gpus` and places the model's mutation worker on the same node.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from workers.llm.local_server import free_port, healthy, serves_here, wait_healthy


def vllm_missing(python: str) -> str | None:
    """Why `python` cannot import vllm, in one line; None when it can."""
    try:
        proc = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True, timeout=300,
                              check=False)
    except subprocess.TimeoutExpired:
        return f"{python} took over 300 s to import vllm"
    except OSError as exc:
        return f"{python}: {exc.strerror or exc}"
    if proc.returncode == 0:
        return None
    last = next((line.strip() for line in reversed(proc.stderr.splitlines()) if line.strip()), "")
    return f"{python} cannot import vllm: {last[:200] or f'exit status {proc.returncode}'}"


def choose_engine(config, python: str) -> tuple[str, str]:
    """(engine, why): 'auto' is vLLM when `python` imports it. A `python` the user named that cannot
    is an error (they meant vLLM); this interpreter without vLLM is the transformers engine, and
    `why` says so, for the run to tell the user."""
    if config.engine != "auto":
        return config.engine, ""
    missing = vllm_missing(python)
    if missing is None:
        return "vllm", ""
    if config.python is not None:
        raise RuntimeError(f"{missing}; fix the model's `python` (the interpreter of vLLM's environment on the GPU "
                           "node), or set engine = \"transformers\"")
    return "transformers", (f"engine 'auto' serves with the transformers engine, not vLLM ({missing}); set `python` "
                            "to the interpreter of vLLM's environment")


def vllm_command(config, python: str, port: int) -> list[str]:
    """The vLLM server's command line for `config` (a VLLMModel)."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(config.model_path),
           "--served-model-name", config.name, "--host", "127.0.0.1", "--port", str(port),
           "--tensor-parallel-size", str(config.tensor_parallel), "--max-model-len", str(config.max_model_len),
           "--gpu-memory-utilization", str(config.gpu_memory_utilization),
           "--enable-prefix-caching" if config.prefix_caching else "--no-enable-prefix-caching"]
    return cmd + list(config.extra_args)


class PortTaken(Exception):
    """The chosen port answered /health, but from a process that is not the server's."""


class VLLMServer:
    """Serves one model; `engine` says which engine does ('vllm' or 'transformers')."""

    def __init__(self, config, check_every_s: float = 10.0):
        self.config, self.restarts = config, 0
        self.python = str(config.python or sys.executable)
        self.engine, self.why_engine = choose_engine(config, self.python)
        self.port = free_port() if self.engine == "vllm" else 0  # 0: the engine's own server binds any
        self._proc, self._http, self._lock = None, None, threading.Lock()
        # vLLM's own output, for when it fails; kept after shutdown only if the server ever had to be
        # restarted (the engine stand-in runs in this process and writes none)
        self.log = Path(tempfile.mkdtemp(prefix="atoll-vllm-")) / "server.log" if self.engine == "vllm" else None
        for tries_left in reversed(range(3)):
            try:
                self._start()
                break
            except PortTaken:
                self._halt()
                if not tries_left:
                    raise RuntimeError(f"another program answered on each of 3 free ports chosen for vLLM; "
                                       f"its log: {self.log}") from None
                self.port = free_port()
            except BaseException:
                self._halt()
                raise
        self._stop = threading.Event()
        threading.Thread(target=self._watch, args=(check_every_s,), daemon=True).start()

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        if self.engine == "vllm":
            env = {**os.environ, "HF_HUB_OFFLINE": "1", **self.config.env}
            with open(self.log, "ab") as log:
                self._proc = subprocess.Popen(vllm_command(self.config, self.python, self.port), env=env,
                                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                wait_healthy(self.root, self.config.startup_timeout_s, alive=lambda: self._proc.poll() is None)
            except RuntimeError as exc:
                exited = self._proc.poll()
                how = f"exited with status {exited}" if exited is not None else "is still not answering"
                tail = _tail(self.log)  # the reason is usually its last line; the error's last line says it
                last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "")
                raise RuntimeError(f"{tail}\n{exc}: vLLM {how}, its log ending {last[:200]!r} "
                                   f"(the whole log: {self.log})") from None
            if not serves_here(self.port, self._proc.pid):
                raise PortTaken(self.port)  # what answered was some other program that took the port first
        else:
            from workers.llm.hf_engine import BatchedEngine, serve

            engine = BatchedEngine(self.config.model_path, self.config.max_batch, self.config.max_model_len)
            # its own bind takes any free port at the first start (no window for another program to
            # take it first); a restart binds the same one again, since the worker holds the URL
            self._http = serve(engine, self.port, self.config.name)
            self.port = self._http.server_address[1]
            wait_healthy(self.root, self.config.startup_timeout_s)

    def _halt(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http.engine.close()
        self._proc = self._http = None

    def restart(self) -> int:
        with self._lock:
            self._halt()
            self._start()
            self.restarts += 1
            return self.restarts

    def _watch(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            dead = self._proc is not None and self._proc.poll() is not None
            if dead or not healthy(self.root, timeout=every_s):
                self.restart()

    def address(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), f"{self.root}/v1"

    def status(self) -> dict:
        return {"engine": self.engine, "why_engine": self.why_engine, "healthy": healthy(self.root),
                "restarts": self.restarts, "log": str(self.log or "")}

    def shutdown(self) -> None:
        self._stop.set()
        with self._lock:
            self._halt()
        if self.log is not None and self.restarts == 0:
            shutil.rmtree(self.log.parent, ignore_errors=True)

    def kill_for_test(self) -> None:
        """Kill the server process (or stop the engine's HTTP server) behind the watchdog's back."""
        if self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGKILL)
        elif self._http is not None:
            self._http.shutdown()
            self._http.server_close()


def _tail(log: Path, lines: int = 20) -> str:
    """The last lines of vLLM's log (its reason for failing to start is usually there)."""
    try:
        text = log.read_bytes()[-8192:].decode(errors="replace")
    except OSError:
        return "  (no log)"
    return "\n".join("  " + line for line in text.splitlines()[-lines:]) or "  (empty)"
