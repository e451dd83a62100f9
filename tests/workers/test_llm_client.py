"""The chat client against a real local HTTP server: each behaviour ends in the right status."""
import json
import time

import pytest

from tests.workers.scripted_llm import ScriptedLLM, Step, cut, echo_key, hang, raw, reasoned, reply, slow, status, strict, trickle
from workers.llm.client import ChatClient, api_key

MESSAGES = [{"role": "user", "content": "hello there"}]


def _client(url, timeout_s=1.0, retries=2):
    return ChatClient(url, "m", "secret-key", timeout_s, retries, max_tokens=32, temperature=0.0)


@pytest.mark.parametrize("script, want, attempts", [
    ([reply("fine")], "ok", 1),
    ([status(429), reply("fine")], "ok", 2),
    ([status(500), status(502), reply("fine")], "ok", 3),
    ([status(500), status(500), status(500)], "http_error", 3),
    ([status(400)], "http_error", 1),
    ([hang(5), hang(5), hang(5)], "timeout", 3),
    ([hang(5), reply("fine")], "ok", 2),
    ([slow(0.1, "late but fine")], "ok", 1),  # 0.4 s inside the timeout: 0.3 s left a stall of 0.2 s no room
])
def test_each_behaviour_ends_in_the_right_status_or_retry(script, want, attempts):
    with ScriptedLLM(script) as server:
        start = time.monotonic()
        result = _client(server.url, timeout_s=0.5).chat(MESSAGES)
        assert (result.status, result.attempts) == (want, attempts), result
        assert len(server.requests) == attempts
        assert time.monotonic() - start < 10  # a hang ends at the timeout, retries included
    if want == "ok":
        assert result.text and result.tokens_in > 0 and result.latency_s > 0


def test_a_reply_cut_at_max_tokens_and_reasoning_sent_apart_are_told():
    with ScriptedLLM([cut("<<<<<<< SEARCH\n    return"), reasoned("Let me see. " * 50, "", finish="length"),
                      reasoned("Short.", "the answer"), reply("plain")]) as server:
        client = _client(server.url)
        results = [client.chat(MESSAGES) for _ in range(4)]
    assert [(r.status, r.cut, r.reasoning_chars) for r in results] == [
        ("ok", True, 0), ("ok", True, 600), ("ok", False, 6), ("ok", False, 0)]
    assert [len(r.reasoning) for r in results] == [0, 600, 6, 0]
    assert [r.text for r in results] == ["<<<<<<< SEARCH\n    return", "", "the answer", "plain"]


def test_an_endpoint_that_refuses_max_tokens_or_a_temperature_gets_what_it_takes_from_then_on():
    """OpenAI's reasoning models refuse `max_tokens` (they take `max_completion_tokens`) and any
    temperature but their default, each with an HTTP 400: the client sends what they take, for good."""
    with ScriptedLLM([strict("fine"), strict("again")]) as server:
        client = _client(server.url)
        first, second = client.chat(MESSAGES), client.chat(MESSAGES)
    assert (first.status, first.text, first.attempts) == ("ok", "fine", 3)  # two refused, then answered
    assert first.adapted == ("sends max_completion_tokens instead of max_tokens",
                             "sends no temperature (the endpoint's default)")
    assert (second.status, second.text, second.attempts, second.adapted) == ("ok", "again", 1, ())
    sent = server.requests
    assert [("max_tokens" in b, "max_completion_tokens" in b, "temperature" in b) for b in sent] == [
        (True, False, True), (False, True, True), (False, True, False), (False, True, False)]
    assert sent[-1]["max_completion_tokens"] == 32
    with ScriptedLLM([status(400)]) as server:  # any other refusal stands: one attempt, nothing changed
        client = _client(server.url)
        assert client.chat(MESSAGES).status == "http_error" and len(server.requests) == 1
        assert (client.limit_field, client.send_temperature) == ("max_tokens", True)


def test_a_models_extra_body_goes_with_every_request_and_never_replaces_atolls_fields():
    extra = {"top_p": 0.9, "chat_template_kwargs": {"enable_thinking": False}}
    with ScriptedLLM([reply("fine"), reply("again")]) as server:
        client = ChatClient(server.url, "m", "k", 1.0, 0, 64, 0.2, extra)
        assert [client.chat(MESSAGES, seed=s).status for s in (1, 2)] == ["ok", "ok"]
    for body, seed in zip(server.requests, (1, 2)):
        assert body == {"top_p": 0.9, "chat_template_kwargs": {"enable_thinking": False}, "model": "m",
                        "messages": MESSAGES, "max_tokens": 64, "temperature": 0.2, "seed": seed}
    from workers.llm.config import OpenAIModel
    with pytest.raises(ValueError, match="max_tokens, seed: set by Atoll; not sent from extra_body"):
        OpenAIModel(name="q", base_url="http://127.0.0.1:9/v1", model="m", extra_body={"seed": 1, "max_tokens": 9})
    with pytest.raises(ValueError, match="temperature: set by Atoll; use this model's own key"):
        OpenAIModel(name="q", base_url="http://127.0.0.1:9/v1", model="m", extra_body={"temperature": 1.0})


def test_content_sent_as_parts_is_read_as_its_text():
    parts = [{"type": "text", "text": "<<<<<<< SEARCH\n"}, {"type": "image_url", "image_url": "x"},
             {"type": "output_text", "text": "    return 0"}]
    with ScriptedLLM([reply(parts)]) as server:
        result = _client(server.url).chat(MESSAGES)
    assert (result.status, result.text) == ("ok", "<<<<<<< SEARCH\n    return 0")


def test_missing_usage_is_estimated_and_flagged():
    with ScriptedLLM([Step("no_usage", "some reply text here")]) as server:
        result = _client(server.url).chat(MESSAGES)
    assert result.status == "ok" and result.estimated_tokens and result.tokens_out == len("some reply text here") // 4


def test_api_key_comes_from_env_or_file_and_is_never_in_the_result(tmp_path, monkeypatch):
    monkeypatch.setenv("ATOLL_TEST_KEY", "sk-env-123")
    assert api_key("ATOLL_TEST_KEY", None) == "sk-env-123"
    (tmp_path / "key").write_text("sk-file-456\n")
    assert api_key(None, tmp_path / "key") == "sk-file-456"
    with pytest.raises(ValueError, match="ATOLL_MISSING_KEY"):
        api_key("ATOLL_MISSING_KEY", None)
    with ScriptedLLM([status(401)]) as server:
        result = ChatClient(server.url, "m", "sk-env-123", 1.0, 0, 16, 0.0).chat(MESSAGES)
        sent = server.requests[0]
    assert result.status == "http_error" and "sk-env-123" not in repr(result) and "sk-env-123" not in repr(sent)


def test_an_endpoint_that_quotes_the_key_back_has_it_blanked_before_it_is_stored_or_shown():
    """A proxy's 401 that quotes the key it was sent went as it was into llm_calls.error (an archive
    that is copied, shared and queried) and into the notice on stderr."""
    with ScriptedLLM([echo_key()]) as server:
        result = ChatClient(server.url, "m", "sk-proj-0123456789abcdef", 1.0, 0, 16, 0.0).chat(MESSAGES)
    assert result.status == "http_error" and "0123456789abcdef" not in repr(result), result
    assert result.error == "HTTP 401: Incorrect API key provided: (the API key)."


def test_no_server_at_the_address_is_said_as_such_not_as_a_timeout():
    """urllib3 counts a refused connection as a connect timeout; a user would chase a slow endpoint."""
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    result = _client(f"http://127.0.0.1:{port}/v1", retries=2).chat(MESSAGES)
    assert (result.status, result.attempts) == ("http_error", 3), result
    assert f"cannot connect to http://127.0.0.1:{port}/v1/chat/completions" in result.error, result.error
    assert "Connection refused" in result.error and time.monotonic() - start < 10


def test_usage_no_call_can_have_is_estimated_and_never_raises():
    """Usage of Infinity raised out of `chat`; a negative count gave the budget back; one past
    llm_calls' 32-bit columns failed the driver's commit, and every commit after it."""
    answer = {"choices": [{"index": 0, "finish_reason": "stop",
                           "message": {"role": "assistant", "content": "some reply text here"}}]}
    usages = [{"prompt_tokens": float("inf"), "completion_tokens": 3}, {"prompt_tokens": 12, "completion_tokens": -5},
              {"prompt_tokens": -100000, "completion_tokens": 5}, {"prompt_tokens": 3_000_000_000},
              {"prompt_tokens": 10 ** 400, "completion_tokens": 1}, {"prompt_tokens": "many"}, ["not", "a", "dict"]]
    with ScriptedLLM([raw(dict(answer, usage=u)) for u in usages] + [raw(dict(answer, usage={
            "prompt_tokens": 40, "completion_tokens": 9}))]) as server:
        client = _client(server.url)
        results = [client.chat(MESSAGES) for _ in range(len(usages) + 1)]
    estimated = ("ok", "some reply text here", len("hello there") // 4, len("some reply text here") // 4, True)
    assert [(r.status, r.text, r.tokens_in, r.tokens_out, r.estimated_tokens) for r in results] == [
        estimated] * len(usages) + [("ok", "some reply text here", 40, 9, False)]


def test_an_answer_with_no_completion_is_an_http_error_with_the_servers_message():
    """A proxy that sends its upstream's error with a 200 (or a body with no choices) was an 'ok' empty
    reply: an 'unparseable' child, a failure the next prompt blamed on the model, the model never paused."""
    with ScriptedLLM([raw({"error": {"message": "upstream overloaded", "code": 529}}), raw({"id": "x"}),
                      raw({"choices": []}), raw(b"<html>bad gateway</html>"), raw([1, 2])]) as server:
        client = _client(server.url)
        results = [client.chat(MESSAGES) for _ in range(5)]
    assert [r.status for r in results] == ["http_error"] * 5
    assert results[0].error == "HTTP 200 with no completion: upstream overloaded"
    assert results[1].error == 'HTTP 200 with no completion: {"id": "x"}'
    assert "malformed answer" in results[3].error and "no completion" in results[4].error


def test_an_answer_is_read_for_at_most_the_timeout_and_up_to_a_size():
    """Each socket read had the timeout, the whole body none: a server trickling a byte each 0.1 s
    held a call of timeout_s = 0.5 for as long as it liked, and any size of body was read into memory."""
    from workers.llm.client import MAX_ANSWER_BYTES

    with ScriptedLLM([trickle(0.1, "a reply of some length that comes slowly"), reply("fine"),
                      raw(b" " * (MAX_ANSWER_BYTES + 1)), reply("fine again")]) as server:
        client = _client(server.url, timeout_s=0.5, retries=0)
        start = time.monotonic()
        slow_one = client.chat(MESSAGES)
        assert time.monotonic() - start < 3  # the body alone takes over 20 s
        assert (slow_one.status, slow_one.attempts) == ("timeout", 1), slow_one
        assert "did not finish its answer in time" in slow_one.error
        assert client.chat(MESSAGES).text == "fine"  # the next call is answered as usual
        big = client.chat(MESSAGES)
        assert (big.status, big.error) == ("http_error", "the answer ran past 16 MiB; not read further")
        assert client.chat(MESSAGES).text == "fine again"


def test_a_lone_surrogate_in_a_reply_its_reasoning_or_an_error_is_stored_as_a_replacement_character():
    """JSON may escape half a pair (`\\ud83d`: an emoji cut at max_tokens); such a string has no UTF-8,
    and writing the call's row failed the driver's commit: the run ended with a traceback."""
    def answer(content, reasoning):
        message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        body = {"choices": [{"index": 0, "finish_reason": "length", "message": message}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
        return raw(json.dumps(body).replace("HALF", "\\ud83d").encode())
    with ScriptedLLM([answer("Better: HALF", "think HALF"), answer([{"type": "text", "text": "partHALF"}], None),
                      Step("raw", b'{"error": {"message": "bad HALF"}}'.replace(b"HALF", b"\\udc00"))]) as server:
        client = _client(server.url, retries=0)
        results = [client.chat(MESSAGES) for _ in range(3)]
    assert [(r.text, r.reasoning) for r in results[:2]] == [("Better: \ufffd", "think \ufffd"), ("part\ufffd", "")]
    assert results[2].error == "HTTP 200 with no completion: bad \ufffd"
    for result in results:
        (result.text + result.reasoning + result.error).encode()  # what DuckDB and Arrow take
