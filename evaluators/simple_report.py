"""Per-instance feedback and the held-out table of a `SimpleDomain`, built from per-instance scores alone.

Every program of a split is scored on the same instances, so two programs'
scores pair up instance by instance: the table compares each program with the
domain's first baseline by the mean of those paired differences.
"""
from __future__ import annotations

import math

import numpy as np

from store.records import EvalResult, Status


def instance_metrics(labels: list[str], scores: np.ndarray) -> dict:
    """The metrics of one evaluation: mean, standard error, worst and best instance, every instance's score."""
    n = len(scores)
    worst, best = int(np.argmin(scores)), int(np.argmax(scores))
    return {"mean_score": float(scores.mean()),
            "se": float(scores.std(ddof=1) / math.sqrt(n)) if n > 1 else None,
            "worst": {"instance": labels[worst], "score": float(scores[worst])},
            "best": {"instance": labels[best], "score": float(scores[best])},
            "instances": {label: float(s) for label, s in zip(labels, scores)}}


def paired_difference(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, float, float]:
    """Mean of a - b over paired instances, its standard error and a two-sided t-test p-value."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if len(diff) < 2:
        return float(diff.mean()), math.nan, math.nan
    se = float(diff.std(ddof=1) / math.sqrt(len(diff)))
    if se == 0:
        return float(diff.mean()), 0.0, 1.0 if diff.mean() == 0 else 0.0
    from scipy import stats  # half a second to import: only the held-out table needs it, not every evaluator

    p = float(2 * stats.t.sf(abs(diff.mean()) / se, len(diff) - 1))
    return float(diff.mean()), se, p


def heldout_table(domain_name: str, baseline_names: list[str], results: dict[str, EvalResult], reference: dict):
    """(columns, rows, notes): every labelled result, and each one paired with the first baseline."""
    ref_label = f"baseline: {baseline_names[0]}" if baseline_names else None
    ref = results.get(ref_label) if ref_label else None
    ref = ref if ref is not None and ref.status == Status.OK else None
    columns = ["policy", "mean score ± SE", "worst instance",
               f"vs {baseline_names[0]} (paired)" if baseline_names else "vs baseline"]
    rows = [_row(label, results[label], ref) for label in _ordered(results)]
    return columns, rows, _notes(domain_name, ref_label, ref, reference, results)


def _ordered(results: dict) -> list[str]:
    return sorted(results, key=lambda label: (label != "evolved best", label))


def _row(label: str, result: EvalResult, ref: EvalResult | None) -> tuple[str, ...]:
    if result.status != Status.OK:
        return label, f"{result.status.value}: {result.reason()[:70]}", "", ""
    m = result.metrics
    se = m.get("se")
    mean = f"{result.score:.4f}" + ("" if se is None else f" ± {se:.4f}")
    worst = m.get("worst", {})
    worst_text = f"{worst['score']:.4f} ({worst['instance']})" if worst else ""
    return label, mean, worst_text, _versus(result, ref)


def _versus(result: EvalResult, ref: EvalResult | None) -> str:
    if ref is None or len(ref.instance_scores) != len(result.instance_scores) or not result.instance_scores:
        return "n/a"
    mean, se, p = paired_difference(result.instance_scores, ref.instance_scores)
    if math.isnan(se):
        return f"{mean:+.4f} (one instance: no SE)"
    return f"{mean:+.4f} ± {se:.4f} (p={p:.2g})"


def _notes(domain_name: str, ref_label: str | None, ref: EvalResult | None, reference: dict,
           results: dict) -> list[str]:
    notes = [f"{domain_name}: {reference.get('instances', '?')} held-out instances, the same for every program. "
             f"Each program's PARAMS were tuned on the search instances ({reference.get('tune_trials', '?')} "
             "trials: its defaults, a Sobol design, then refinement around the best), then measured once "
             "on the held-out instances. Scores: higher is better.",
             "mean score ± standard error over instances; worst instance: the lowest score and its instance."]
    if ref_label is not None:
        notes.append(f"paired: the mean over instances of the program's score minus {ref_label}'s on the "
                     "same instance, ± its standard error and a two-sided t-test p-value"
                     + ("" if ref is not None else f"; n/a: {ref_label} did not score") + ".")
    trials = reference.get("trials")
    if trials and "evolved best" in results:
        notes.append(f"evolved best: the best of {trials.get('count', '?')} programs by search score "
                     "(selection on the search instances only).")
    return notes
