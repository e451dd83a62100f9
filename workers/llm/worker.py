"""The LLM mutation worker: prompt, call, parse, apply, check; one `LLMJob` in, one `LLMOutcome` out.

A plain class (tested without Ray); `controller.proposals` makes it an actor with
`max_concurrency`, so many calls wait on the endpoint at once and none blocks
another. It never executes a reply: the child is text that the evaluator scores
in a sandbox, or an INVALID candidate with the reason when the reply gives none.
"""
from __future__ import annotations

from dataclasses import dataclass

from workers.llm.client import OK, ChatClient, ChatResult
from workers.llm.edits import INVALID_PROGRAM, EditError, answer_of, apply_edit, check_child, parse_reply
from workers.llm.prompts import Prompt, PromptInput, diagnosis_prompt, edit_prompt, part_id

PREFIX = "llm:"


@dataclass(frozen=True)
class LLMJob:
    """Ask model `model` for one child of `parent_id` on `island`; ids are the driver's."""

    run_id: str
    island: int
    generation: int
    parent_id: str
    child_id: str
    model: str
    prompt: PromptInput
    seed: int
    call_ids: tuple[str, str]  # (diagnosis call, edit call)


@dataclass(frozen=True)
class CallRecord:
    """One llm_calls row, before the driver adds cost and commits it."""

    call_id: str
    kind: str  # "diagnosis" or "edit"
    status: str  # ok, timeout, http_error, unparseable, did_not_apply, invalid_program
    parts: tuple[tuple[str, str], ...]  # (part id, text) of the prompt
    completion: str
    truncated: bool
    tokens_in: int
    tokens_out: int
    latency_s: float
    attempts: int
    error: str = ""
    estimated: bool = False  # the server sent no usage: tokens are characters / 4
    adapted: tuple[str, ...] = ()  # what the client changed for good after the endpoint refused a field
    reasoning: str = ""  # the reasoning the server sent apart from the reply, cut as the completion is


@dataclass(frozen=True)
class LLMOutcome:
    """The calls made for a job and the child they gave (empty code when none)."""

    job: LLMJob
    calls: tuple[CallRecord, ...]
    status: str
    code: str = ""
    edit_kind: str = ""
    reason: str = ""
    diagnosis: str = ""
    form: str = ""  # the child's normal form (`workers.normal_form`) when it is OK: the driver's dedup uses it
    cut: bool = False  # the edit call's reply stopped at max_tokens

    @property
    def operator(self) -> str:
        return PREFIX + self.job.model


class LLMWorker:
    """Proposes children with one model at one endpoint."""

    def __init__(self, model_config, base_url: str, key: str = "no-key", max_reply_chars: int = 8000):
        cfg = model_config
        model_id = getattr(cfg, "model", None) or cfg.name
        self.client = ChatClient(base_url, model_id, key, cfg.timeout_s, cfg.max_retries, cfg.max_tokens,
                                 cfg.temperature, cfg.extra_body)
        self.diagnose, self.max_reply_chars, self.max_tokens = cfg.diagnose, max_reply_chars, cfg.max_tokens

    def propose(self, job: LLMJob) -> LLMOutcome:
        calls, diagnosis = [], ""
        if self.diagnose:
            prompt = diagnosis_prompt(job.prompt)
            result = self.client.chat(list(prompt.messages), seed=job.seed)
            calls.append(self._record(job.call_ids[0], "diagnosis", prompt, result, result.status, result.error))
            diagnosis = (answer_of(result.text) or "").strip()[:1500] if result.status == OK else ""
        prompt = edit_prompt(job.prompt, diagnosis)
        result = self.client.chat(list(prompt.messages), seed=job.seed + 1)
        if result.status != OK:
            calls.append(self._record(job.call_ids[1], "edit", prompt, result, result.status, result.error))
            return LLMOutcome(job, tuple(calls), result.status, reason=result.error, diagnosis=diagnosis)
        code, kind, form, error = _child(result.text, job.prompt)
        status, reason = (error.status, error.reason + self._why(result)) if error else (OK, "")
        calls.append(self._record(job.call_ids[1], "edit", prompt, result, status, reason))
        return LLMOutcome(job, tuple(calls), status, code=code, edit_kind=kind, reason=reason, diagnosis=diagnosis,
                          form=form, cut=result.cut)

    def _why(self, result: ChatResult) -> str:
        """What a failed reply's reason adds when the reply was cut off, or held only reasoning."""
        if result.cut:
            return f" (the reply was cut off at max_tokens = {self.max_tokens})"
        if not result.text.strip() and result.reasoning_chars:
            return f" (the reply held only reasoning, {result.reasoning_chars} characters, and no answer)"
        return ""

    def complete(self, call_id: str, text: str, kind: str = "variant") -> CallRecord:
        """One plain call with `text` as the user message (e.g. rewriting a prompt variant); the
        reply's answer (`answer_of`: its reasoning left out, '' when it never got past it) is only
        text for the caller to parse, never code to apply."""
        prompt = Prompt(((kind, text),), ({"role": "user", "content": text},))
        result = self.client.chat(list(prompt.messages))
        return self._record(call_id, kind, prompt, result, result.status, result.error,
                            answer_of(result.text) or "")

    def _record(self, call_id: str, kind: str, prompt: Prompt, result: ChatResult, status: str,
                error: str = "", text: str | None = None) -> CallRecord:
        text = result.text if text is None else text
        return CallRecord(call_id, kind, status, tuple((part_id(t), t) for _, t in prompt.parts),
                          text[:self.max_reply_chars], len(text) > self.max_reply_chars,
                          result.tokens_in, result.tokens_out, result.latency_s, result.attempts, error,
                          result.estimated_tokens, result.adapted, result.reasoning[:self.max_reply_chars])

    def ping(self) -> bool:
        return True


def _child(reply: str, p: PromptInput) -> tuple[str, str, str, EditError | None]:
    """(code, edit kind, normal form, error): the checked child; or, for an INVALID candidate, the
    child that failed its check, or the reply itself when it gave no child at all."""
    child, kind = reply, ""
    try:
        edit = parse_reply(reply, p.entry_point)
        kind = edit.kind
        child = apply_edit(p.parent_code, edit)
        form = check_child(child, p.parent_code, p.entry_point, p.tuned)
    except EditError as exc:
        return (child if exc.status == INVALID_PROGRAM else reply), kind, "", exc
    return child, kind, form, None
