"""The inventory domain's held-out table: costs, the paired comparison with base-stock, the gap to the DP optimum."""
from __future__ import annotations

import math

import numpy as np

from store.records import EvalResult, Status


def heldout_table(config, results: dict[str, EvalResult], reference: dict):
    dp = reference.get("dp_optimum", {})
    columns = ["policy", "mean cost ± SE", "vs optimized base-stock (paired)", "gap to DP optimum"]
    rows = [_table_row(label, results[label], dp) for label in _ordered(results)]
    keys = reference.get("instances") or [s.key for s in config.heldout_instances]
    with_dp = [k for k in keys if k in dp]
    if with_dp:
        rows.append(("DP optimum", f"{np.mean([dp[k] for k in with_dp]):.3f} (exact, {len(with_dp)} inst.)",
                     "", "0.00%"))
    return columns, rows, _notes(config, keys, with_dp, reference)


def _ordered(results: dict) -> list[str]:
    return sorted(results, key=lambda label: (label != "evolved best", label))


def _table_row(label: str, result: EvalResult, dp: dict) -> tuple[str, ...]:
    if result.status != Status.OK:
        return label, f"{result.status.value}: {result.reason()[:70]}", "", ""
    inst = result.metrics.get("instances", {})
    costs = [v["cost"] for v in inst.values()]
    ses = [v["se"] or 0.0 for v in inst.values()]
    mean_cost = f"{np.mean(costs):.3f} ± {math.sqrt(sum(x * x for x in ses)) / len(ses):.3f}"
    return label, mean_cost, _paired(inst.values()), _dp_gap(inst, dp)


def paired_vs_base_stock(instances) -> tuple[float, float, float]:
    """Mean over instances of (cost - base-stock) / base-stock, its SE and two-sided p-value.

    Each instance's difference is paired by trajectory (the same demand), so its
    SE is that of the mean per-trajectory difference.
    """
    ratios, variances = [], []
    for inst in instances:
        a, b = np.asarray(inst["trajectory_costs"]), np.asarray(inst["base_stock_trajectory_costs"])
        diff, scale = a - b, b.mean()
        ratios.append(diff.mean() / scale)
        variances.append(diff.var(ddof=1) / len(diff) / scale ** 2 if len(diff) > 1 else math.nan)
    mean, se = float(np.mean(ratios)), math.sqrt(sum(variances)) / len(ratios)
    # two-sided normal p-value, 2 * sf(|z|) = erfc(|z| / sqrt 2): scipy.stats would cost every command half a second
    p = math.erfc(abs(mean) / se / math.sqrt(2)) if se > 0 else (1.0 if mean == 0 else 0.0)
    return mean, se, p


def _paired(instances) -> str:
    mean, se, p = paired_vs_base_stock(list(instances))
    if math.isnan(se):
        return f"{100 * mean:+.2f}% (one trajectory: no SE)"
    return f"{100 * mean:+.2f}% ± {100 * se:.2f} (p={p:.2g})"


def _dp_gap(instances: dict, dp: dict) -> str:
    gaps = [instances[k]["cost"] / dp[k] - 1 for k in instances if k in dp]
    return f"{100 * np.mean(gaps):+.2f}% ({len(gaps)} inst.)" if gaps else "n/a"


def _notes(cfg, keys, with_dp, reference) -> list[str]:
    without = [k for k in keys if k not in with_dp]
    return [
        f"Held-out instances: {', '.join(keys)}; " + (f"mean demand {cfg.mean_demand:g}" if cfg.demand_history is None
        else f"demand resampled in blocks of {cfg.demand_history.block} from the latest "
             f"{cfg.demand_history.heldout_share:.0%} of {cfg.demand_history.path} (tuning on the periods before)")
        + f", holding {cfg.holding:g}. "
        f"Each program is re-tuned on every instance's own tuning trajectories ({cfg.search_trajectories} x {cfg.search_periods} periods, {cfg.heldout_trials} optuna trials), "
        f"then measured on {cfg.heldout_trajectories} fresh trajectories of {cfg.heldout_periods} periods "
        f"after {cfg.warmup} warm-up periods, with the same demand for every policy.",
        "mean cost: the mean over instances of the per-period cost; ± is its standard error over trajectories.",
        "vs optimized base-stock: mean over instances of the paired per-trajectory cost difference to "
        "base-stock whose level S the trusted side searched over all integers on the same tuning data; "
        "negative is better; ± SE and a two-sided normal p-value.",
        f"gap to DP optimum: simulated cost over the exact average-cost optimum (relative value iteration), "
        f"on the instances with lead time <= {reference.get('dp_max_lead', cfg.dp_max_lead)}"
        + (f"; no DP for {', '.join(without)}" if without else "")
        + (" (the DP needs a demand distribution; a demand history gives none)" if cfg.demand_history else "")
        + ". The simulated cost is an estimate, so a gap can be slightly negative; the DP row's mean is "
          "over those instances only.",
    ]
