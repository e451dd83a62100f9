"""The local model for real: SmolLM2-135M served by llama.cpp on CPU (the `local-llm` extra).

One server for the module, tiny prompts and few tokens, so the default suite stays fast.
"""
import os
import socket
import time

import pytest
import xllamacpp  # noqa: F401  the test extra's (atoll[local-llm]): missing, the suite fails, it does not skip

from controller.config import load_config
from store.query import run_query
from tests.tiny import ROOT, llm_run
from workers.llm import local_server
from workers.llm.config import LocalModel
from workers.llm.local_server import LlamaCppServer, default_gguf, healthy, serves_here
from workers.llm.prompts import PromptInput
from workers.llm.worker import LLMJob, LLMWorker

PARENT = "import numpy as np\n\ndef policy(state, params):\n    return np.maximum(10 - state['on_hand'], 0)\n"


@pytest.fixture(scope="module")
def server():
    default_gguf()  # skips nothing: a missing model is a failure of the extra's install
    # a health check waits check_every_s: a server busy generating must not be taken for dead
    return LlamaCppServer(LocalModel(name="smollm2", max_tokens=24, temperature=0.0), check_every_s=2.0)


def test_the_real_model_answers_and_every_call_is_accounted(server):
    worker = LLMWorker(LocalModel(name="smollm2", max_tokens=24, temperature=0.0), server.root + "/v1")
    prompt = PromptInput("inventory", "Order stock.", "Define policy(state, params).", "policy", PARENT, None,
                         edit_format="rewrite", max_code_chars=400)
    outcome = worker.propose(LLMJob("run", 0, 1, "parent", "child", "smollm2", prompt, 7, ("d", "e")))
    (call,) = outcome.calls
    assert call.kind == "edit" and call.tokens_in > 20 and 0 < call.tokens_out <= 24 and call.latency_s > 0
    assert outcome.status in ("ok", "unparseable", "did_not_apply", "invalid_program")
    assert outcome.status != "ok" or "def policy" in outcome.code
    assert (outcome.status == "ok") == (outcome.reason == "")


def test_the_real_models_diagnosis_comes_first_and_reaches_its_edit_prompt(server):
    """diagnose = true against the real model: two accounted calls, the diagnosis' own reply in the
    edit call's prompt (the parts it was sent with) and in the outcome."""
    worker = LLMWorker(LocalModel(name="smollm2", max_tokens=24, temperature=0.0, diagnose=True),
                       server.root + "/v1")
    prompt = PromptInput("inventory", "Order stock.", "Define policy(state, params).", "policy", PARENT, None,
                         edit_format="rewrite", max_code_chars=400)
    outcome = worker.propose(LLMJob("run", 0, 1, "parent", "child", "smollm2", prompt, 7, ("d", "e")))
    diagnosis, edit = outcome.calls
    assert [diagnosis.kind, edit.kind] == ["diagnosis", "edit"] and [diagnosis.call_id, edit.call_id] == ["d", "e"]
    assert diagnosis.status == "ok" and diagnosis.tokens_in > 20 and 0 < diagnosis.tokens_out <= 24
    assert outcome.diagnosis == diagnosis.completion.strip() and outcome.diagnosis
    edit_prompt = "\n".join(text for _, text in edit.parts)
    assert "## Diagnosis of the current program\n" + outcome.diagnosis in edit_prompt, edit_prompt[-1500:]
    assert edit.tokens_in > diagnosis.tokens_out and edit.latency_s > 0


def test_the_watchdog_restarts_a_server_that_stopped(server):
    server.stop_server_for_test()  # the watchdog may bring it back before we can look: count restarts
    deadline = time.monotonic() + 60
    while not (server.restarts >= 1 and healthy(server.root)):
        assert time.monotonic() < deadline, "the server did not come back"
        time.sleep(0.1)


def test_a_restart_that_fails_is_tried_again_at_the_next_check():
    """Another program held the server's port while the watchdog restarted it: llama.cpp's RuntimeError
    ended the watchdog's thread, and the model stayed down for the rest of the run."""
    server = LlamaCppServer(LocalModel(name="smollm2", max_tokens=16, context=512, slots=1), check_every_s=0.3)
    tried, start = [], server._start

    def start_counted():  # the real start, counted once it returned or raised
        try:
            start()
        finally:
            tried.append(server._server is not None)
    server._start = start_counted
    held = socket.socket()
    try:
        with server._lock:  # the watchdog's restart waits for it, then finds the port taken
            server._server = None
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("127.0.0.1", server.port))
            held.listen()
        deadline = time.monotonic() + 60
        while not tried:
            assert time.monotonic() < deadline, "the watchdog never tried a restart"
            time.sleep(0.05)
        held.close()
        while not (healthy(server.root) and server.restarts == 1):
            assert time.monotonic() < deadline, "the server did not come back once its port was free"
            time.sleep(0.1)
        assert tried[0] is False and server.status()["restart_error"] == "", tried  # the first restart failed
    finally:
        held.close()
        server._stop.set()
        server._server = None


def test_the_server_binds_a_port_of_its_own_choosing(monkeypatch):
    """No port is chosen for it in advance (another program could take it first): a port held by
    another socket, were it chosen, changes nothing, and what listens on the server's port is this
    process (the server runs in it)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        monkeypatch.setattr(local_server, "free_port", lambda: held.getsockname()[1])
        server = LlamaCppServer(LocalModel(name="smollm2", max_tokens=16, context=512, slots=1), check_every_s=60)
        try:
            assert server.port != held.getsockname()[1] and healthy(server.root)
            assert serves_here(server.port, os.getsid(0))
        finally:
            server._stop.set()
            server._server = None


def test_the_shipped_local_config_is_valid():
    config, _ = load_config(ROOT / "configs/inventory_llm.toml")
    (model,) = config.mutator.llm.models
    assert model.backend == "local" and model.threads == 1
    assert config.mutator.llm.island_mix(0)["embedded"] == 0 and config.mutator.llm.island_mix(1)["embedded"] > 0


def test_a_tiny_run_with_the_local_model_mixed_with_the_embedded_mutator(tmp_path):
    out = llm_run(tmp_path, 'backend = "local"\nname = "smollm2"\nmax_tokens = 48\nmax_in_flight = 1\n'
                            'edit_format = "rewrite"', max_evals=4)
    assert out.returncode == 0, out.stderr
    assert "LLM calls by model" in out.stdout and "llm:smollm2" in out.stdout
    rows = run_query(tmp_path / "run", "SELECT count(*), min(tokens_in), min(tokens_out), "
                                       "count(*) FILTER (WHERE program_id IS NOT NULL) FROM llm_calls")[1]
    calls, tokens_in, tokens_out, with_child = rows[0]
    assert calls >= 1 and tokens_in > 50 and tokens_out > 0 and with_child >= 1
