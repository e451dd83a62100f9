"""The GPU model server's interface on CPU: the batched transformers engine (the stand-in where
vLLM is not installed) with a tiny random model, and vLLM's command line. The real vLLM server
is the opt-in test in test_vllm_cpu.py."""
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch  # noqa: F401  torch and transformers are the test extra's: missing, the suite fails, it does not skip
import transformers  # noqa: F401

from store.query import run_query
from tests.tiny import llm_run
from tests.workers.tiny_model import save_tiny_model
from workers.llm.config import VLLMModel
from workers.llm.local_server import healthy
from workers.llm.prompts import PromptInput
from workers.llm.vllm_server import VLLMServer, vllm_command, vllm_missing
from workers.llm.worker import LLMJob, LLMWorker

PARENT = "def policy(state, params):\n    return 1\n"


@pytest.fixture(scope="module")
def engine_server(tmp_path_factory):
    folder = save_tiny_model(tmp_path_factory.mktemp("tiny-model"))
    cfg = VLLMModel(name="tiny", model_path=folder, engine="transformers", gpus=0, max_batch=8, max_tokens=16,
                    max_in_flight=6, startup_timeout_s=120)
    server = VLLMServer(cfg, check_every_s=2.0)  # its health check waits this long: 0.5 s could restart a busy engine
    yield server, cfg
    server.shutdown()


def test_concurrent_requests_are_generated_in_batches_with_real_token_counts(engine_server):
    server, cfg = engine_server
    assert server.engine == "transformers" and server.log is None  # no vLLM log folder left in /tmp
    worker = LLMWorker(cfg, server.root + "/v1")
    prompt = PromptInput("toy", "A toy.", "Define policy(state, params).", "policy", PARENT, None)
    jobs = [LLMJob("r", 0, 1, "p", f"c{i}", "tiny", prompt, i, ("d", "e")) for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(worker.propose, jobs))
    calls = [o.calls[-1] for o in outcomes]
    # A random model's first sampled token is its end of text about once in 400 calls: that reply is
    # empty and counts no tokens, so one empty call is allowed, never a wrong count or none at all.
    assert all(c.tokens_in > 50 and 0 <= c.tokens_out <= 16 for c in calls), calls
    assert all(c.completion == "" for c in calls if c.tokens_out == 0), calls
    assert sum(c.tokens_out > 0 for c in calls) >= len(calls) - 1, calls
    assert {o.status for o in outcomes} <= {"unparseable", "invalid_program", "did_not_apply", "ok"}
    batches = server._http.engine.batches
    assert sum(batches) >= 6 and max(batches) > 1  # several requests shared one generate() call


def test_the_watchdog_restarts_a_dead_engine(engine_server):
    server, _ = engine_server
    before = server.restarts
    server.kill_for_test()
    deadline = time.monotonic() + 120
    while not (server.restarts > before and healthy(server.root)):
        assert time.monotonic() < deadline, "the engine did not come back"
        time.sleep(0.1)


def test_vllm_command_line_follows_the_config(tmp_path):
    cfg = VLLMModel(name="coder", model_path=tmp_path, tensor_parallel=2, max_model_len=8192,
                    gpu_memory_utilization=0.9, extra_args=("--enforce-eager",))
    cmd = vllm_command(cfg, "/venv/bin/python", 8123)
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(cmd)
    for part in ("--tensor-parallel-size 2", "--max-model-len 8192", "--gpu-memory-utilization 0.9",
                 "--enable-prefix-caching", "--served-model-name coder", "--host 127.0.0.1", "--port 8123",
                 "--enforce-eager"):
        assert part in joined
    assert vllm_missing(str(tmp_path / "no-such-python")) == f"{tmp_path / 'no-such-python'}: No such file or directory"


def _vllm_run(tmp_path, model_lines: str):
    """A tiny run whose island 0 asks only one `backend = "vllm"` model, served on no GPU."""
    return llm_run(tmp_path, 'backend = "vllm"\nname = "tiny"\ngpus = 0\nmax_tokens = 16\nmax_in_flight = 1\n'
                             f'startup_timeout_s = 120\n{model_lines}', max_evals=4, max_wall_s=240, timeout=400)


@pytest.mark.slow
def test_a_run_serves_a_vllm_model_without_vllm_and_says_which_engine_serves_it(tmp_path):
    """The whole path of a `backend = "vllm"` model in a run: its server actor (gpus = 0 here), the worker
    placed on the server's node, calls archived; 'auto' without vLLM in this interpreter is the
    transformers engine, and the run says so on stderr."""
    folder = save_tiny_model(tmp_path / "model")
    out = _vllm_run(tmp_path, f'model_path = "{folder}"')
    assert out.returncode == 0, out.stderr[-3000:]
    assert "atoll: model 'tiny': engine 'auto' serves with the transformers engine, not vLLM (" in out.stderr
    assert "set `python` to the interpreter of vLLM's environment" in out.stderr
    calls = run_query(tmp_path / "run", "SELECT count(*), max(tokens_out) FROM llm_calls WHERE model = 'tiny'")[1]
    assert calls[0][0] >= 1 and calls[0][1] > 0, calls  # not min: a random model's reply may end at once


def test_a_vllm_python_that_cannot_import_vllm_is_refused_with_its_reason(tmp_path):
    """A `python` the user named is meant to serve vLLM: one that cannot is an error, not a quiet stand-in
    (the run says it as "model ... could not start: <this line>", as for any server that cannot start)."""
    missing = tmp_path / "venv" / "bin" / "python"
    with pytest.raises(RuntimeError) as refused:
        VLLMServer(VLLMModel(name="tiny", model_path=tmp_path, python=missing, gpus=0))
    line = str(refused.value)
    assert line.startswith(f"{missing}: No such file or directory; fix the model's `python`"), line
    assert 'or set engine = "transformers"' in line and "\n" not in line, line
