"""Dense feedback on a program's search-split evaluation, as prompts show it.

Built on the driver from search-split results only (`from_result` refuses any
other split), so held-out figures cannot reach a prompt. Lists and nested
detail are cut down to what a prompt can hold: scalar metrics (not the hashes the
driver adds for its duplicate check), per-instance
scores with their names, the worst instances with their own scalar figures,
the tuned PARAMS values and the failure reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from evaluators.params import ProgramFormatError, read_params

REASON_CHARS = 600  # a failure reason's length in a prompt: its parent's and each recent failure's
BOOKKEEPING = ("form_hash", "proposed_hash")  # metrics the driver adds for its duplicate check, not the domain's
PARAMS_SHOWN = 24  # tuned PARAMS a prompt lists: the code (cut at max_code_chars) holds them all


@dataclass(frozen=True)
class Feedback:
    """What one search evaluation says about a program (picklable, small)."""

    status: str
    score: float | None = None
    error: str = ""
    metrics: tuple[tuple[str, str], ...] = ()  # (name, formatted value)
    instances: tuple[tuple[str, float], ...] = ()  # (instance, score), in the domain's order
    worst: tuple[tuple[str, float, str], ...] = ()  # (instance, score, its own figures)
    params: tuple[tuple[str, str], ...] = ()  # tuned PARAMS: (name, "value in [low, high]"), the first PARAMS_SHOWN
    params_more: int = 0  # how many more PARAMS the program declares than `params` lists


def from_result(result: dict, code: str, worst: int = 3) -> Feedback:
    """Feedback from a search evaluation given as a dict (an archive row or `vars(EvalResult)`)."""
    split = result.get("split", "search")
    if split != "search":
        raise ValueError(f"prompts show search-split results only, not {split!r}")
    status = getattr(result["status"], "value", result["status"])
    metrics = result.get("metrics") or {}
    named = _named_instances(metrics, tuple(result.get("instance_scores") or ()))
    params = _params(code)
    return Feedback(status=status, score=_number(result.get("score")), error=clip_reason(result.get("error") or ""),
                    metrics=tuple((k, _fmt(v)) for k, v in metrics.items() if _scalar(v) and k not in BOOKKEEPING)[:12],
                    instances=tuple(named)[:24], worst=_worst(named, metrics, worst), params=params[:PARAMS_SHOWN],
                    params_more=max(len(params) - PARAMS_SHOWN, 0))


def clip_reason(text: str, limit: int = REASON_CHARS) -> str:
    """A failure reason cut to about `limit` characters for a prompt: its first line (how the
    program failed) and its end (a traceback's last frames and the exception itself), which
    say most; cutting the end off would keep the frames and lose the error."""
    text = text.rstrip()
    if len(text) <= limit:
        return text
    head = text.partition("\n")[0][:limit // 4]
    tail = text[len(text) - (limit - len(head)):]
    if "\n" in tail[:-1]:  # from a whole line
        tail = tail[tail.index("\n") + 1:]
    return f"{head}\n[{len(text) - len(head) - len(tail)} characters cut]\n{tail}"


def _named_instances(metrics: dict, scores: tuple) -> list[tuple[str, float]]:
    details = metrics.get("instances")
    names = list(details) if isinstance(details, dict) and len(details) == len(scores) else \
        [f"instance {i}" for i in range(len(scores))]
    return [(name, float(s)) for name, s in zip(names, scores) if s is not None and math.isfinite(s)]


def _worst(named: list, metrics: dict, k: int) -> tuple:
    details = metrics.get("instances") if isinstance(metrics.get("instances"), dict) else {}
    ranked = sorted(named, key=lambda item: item[1])[:k]
    out = []
    for name, score in ranked:
        own = details.get(name) if isinstance(details.get(name), dict) else {}
        figures = ", ".join(f"{key} {_fmt(v)}" for key, v in own.items() if _scalar(v))
        out.append((name, score, figures))
    return tuple(out)


def _params(code: str) -> tuple[tuple[str, str], ...]:
    try:
        specs = read_params(code)
    except (ProgramFormatError, SyntaxError):
        return ()
    return tuple((s.name, f"{s.default:.6g} in [{s.low:g}, {s.high:g}]") for s in specs.values())


def _scalar(value) -> bool:
    return isinstance(value, (int, float, bool)) or (isinstance(value, str) and len(value) <= 80)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _fmt(value) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.6g}"
