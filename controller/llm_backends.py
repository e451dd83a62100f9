"""Starting each LLM model's Ray actors: its server (local llama.cpp, vLLM or transformers) where
it has one, and its mutation worker, placed on the server's node because the server listens
on loopback only. A hosted or external endpoint needs only the worker."""
from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from workers.llm.client import api_key
from workers.llm.worker import LLMWorker

LLMWorkerActor = ray.remote(num_cpus=0, max_restarts=0)(LLMWorker)


def _server_actor(cfg):
    if cfg.backend == "local":
        from workers.llm.local_server import LlamaCppServer

        return ray.remote(num_cpus=0, max_restarts=0)(LlamaCppServer).remote(cfg)
    from workers.llm.vllm_server import VLLMServer

    return ray.remote(num_cpus=0, num_gpus=cfg.gpus, max_restarts=0)(VLLMServer).remote(cfg)


class Backend:
    """One model's actors; `worker` proposes children, `server` (or None) serves the model."""

    def __init__(self, cfg, max_reply_chars: int):
        self.cfg, self.max_reply_chars = cfg, max_reply_chars
        # read on the driver, so a missing key is one clear error; it travels only as an argument
        self._key = api_key(getattr(cfg, "api_key_env", None), getattr(cfg, "api_key_file", None))
        self.server, self.node, self.base_url = None, None, getattr(cfg, "base_url", None)
        self.note = ""  # what the user should know about how the model is served (said once by the run)
        if cfg.backend != "openai":
            self.server = _server_actor(cfg)
            self.node, self.base_url = ray.get(self.server.address.remote())
        if cfg.backend == "vllm":
            why = ray.get(self.server.status.remote())["why_engine"]
            self.note = f"atoll: model {cfg.name!r}: {why}" if why else ""
        self.worker = self.new_worker()

    def new_worker(self):
        """A (fresh) mutation worker: many calls at once, so a slow one never holds up another."""
        options = {"max_concurrency": self.cfg.max_in_flight + 1}
        if self.node is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self.node, soft=False)
        return LLMWorkerActor.options(**options).remote(self.cfg, self.base_url, self._key, self.max_reply_chars)

    def replace_worker(self) -> None:
        self.worker = self.new_worker()
