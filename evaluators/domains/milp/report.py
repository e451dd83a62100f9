"""The MILP domain's held-out table: evolved best, Python baselines and SCIP's own rules.

Every row comes from per-run records (instance, SCIP seed, time, nodes, status,
and SCIP default's time and nodes on the same run), so ratios and their
confidence intervals are computed the same way for programs and reference rows.
"""
from __future__ import annotations

import numpy as np

from store.records import EvalResult, Status

COLUMNS = ["policy", "sgm time s", "vs default [95% CI]", "sgm nodes", "wins", "unsolved", "in policy"]
NODE_SHIFT = 10.0
_BOOTSTRAP = 2000


def run_row(run, record, default) -> dict:
    """One run (a `domain.Run`) as plain data: what the table and the archive keep (never the secret shift)."""
    return {"instance": run.label, "scip_seed": run.scip_seed, "time_s": round(record.time_s, 4), "nodes": record.nodes,
            "status": record.status, "solved": record.solved, "calls": record.calls,
            "policy_s": round(record.policy_s, 4), "default_time_s": round(default.time_s, 4),
            "default_nodes": default.nodes}


def _sgm(values, shift: float) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(values, dtype=float) + shift))) - shift)


def ratio_ci(rows: list[dict], shift: float, seed: int = 0) -> tuple[float, float, float]:
    """sgm(time) / sgm(default time) and a 95% bootstrap interval, resampling whole instances."""
    names = list(dict.fromkeys(r["instance"] for r in rows))
    by = {n: [r for r in rows if r["instance"] == n] for n in names}

    def ratio(picked):
        chosen = [r for n in picked for r in by[n]]
        return _sgm([r["time_s"] for r in chosen], shift) / max(_sgm([r["default_time_s"] for r in chosen], shift),
                                                               1e-9)

    point = ratio(names)
    if len(names) < 2:
        return point, float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    draws = [ratio([names[i] for i in rng.integers(len(names), size=len(names))]) for _ in range(_BOOTSTRAP)]
    low, high = np.percentile(draws, [2.5, 97.5])
    return point, float(low), float(high)


def _row(label: str, rows: list[dict], shift: float) -> tuple[str, ...]:
    point, low, high = ratio_ci(rows, shift)
    ci = f" [{low:.3f}, {high:.3f}]" if np.isfinite(low) else " (one instance: no CI)"
    total = sum(r["time_s"] for r in rows)
    share = f"{100 * sum(r['policy_s'] for r in rows) / total:.1f}%" if any(r["calls"] for r in rows) else "-"
    return (label, f"{_sgm([r['time_s'] for r in rows], shift):.3f}", f"{point:.3f}{ci}",
            f"{_sgm([r['nodes'] for r in rows], NODE_SHIFT):.1f}",
            f"{sum(r['time_s'] < r['default_time_s'] for r in rows)}/{len(rows)}",
            str(sum(not r["solved"] for r in rows)), share)


def _failed(label: str, result: EvalResult) -> tuple[str, ...]:
    text = f"{result.status.value}: {result.reason()[:90]}"
    return (label, text) + ("",) * (len(COLUMNS) - 2)


def heldout_table(config, labels: list[str], results: dict[str, EvalResult], reference: dict):
    shift = config.time_shift_s
    rows = []
    for label in sorted(results, key=lambda k: (k != "evolved best", k)):
        result = results[label]
        per_run = (result.metrics or {}).get("per_run")
        rows.append(_row(label, per_run, shift) if result.status == Status.OK and per_run else _failed(label, result))
    for rule, per_run in reference.get("rules", {}).items():
        rows.append(_row(f"reference: {rule}", per_run, shift))
    notes = _notes(config, labels, reference, "evolved best" in results)
    return COLUMNS, rows, notes + head_to_head(results, shift) + same_trees(results)


def paired_ratio_ci(rows: list[dict], other: list[dict], shift: float, key: str = "time_s",
                    seed: int = 0) -> tuple[float, float, float]:
    """sgm(`rows`) / sgm(`other`) over the same runs, with a 95% bootstrap interval over instances.

    Both programs' runs are resampled together, so the interval is that of the comparison itself,
    not of two separate ratios to SCIP default (each over its own re-solve of the default).
    """
    joined = [{"instance": a["instance"], "time_s": a[key], "default_time_s": b[key]}
              for a, b in _same_runs(rows, other)]
    return ratio_ci(joined, shift, seed)


def _same_runs(rows: list[dict], other: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of per-run records of two programs on the same (instance, SCIP seed)."""
    by_run = {(r["instance"], r["scip_seed"]): r for r in other}
    return [(r, by_run[(r["instance"], r["scip_seed"])]) for r in rows if (r["instance"], r["scip_seed"]) in by_run]


def head_to_head(results: dict[str, EvalResult], shift: float) -> list[str]:
    """The evolved best against each other program on the same runs: time and node ratios."""
    best = results.get("evolved best")
    if best is None or best.status != Status.OK or not (best.metrics or {}).get("per_run"):
        return []
    mine, notes = best.metrics["per_run"], []
    for label in sorted(k for k in results if k != "evolved best"):
        theirs = (results[label].metrics or {}).get("per_run")
        if results[label].status != Status.OK or not theirs:
            continue
        t, lo, hi = paired_ratio_ci(mine, theirs, shift)
        n = paired_ratio_ci(mine, theirs, NODE_SHIFT, key="nodes")[0]
        pairs = _same_runs(mine, theirs)
        faster = sum(a["time_s"] < b["time_s"] for a, b in pairs)
        ci = f" [{lo:.3f}, {hi:.3f}]" if np.isfinite(lo) else ""
        verdict = ("faster" if np.isfinite(hi) and hi < 1 else "slower" if np.isfinite(lo) and lo > 1
                   else "not measurably different")
        notes.append(f"evolved best against '{label}' on the same runs: time {t:.3f}x{ci}, nodes {n:.3f}x, "
                     f"faster on {faster}/{len(pairs)} runs: {verdict} (95% bootstrap over instances).")
    return notes


def same_trees(results: dict[str, EvalResult]) -> list[str]:
    """A note for each pair of programs with identical per-run node counts: their time gap is noise."""
    nodes = {label: [r["nodes"] for r in (res.metrics or {}).get("per_run", [])]
             for label, res in results.items() if res.status == Status.OK}
    labels = sorted(nodes, key=lambda k: (k != "evolved best", k))
    pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:] if nodes[a] and nodes[a] == nodes[b]]
    return [f"'{a}' and '{b}' built trees of identical size on every run (almost surely the same decisions): "
            "their difference in time is measurement noise, not a better rule." for a, b in pairs]


def _notes(config, labels: list[str], reference: dict, best: bool) -> list[str]:
    trials = reference.get("trials", {})
    notes = [
        f"Held-out: {len(labels)} " + (f"{config.family} instances of size {config.heldout_size} " if config.instances
                                       is None else f"of your instances in {config.instances.path} ") +
        f"({', '.join(labels)}), never used by the search, x {config.scip_seeds} SCIP seeds; cuts at the root "
        f"only, no restarts, one thread, time limit {config.time_limit_s:g} s (unsolved runs count at the limit).",
        f"sgm time: shifted geometric mean of solve time (shift {config.time_shift_s:g} s), "
        + ("SCIP's CPU clock plus the wait on the program's process" if config.clock == "cpu" else
           "SCIP's wall clock") + f"; sgm nodes: shift "
        f"{NODE_SHIFT:g}. vs default: sgm time over SCIP default's sgm time on the same runs (below 1 is faster than "
        "SCIP's default); the 95% CI is a bootstrap over instances (with few instances it is rough). "
        "wins: runs faster than SCIP default. in policy: share of solve time spent waiting on the program.",
        "Programs (evolved best and the Python baselines) branch through the sandbox: one round trip per "
        "branching decision plus feature gathering in Python; 'in policy' is the part of that overhead spent "
        "waiting on the program's process (channel and its own compute). The reference rows are SCIP's "
        "built-in rules in C without either, so a program's gap to 'reference: scip pscost' at similar node "
        "counts is this overhead.",
        ("Each program row's ratio uses SCIP default re-solved on each run right after the program's run, in "
         "the same evaluator (paired, same load)" if config.heldout_default == "paired" else
         "Each program row's ratio uses SCIP default measured once by the evaluator that scored it")
        + "; reference rows use the default measured once by the evaluator that measured them, so default "
          "times differ a little between rows, and more when the machine's load changes.",
    ]
    if trials and best:
        notes.append(f"The evolved best was selected among {trials.get('count', '?')} search evaluations; the "
                     "held-out instances played no part in that selection.")
    return notes

