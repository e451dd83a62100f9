"""The LLM worker against a real local HTTP server: diagnosis before repair, stored reply caps."""
from tests.workers.scripted_llm import ScriptedLLM, reply, status
from workers.llm.config import OpenAIModel
from workers.llm.prompts import PromptInput
from workers.llm.worker import LLMJob, LLMWorker

PARENT = "import numpy as np\n\ndef policy(state, params):\n    return np.maximum(10 - state['on_hand'], 0)\n"
GOOD = ("<<<<<<< SEARCH\n    return np.maximum(10 - state['on_hand'], 0)\n=======\n"
        "    return np.maximum(12 - state['on_hand'], 0)\n>>>>>>> REPLACE")


def _job():
    prompt = PromptInput("inventory", "Order stock.", "Define policy(state, params).", "policy", PARENT, None)
    return LLMJob("run", 0, 1, "parent", "child", "m", prompt, 5, ("diag-call", "edit-call"))


def _worker(url, **cfg):
    return LLMWorker(OpenAIModel(name="m", base_url=url, model="m", timeout_s=1, max_retries=0, **cfg), url)


def test_diagnosis_comes_first_and_reaches_the_edit_prompt():
    with ScriptedLLM([reply("It orders too little when the lead time is long."), reply(GOOD)]) as server:
        outcome = _worker(server.url, diagnose=True).propose(_job())
        edit_request = server.requests[1]["messages"][1]["content"]
    assert [c.kind for c in outcome.calls] == ["diagnosis", "edit"]
    assert [c.call_id for c in outcome.calls] == ["diag-call", "edit-call"]
    assert outcome.status == "ok" and "12 - state" in outcome.code
    assert outcome.diagnosis == "It orders too little when the lead time is long."
    assert "## Diagnosis of the current program\nIt orders too little" in edit_request


def test_a_failed_diagnosis_does_not_stop_the_edit_and_replies_are_capped():
    long_reply = GOOD + "\n" + "x" * 5000
    with ScriptedLLM([status(500), reply(long_reply)]) as server:
        outcome = LLMWorker(OpenAIModel(name="m", base_url=server.url, model="m", timeout_s=1, max_retries=0,
                                        diagnose=True), server.url, max_reply_chars=200).propose(_job())
    diagnosis, edit = outcome.calls
    assert diagnosis.status == "http_error" and "500" in diagnosis.error and outcome.diagnosis == ""
    assert edit.status == "ok" and edit.truncated and len(edit.completion) == 200
