"""The real entry point with LLM models behind a scripted chat-completions server on loopback:
good diffs, rewrites, broken diffs, prose, contract breaks, 429s, 500s, hangs and slow replies
each end in their status or a retry, nothing stalls, the run finishes and the accounts add up."""
import itertools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from store.query import run_query
from tests.tiny import llm_config
from tests.workers.scripted_llm import ScriptedLLM, cut, hang, parent_code, reasoned, reply, slow, stall, status, strict

ROOT = Path(__file__).resolve().parents[2]
SECRET = "sk-test-DO-NOT-STORE-4711"


def good_diff(prompt):
    code = parent_code(prompt)
    line = [ln for ln in code.splitlines() if ln.startswith("    return ")][-1]
    expr = line.removeprefix("    return ")
    return f"Cap it:\n```\n<<<<<<< SEARCH\n{line}\n=======\n    return np.maximum({expr}, 0)\n>>>>>>> REPLACE\n```"


def rewrite(prompt):
    return "```python\n" + parent_code(prompt) + "\n\ndef _unused(x):\n    return x\n```"


SCRIPT = [reply(good_diff), reply(rewrite), reply("<<<<<<< SEARCH\n    return nothing_like_this\n=======\n    return 1\n"
                                                   ">>>>>>> REPLACE"),
          reply("Lowering the level should reduce holding cost."), reply("```python\ndef policy(state):\n    return 1\n```"),
          status(429), reply(good_diff), status(500), reply(good_diff), hang(3), stall(3), slow(0.3, rewrite),
          reply("```python\ndef policy(state, params):\n    return (\n```")]


def _config(tmp_path, url, budget_calls=None, embedded=1.0, in_flight=3, timeout_s=0.5) -> Path:
    budget = f"\n[mutator.llm.budget]\ncalls = {budget_calls}\n" if budget_calls else ""
    model = f"""backend = "openai"
name = "scripted"
model = "scripted-1"
base_url = "{url}"
api_key_env = "ATOLL_TEST_SECRET"
timeout_s = {timeout_s}
max_retries = 1
max_in_flight = {in_flight}
{budget}"""
    return llm_config(tmp_path / "llm.toml", model, 24, run='name = "llm-test"',
                      more="[controller]\ncommit_every_s = 0.2\nheldout_on_new_best = true",
                      llm=f"weights = {{embedded = {embedded}}}", prompt="failures = 3")


def _atoll(tmp_path, *args, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT), ATOLL_TEST_SECRET=SECRET)
    return subprocess.run([sys.executable, "-m", "controller", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _rows(run_dir, sql):
    return run_query(run_dir, sql)[1]


def test_scripted_replies_each_end_in_their_status_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "run"
    with ScriptedLLM(SCRIPT, cycle=True) as server:
        out = _atoll(tmp_path, "run", str(_config(tmp_path, server.url)), "--run-dir", str(run_dir))
        requests = len(server.requests)
    assert out.returncode == 0, out.stderr
    assert "search completed: 24 evaluations" in out.stdout and "LLM calls by model" in out.stdout
    statuses = dict(_rows(run_dir, "SELECT status, count(*) FROM llm_calls GROUP BY 1"))
    assert {"ok", "unparseable", "did_not_apply", "invalid_program", "timeout"} <= set(statuses), statuses
    # every HTTP attempt the server saw is one call's attempt; in-flight calls drained before the end
    assert _rows(run_dir, "SELECT sum(attempts) FROM llm_calls")[0][0] == requests
    assert _rows(run_dir, "SELECT count(*) FROM llm_calls WHERE attempts = 2 AND status <> 'timeout'")[0][0] >= 1
    # INVALID candidates carry their reason and were never evaluated
    invalid = _rows(run_dir, "SELECT e.error, e.duration_s FROM evaluations e JOIN programs p USING (program_id) "
                             "WHERE p.mutator = 'llm:scripted' AND e.status = 'INVALID'")
    kinds = {error.split(":")[0] for error, _ in invalid}
    assert kinds == {"unparseable", "did_not_apply", "invalid_program"} and all(d == 0 for _, d in invalid)
    # every ok edit call's child was evaluated (a prompt-variant call at the run's end has no child);
    # every call row's figures are there
    assert _rows(run_dir, "SELECT count(*) FROM llm_calls c LEFT JOIN evaluations e ON e.program_id = c.program_id "
                          "AND e.split = 'search' WHERE c.status = 'ok' AND c.kind = 'edit' AND e.status IS NULL")[0][0] == 0
    assert _rows(run_dir, "SELECT count(*) FROM llm_calls WHERE status = 'ok' AND tokens_in > 0 "
                          "AND latency_s > 0 AND model = 'scripted'")[0][0] == statuses["ok"]
    # a failure's reason reaches the next prompt on the same parent
    prompts = [p for (p,) in _rows(run_dir, "SELECT prompt FROM llm_prompts")]
    assert any("Recent failed attempts" in p and re.search(r"(unparseable|did_not_apply|invalid_program): ", p)
               for p in prompts)
    # shared prompt parts are stored once: fewer parts than calls x parts per call
    parts, refs = _rows(run_dir, "SELECT (SELECT count(*) FROM llm_prompt_parts), "
                                 "(SELECT sum(len(prompt_parts)) FROM llm_calls)")[0]
    assert parts < refs
    # held-out results never reach a prompt
    # (a held-out score that is also a search score, such as base-stock's -1 on both, tells nothing)
    scores = {split: {f"{s:.6g}" for (s,) in _rows(run_dir, "SELECT score FROM evaluations WHERE split = "
                                                          f"'{split}' AND score IS NOT NULL")}
              for split in ("search", "heldout")}
    telling = scores["heldout"] - scores["search"]
    assert telling and not any(s in p for s in telling for p in prompts), telling
    # the key is used, never stored or printed
    assert SECRET not in out.stdout + out.stderr and SECRET.encode() not in (run_dir / "archive.duckdb").read_bytes()
    status_out = _atoll(tmp_path, "status", str(run_dir))
    assert "LLM calls by model" in status_out.stdout and "llm:scripted" in status_out.stdout


@pytest.mark.slow
def test_the_call_budget_stops_requests_and_a_resume_keeps_what_is_left(tmp_path):
    run_dir = tmp_path / "run"
    with ScriptedLLM([reply(good_diff), reply(rewrite)], cycle=True) as server:
        config = _config(tmp_path, server.url, budget_calls=4, embedded=0.0)
        first = _atoll(tmp_path, "run", str(config), "--run-dir", str(run_dir), "--no-report")
        assert first.returncode == 0, first.stderr
        assert "search llm-budget" in first.stdout
        assert _rows(run_dir, "SELECT count(*) FROM llm_calls")[0][0] == 4 == len(server.requests)
        again = _atoll(tmp_path, "resume", str(run_dir), "--no-report", "--set", "mutator.llm.budget.calls=6")
        assert again.returncode == 0, again.stderr
        assert _rows(run_dir, "SELECT count(*) FROM llm_calls")[0][0] == 6 == len(server.requests)


@pytest.mark.slow
def test_a_model_whose_calls_keep_failing_is_named_on_stderr_and_so_is_its_return(tmp_path):
    """An endpoint that refuses every call for a while: the run says so once, keeps asking, and says
    when it answers again (before, nothing showed until the run's LLM table at its end)."""
    run_dir = tmp_path / "run"
    names = itertools.count()

    def another(prompt):  # a new program every time (a helper of a new name), so none is a duplicate
        return "```python\n" + parent_code(prompt) + f"\n\ndef _unused_{next(names)}(x):\n    return x\n```"

    # The server answers in the order calls arrive. One call at a time, with time to spare: with three
    # in flight a later call could arrive before an earlier one, and on a loaded machine a call that
    # timed out after 0.5 s could be retried into the next step; either way fewer than 5 could fail in a row.
    with ScriptedLLM([status(400)] * 6 + [reply(another)] * 80) as server:  # 400: not retried
        out = _atoll(tmp_path, "run", str(_config(tmp_path, server.url, embedded=0.0, in_flight=1, timeout_s=10)),
                     "--run-dir", str(run_dir), "--no-report")
    assert out.returncode == 0 and "search completed: 24 evaluations" in out.stdout, out.stdout + out.stderr
    failing = [line for line in out.stderr.splitlines() if "calls to model 'scripted'" in line]
    assert len(failing) == 1 and f"the last 5 calls to model 'scripted' at {server.url} failed" in failing[0]
    assert "HTTP 400: scripted 400" in failing[0], failing
    back = [line for line in out.stderr.splitlines() if "model 'scripted' answers again" in line]
    assert len(back) == 1 and re.search(r"after [56] failed calls", back[0]), out.stderr[-2000:]
    kinds = dict(_rows(run_dir, "SELECT kind, count(*) FROM events WHERE kind LIKE 'llm-%' GROUP BY 1"))
    assert kinds.get("llm-failing") == 1 and kinds.get("llm-answers-again") == 1, kinds
    assert len(server.requests) <= 86  # paused while failing: no call beyond the script's steps


@pytest.mark.slow
def test_a_reasoning_models_drafts_are_left_out_and_replies_cut_at_max_tokens_are_named_once(tmp_path):
    """A reasoning model drafts before its answer (`<think>`...`</think>`, or only the end when the chat
    template opened the section) and may spend every token thinking: drafts are never applied, a cut
    reply is unparseable with that reason, and 3 in a row are said once, with the setting to raise."""
    run_dir = tmp_path / "run"
    names = itertools.count()

    def another(prompt):  # a new program every time, so none is a duplicate
        return "```python\n" + parent_code(prompt) + f"\n\ndef _unused_{next(names)}(x):\n    return x\n```"

    draft = "<<<<<<< SEARCH\n    return level_that_is_not_there\n=======\n    return 0\n>>>>>>> REPLACE"
    thinking = reply(lambda p: f"<think>\nA first try:\n{draft}\nNo, not that line.\n</think>\n\n{another(p)}")
    opened = reply(lambda p: f"A helper will do.\n{draft}\n</think>\n{another(p)}")
    first = strict(lambda p: f"<think>\nOpenAI's reasoning models refuse max_tokens.\n</think>\n{another(p)}")
    script = [first, cut("<think>\nThe level is too low, so"), cut("<think>\nMaybe"),
              reasoned("Thinking about the level. " * 20, "", finish="length")] + [thinking, opened] * 40
    with ScriptedLLM(script) as server:
        out = _atoll(tmp_path, "run", str(_config(tmp_path, server.url, embedded=0.0, in_flight=1, timeout_s=10)),
                     "--run-dir", str(run_dir), "--no-report")
    assert out.returncode == 0 and "search completed: 24 evaluations" in out.stdout, out.stdout + out.stderr
    said = [line for line in out.stderr.splitlines() if "were cut off at its max_tokens" in line]
    assert said == [("atoll: the last 3 replies of model 'scripted' were cut off at its max_tokens (512), most before "
                     "they held a whole edit (a reasoning model spends tokens thinking first; a whole program takes "
                     "more than a diff). Give it more: atoll stop, then atoll resume DIR --set "
                     "mutator.llm.models.scripted.max_tokens=2048.")], out.stderr
    assert _rows(run_dir, "SELECT count(*) FROM events WHERE kind = 'llm-replies-cut'")[0][0] == 1
    # the first endpoint took requests only as OpenAI's reasoning models do: the client changed them, said once each
    changes = [row[0] for row in _rows(run_dir, "SELECT data->>'change' FROM events WHERE kind = 'llm-endpoint-adapted' "
                                                "ORDER BY ts")]
    assert changes == ["sends max_completion_tokens instead of max_tokens",
                       "sends no temperature (the endpoint's default)"], changes
    assert [line for line in out.stderr.splitlines() if "refused a field of its requests" in line] == [
        f"atoll: model 'scripted' refused a field of its requests (HTTP 400), and now {change}; the refused attempt "
        "counts in llm_calls.attempts." for change in changes], out.stderr
    assert _rows(run_dir, "SELECT max(attempts) FROM llm_calls")[0][0] == 3
    # reasoning sent apart from the answer is kept beside it; the thinking inside a reply stays in the completion
    assert _rows(run_dir, "SELECT reasoning, completion FROM llm_calls WHERE reasoning IS NOT NULL") == [
        ("Thinking about the level. " * 20, "")]
    errors = sorted(e for (e,) in _rows(run_dir, "SELECT error FROM llm_calls WHERE status = 'unparseable'"))
    cut_off = " (the reply was cut off at max_tokens = 512)"
    assert errors == sorted(["the reply ended inside its <think> section, before any answer" + cut_off] * 2 + [
        "the reply has no SEARCH/REPLACE block and no program defining policy() in a ```python block" + cut_off])
    statuses = dict(_rows(run_dir, "SELECT status, count(*) FROM llm_calls WHERE kind = 'edit' GROUP BY 1"))
    # the seed, 3 INVALID and 20 children: no draft was ever applied (it would not apply: did_not_apply)
    assert statuses == {"unparseable": 3, "ok": 20}, statuses


@pytest.mark.slow
def test_an_endpoint_that_never_answers_is_paused_not_hammered(tmp_path):
    """Every call fails at once (HTTP 400, not retried): the model is paused, longer each time,
    instead of being asked hundreds of times a second until the wall time (94,579 calls in 200 s
    before), and the run ends at its wall time with what it has."""
    run_dir = tmp_path / "run"
    config = _config(tmp_path, "http://127.0.0.1:9/v1", embedded=0.0)
    config.write_text(config.read_text().replace("max_wall_s = 200", "max_wall_s = 10"))
    with ScriptedLLM([status(400)], cycle=True) as server:
        config.write_text(config.read_text().replace("http://127.0.0.1:9/v1", server.url))
        out = _atoll(tmp_path, "run", str(config), "--run-dir", str(run_dir), "--no-report")
    assert out.returncode == 0 and "search wall-time: 1 evaluations" in out.stdout, out.stdout + out.stderr
    assert len(server.requests) <= 5 + 3 * 6, len(server.requests)  # 5, then at most 3 in flight per pause
    assert sum("calls to model 'scripted'" in line for line in out.stderr.splitlines()) == 1
