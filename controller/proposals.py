"""Proposal scheduling for the run loop: which source proposes on an island, the LLM jobs in
flight, their accounting, and what their outcomes become (a candidate to evaluate, an INVALID
candidate that is never evaluated, or nothing).

The loop stays the one event loop: it asks `choose` before each request, sends LLM jobs
through `submit` and hands their finished refs to `on_outcome`. Per-model in-flight limits
are apart from the evaluators' limit, so slow calls never starve the evaluators while the
embedded mutator (where an island allows it) keeps them busy. Budgets count calls in flight.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from collections import OrderedDict, defaultdict, deque

import numpy as np
import ray
from ray.exceptions import RayActorError, RayTaskError

from controller.llm_choice import Arm, Budget, ModelBandit, call_cost, pick_source
from store import llm_calls
from store.records import Candidate, EvalResult, MutationRequest, Status
from workers.llm.client import OK
from workers.llm.config import EMBEDDED
from workers.llm.feedback import from_result
from workers.llm.prompts import PromptInput
from workers.llm.worker import PREFIX, LLMJob, LLMOutcome
from workers.skills import render_skills

INVALID_KINDS = ("unparseable", "did_not_apply", "invalid_program")
# Calls of one model failed in a row (each after its retries) before the run says so on stderr and
# pauses the model: 1 s, then twice as long after each further failure, up to LLM_PAUSE_MAX_S
LLM_FAILING, LLM_PAUSE_MAX_S = 5, 60.0
LLM_CUT = 3  # replies in a row cut off at max_tokens before the run says so
# Programs whose prompt feedback, and parents whose recent failures, the driver keeps in memory
# (the most recently used): a week-long run evaluates millions, and each one's feedback is a few KB.
# An older program's feedback is made again from the archive when it is drawn; an older parent's
# failures are shown again only after a resume reloads them (`_restore`)
FEEDBACK_KEPT, FAILURES_KEPT = 4096, 16384


class Recent(OrderedDict):
    """A dict that keeps only its `size` most recently set or looked-up (`[]`) entries; with a
    `factory`, a missing key looked up with `[]` is set to a new value, as in a defaultdict."""

    def __init__(self, size: int, factory=None):
        super().__init__()
        self.size, self.factory = size, factory

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __missing__(self, key):
        if self.factory is None:
            raise KeyError(key)
        self[key] = value = self.factory()
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


def _id() -> str:
    return uuid.uuid4().hex[:12]


class Proposals:
    """The run's proposal sources: the embedded mutator and, with `[mutator.llm]`, the models."""

    def __init__(self, config, archive, run_id: str, domain, dedup):
        self.config, self.archive, self.run_id, self.domain, self.dedup = config, archive, run_id, domain, dedup
        self.llm = config.mutator.llm
        self.rng = np.random.default_rng([config.run.seed, 14])
        self.backends: dict = {}
        self.in_flight: dict[str, int] = defaultdict(int)
        self.reserved: dict[str, tuple] = {}
        self.rows: list[dict] = []
        self._writing = 0  # how many of `rows` the commit in progress writes (`calls_to_write`)
        self.parts: dict[str, str] = {}
        self.feedback = Recent(FEEDBACK_KEPT)  # program id -> Feedback (None: no search row)
        self.evaluated = Recent(FEEDBACK_KEPT)  # program id -> (EvalResult, code): feedback made when asked
        self.events: list = []
        self.notices: list[str] = []  # said on stderr by the run's progress (the search's `notices`)
        self.failing: dict[str, int] = {}  # model -> its calls failed in a row
        self.cut: dict[str, int] = {}  # model -> its edit replies cut off at max_tokens in a row (-1: said)
        self.adapted: set[tuple[str, str]] = set()  # (model, change) its client made in its requests, said
        self.paused_until: dict[str, float] = {}  # model -> monotonic time before which it gets no call
        self.failures = Recent(FAILURES_KEPT, lambda: deque(maxlen=self._shown_failures()))
        if self.llm is not None:
            self._restore()

    def _shown_failures(self) -> int:
        return max(self.llm.prompt.failures, 1) if self.llm else 1

    def _restore(self) -> None:
        """Budget, bandit and failure memory from the archive: a resume goes on where it stopped."""
        used = llm_calls.usage(self.archive, self.run_id)
        unit = self.llm.bandit.cost_unit
        self.budget = Budget(self.llm.budget)
        self.budget.spend(sum(u["calls"] for u in used.values()), sum(u["tokens"] for u in used.values()),
                          sum(u["cost"] for u in used.values()))
        names = {m.name for m in self.llm.models}
        arms = {m: Arm(u["edits"], u["improvements"], {"tokens": u["tokens"], "money": u["cost"], "gpu_s": u["gpu_s"],
                                                       "calls": u["calls"]}[unit]) for m, u in used.items() if m in names}
        self.bandit = ModelBandit(self.llm.bandit, self.rng, arms)
        for parent, items in llm_calls.recent_failures(self.archive, self.run_id, self._shown_failures()).items():
            self.failures[parent].extend(items)

    def start(self) -> None:
        """Start every model's actors (servers first); a model that cannot start is a clear error."""
        from controller.cli import UserError
        from controller.llm_backends import Backend

        for cfg in self.llm.models if self.llm else ():
            try:
                self.backends[cfg.name] = Backend(cfg, self.llm.max_reply_chars)
            except (ValueError, RayActorError, RayTaskError) as exc:
                raise UserError(f"mutator.llm model {cfg.name!r} could not start: {_last_line(exc)}") from None
            if self.backends[cfg.name].note:
                self.notices.append(self.backends[cfg.name].note)

    # --- choosing ---------------------------------------------------------------------
    def _models_with_room(self, evals_full: bool) -> set[str]:
        if self.llm is None or evals_full:
            return set()
        now = time.monotonic()
        return {m.name for m in self.llm.models
                if self.in_flight[m.name] < m.max_in_flight and self.paused_until.get(m.name, 0.0) <= now
                and self.budget.allows(*self._estimate(m))}

    def resting(self) -> bool:
        """Whether a model is paused after failing calls: the run waits for it rather than ending."""
        now = time.monotonic()
        return any(until > now for until in self.paused_until.values())

    def any_room(self, embedded_room: bool, evals_full: bool) -> bool:
        return embedded_room or bool(self._models_with_room(evals_full))

    def choose(self, island: int, embedded_room: bool, evals_full: bool) -> str | None:
        """'embedded', a model name, or None when none of the island's sources has room."""
        if self.llm is None:
            return EMBEDDED if embedded_room else None
        mix = {k: w for k, w in self.llm.island_mix(island).items() if w > 0}
        allowed = self._models_with_room(evals_full) | ({EMBEDDED} if embedded_room else set())
        side = pick_source(mix, allowed, self.rng)
        if side != "llm":
            return side
        return self.bandit.choose({m: w for m, w in mix.items() if m != EMBEDDED and m in allowed})

    def _estimate(self, cfg, prompt_chars: int = 4000) -> tuple[int, int, float]:
        """(calls, tokens, cost) a job may spend at most, for budget reservations."""
        calls = 2 if cfg.diagnose else 1
        tokens_in, tokens_out = calls * prompt_chars // 4, calls * cfg.max_tokens
        return calls, tokens_in + tokens_out, _money(cfg, tokens_in, tokens_out)

    # --- submitting -------------------------------------------------------------------
    def submit(self, model: str, request: MutationRequest, scores: dict, codes: dict, instruction: str = ""):
        """Send one job to `model`'s worker (its task worded by `instruction`, a prompt variant, if
        given; the request's library skills shown); returns (ref, job)."""
        cfg = self.llm.model(model)
        prompt = dataclasses.replace(self._prompt_input(cfg, request, scores, codes),
                                     skills=render_skills(request.skills), instruction=instruction)
        job = LLMJob(self.run_id, request.island, request.generation, request.parent_id, _id(), model, prompt,
                     request.seed, (_id(), _id()))
        estimate = self._estimate(cfg, len(prompt.parent_code) * 2 + sum(len(c) for c, _ in prompt.inspirations)
                                  + len(prompt.skills) + 2500)
        self.budget.reserve(*estimate)
        self.reserved[job.child_id] = estimate
        self.in_flight[model] += 1
        return self.backends[model].worker.propose.remote(job), job

    def _prompt_input(self, cfg, request: MutationRequest, scores: dict, codes: dict) -> PromptInput:
        shown = self.llm.prompt
        inspirations = tuple((code, scores.get(pid)) for pid, code in request.inspirations[:shown.inspirations])
        failures = tuple(self.failures.get(request.parent_id, ()))[-shown.failures:] if shown.failures else ()
        return PromptInput(self.domain.name, self.domain.description(), self.domain.contract(),
                           self.domain.entry_point, request.parent_code,
                           self._feedback(request.parent_id, codes.get(request.parent_id, request.parent_code)),
                           inspirations, failures, cfg.edit_format, shown.max_code_chars,
                           tuned=self.domain.tunes_params())

    def _feedback(self, program_id: str, code: str):
        """The parent's search-split feedback: made once when first asked, from its result if it is
        recent, else from the archive's search row (None when it has none)."""
        if program_id in self.feedback:
            return self.feedback[program_id]
        if program_id in self.evaluated:
            result, code = self.evaluated.pop(program_id)
            row = vars(result)
        else:
            row = self.archive.evaluation(program_id, "search")
            row = dict(row, split="search") if row else None
        self.feedback[program_id] = found = from_result(row, code, self.llm.prompt.worst_instances) if row else None
        return found

    # --- outcomes ---------------------------------------------------------------------
    def on_outcome(self, ref, job: LLMJob) -> list[tuple]:
        """What the loop does with a finished job: ('eval', Candidate) or ('invalid', Candidate, EvalResult)."""
        self.in_flight[job.model] -= 1
        self.budget.reserve(*self.reserved.pop(job.child_id), sign=-1)
        try:
            outcome: LLMOutcome = ray.get(ref)
        except RayActorError:
            self.events.append(("llm-worker-lost", {"model": job.model}))
            self.backends[job.model].replace_worker()
            return []
        except RayTaskError as exc:
            self.events.append(("internal-error", {"kind": "llm", "error": str(exc)[-2000:]}))
            return []
        return self._route(outcome)

    def _route(self, outcome: LLMOutcome) -> list[tuple]:
        job, now = outcome.job, time.time()
        self._say_adapted(job.model, outcome.calls)
        candidate = Candidate(job.child_id, job.run_id, job.island, job.generation, (job.parent_id,),
                              outcome.code, outcome.operator, now)
        status, child = outcome.status, job.child_id
        actions: list[tuple] = []
        if status == OK or status in INVALID_KINDS:
            self._answered(job.model)
            self._maybe_cut(job.model, outcome.cut)
        else:
            self._failed(job.model, outcome.reason)
        if status == OK:
            why = self.dedup.check(outcome.code, outcome.form or None)
            if why:
                status, child = "duplicate", None
                self.events.append(("duplicate", {"island": job.island, "operator": outcome.operator, "by": why}))
            else:
                self.dedup.add(outcome.code)
                actions.append(("eval", candidate))
        elif status in INVALID_KINDS:
            actions.append(("invalid", candidate, EvalResult(child, "search", Status.INVALID,
                                                             error=f"{status}: {outcome.reason}"[:2000])))
        else:
            child = None
            self.events.append(("llm-call-failed", {"model": job.model, "status": status, "error": outcome.reason}))
        self._account(outcome, status, child, now)
        return actions

    def _failed(self, model: str, reason: str) -> None:
        """One more call of `model` failed; at LLM_FAILING in a row, say so once (the run keeps asking)."""
        n = self.failing[model] = self.failing.get(model, 0) + 1
        if n >= LLM_FAILING:  # a failing endpoint is not asked hundreds of times a second
            self.paused_until[model] = time.monotonic() + min(LLM_PAUSE_MAX_S, 2.0 ** (n - LLM_FAILING))
        if n != LLM_FAILING:
            return
        url = getattr(self.llm.model(model), "base_url", None)
        self.events.append(("llm-failing", {"model": model, "calls_in_a_row": n, "error": reason}))
        self.notices.append(
            f"atoll: the last {n} calls to model '{model}'{f' at {url}' if url else ''} failed, each after its "
            f"retries ({reason}). The run asks it again after a pause that doubles with each further failure "
            f"(up to {LLM_PAUSE_MAX_S:.0f} s) and says when it answers; check the endpoint, or `atoll stop` "
            "(everything finished is kept).")

    def _maybe_cut(self, model: str, cut: bool) -> None:
        """At LLM_CUT replies of `model` in a row cut off at max_tokens, say once what to change: a
        reasoning model's thinking can take every token, and each such reply gives no child."""
        if self.cut.get(model) == -1:
            return
        n = self.cut[model] = self.cut.get(model, 0) + 1 if cut else 0
        if n < LLM_CUT:
            return
        self.cut[model] = -1
        cfg = self.llm.model(model)
        more = min(cfg.max_tokens * 4, 32768)
        raise_it = f"--set mutator.llm.models.{model}.max_tokens={more}"
        context = getattr(cfg, "context", None)  # a local model's context holds the prompt and the reply
        if context is not None and more >= context // 2:
            raise_it += f" --set mutator.llm.models.{model}.context={max(context * 2, more * 2)}"
        self.events.append(("llm-replies-cut", {"model": model, "replies_in_a_row": n, "max_tokens": cfg.max_tokens}))
        self.notices.append(
            f"atoll: the last {n} replies of model '{model}' were cut off at its max_tokens ({cfg.max_tokens}), "
            "most before they held a whole edit (a reasoning model spends tokens thinking first; a whole program "
            f"takes more than a diff). Give it more: atoll stop, then atoll resume DIR {raise_it}.")

    def _say_adapted(self, model: str, calls) -> None:
        """What a model's client changed in its requests after its endpoint refused a field (OpenAI's
        reasoning models refuse max_tokens and temperatures): an event and a notice, once a change."""
        for change in dict.fromkeys(c for call in calls for c in call.adapted):
            if (model, change) in self.adapted:
                continue
            self.adapted.add((model, change))
            self.events.append(("llm-endpoint-adapted", {"model": model, "change": change}))
            self.notices.append(f"atoll: model '{model}' refused a field of its requests (HTTP 400), and now "
                                f"{change}; the refused attempt counts in llm_calls.attempts.")

    def _answered(self, model: str) -> None:
        n = self.failing.pop(model, 0)
        self.paused_until.pop(model, None)
        if n >= LLM_FAILING:
            self.events.append(("llm-answers-again", {"model": model, "after_failed_calls": n}))
            self.notices.append(f"atoll: model '{model}' answers again, after {n} failed calls.")

    def first_model(self) -> str:
        return self.llm.models[0].name if self.llm else ""

    def ask_text(self, prompt: str, kind: str = "variant") -> str:
        """One plain call (no edit), e.g. for a new prompt variant, to the first model the budget
        allows, accounted like any call; the reply text ('' if it failed or no model had room)."""
        for cfg in self.llm.models if self.llm else ():
            if not self.budget.allows(*self._estimate(cfg, len(prompt))):
                continue
            try:
                call = ray.get(self.backends[cfg.name].worker.complete.remote(_id(), prompt, kind),
                               timeout=cfg.timeout_s * (cfg.max_retries + 1) + 30)
            except (RayActorError, RayTaskError, ray.exceptions.GetTimeoutError) as exc:
                self.events.append(("llm-call-failed", {"model": cfg.name, "status": kind, "error": _last_line(exc)}))
                return ""
            self._account_call(cfg, call, None, None, call.status, time.time())
            return call.completion if call.status == OK else ""
        return ""

    def _account(self, outcome: LLMOutcome, final: str, child: str | None, now: float) -> None:
        job, cfg = outcome.job, self.llm.model(outcome.job.model)
        self.bandit.arm(job.model).edits += 1
        for call in outcome.calls:
            self._account_call(cfg, call, child, job, final, now)

    def _account_call(self, cfg, call, child: str | None, job: LLMJob | None, final: str, now: float) -> None:
        """Spend the call's tokens and money, and queue its llm_calls row (`job` None: no edit asked)."""
        money, gpu_s = _money(cfg, call.tokens_in, call.tokens_out), call.latency_s * cfg.gpus
        tokens = call.tokens_in + call.tokens_out
        self.budget.spend(1, tokens, money)
        self.bandit.arm(cfg.name).cost += call_cost(self.llm.bandit.cost_unit, tokens, money, gpu_s)
        self.parts.update(dict(call.parts))
        self.rows.append({
            "call_id": call.call_id, "run_id": self.run_id, "program_id": child, "model": cfg.name,
            "completion": call.completion, "tokens_in": call.tokens_in, "tokens_out": call.tokens_out,
            "latency_s": call.latency_s, "created_at": now, "island": job.island if job else None,
            "parent_id": job.parent_id if job else None, "kind": call.kind, "status": final if call.kind == "edit" else call.status,
            "error": call.error or ("the same program as one already tried"
                                    if final == "duplicate" and call.kind == "edit" else None),
            "cost": money, "gpu_s": gpu_s, "attempts": call.attempts, "prompt_parts": [p for p, _ in call.parts],
            "completion_truncated": call.truncated, "tokens_estimated": call.estimated,
            "reasoning": call.reasoning or None})

    def on_evaluated(self, candidate: Candidate, result: EvalResult, parent_score: float | None) -> None:
        """A search result: feedback for prompts, failure memory of its parent, the bandit's tally."""
        if result.split != "search":
            return
        if result.status == Status.OK:
            if self.llm:  # most children are never a parent: their feedback is made only if asked for
                self.evaluated[candidate.program_id] = (result, candidate.code)
        elif candidate.parent_ids:
            self.failures[candidate.parent_ids[0]].append((result.status.value, result.error or ""))
        if self.llm and candidate.mutator.startswith(PREFIX) and result.status == Status.OK:
            if parent_score is None or (result.score is not None and result.score > parent_score):
                self.bandit.arm(candidate.mutator.removeprefix(PREFIX)).improvements += 1

    def calls_to_write(self):
        """A function that writes the finished calls and their new prompt parts inside the caller's
        transaction (None when there are none); call `written` once that transaction committed."""
        if not self.rows:
            return None
        rows, parts = list(self.rows), dict(self.parts)
        self._writing = len(rows)
        return lambda: llm_calls.insert_calls(self.archive, rows, parts)

    def written(self) -> None:
        """The calls handed out by `calls_to_write` are committed: forget them."""
        if self._writing:
            del self.rows[:self._writing]
            self.parts, self._writing = {}, 0

    def final_status(self, status: str, evals_left: int) -> str:
        """'llm-budget' when the run ended early because the LLM budget refused every island's source."""
        if status == "completed" and evals_left > 0 and self.llm is not None:
            cfg = self.llm
            if any(not self.budget.allows(*self._estimate(m)) for m in cfg.models):
                return "llm-budget"
        return status


def _money(cfg, tokens_in: int, tokens_out: int) -> float:
    return (tokens_in * cfg.price_in_per_mtok + tokens_out * cfg.price_out_per_mtok) / 1e6


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else type(exc).__name__
