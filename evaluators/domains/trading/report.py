"""The trading domain's held-out table: evolved best vs every baseline, and its Deflated Sharpe."""
from __future__ import annotations

from evaluators.domains.trading import stats as ts
from store.records import EvalResult, Status

COLUMNS = ["policy", "Sharpe±SE", "PSR", "Sortino", "maxDD", "turn/yr", "trades", "return", "WF SR", "DSR"]


def _ordered(results: dict) -> list[str]:
    return sorted(results, key=lambda label: (label != "evolved best", label))


def deflated(result: EvalResult, trials: dict | None) -> tuple[float, float, int] | None:
    """(DSR, SR0 annualized, N) of a held-out result's walk-forward Sharpe, or None without trials.

    The selected Sharpe is the program's walk-forward out-of-sample Sharpe on the
    search split (what the search maximized); SR0 comes from the variance of
    every scored trial's search Sharpe and N counts every evaluated program.
    """
    search = (result.metrics or {}).get("search")
    if not trials or not search or int(trials.get("count", 0)) < 2:
        return None
    trial_sr = [s / ts.ANNUAL for s in trials.get("search_scores", [])]
    dsr, sr0 = ts.deflated_sharpe(search["sharpe_per_bar"], search["n_returns"], search["skewness"],
                                  search["kurtosis"], trial_sr, int(trials["count"]))
    return dsr, sr0 * ts.ANNUAL, int(trials["count"])


def _row(label: str, result: EvalResult, trials: dict | None) -> tuple[str, ...]:
    if result.status != Status.OK:
        text = f"{result.status.value}: {result.reason()[:80]}"
        return (label, text) + ("",) * (len(COLUMNS) - 2)
    m = result.metrics
    se = ts.sharpe_se(m["sharpe_per_bar"], m["n_returns"], m["skewness"], m["kurtosis"]) * ts.ANNUAL
    psr = ts.probabilistic_sharpe(m["sharpe_per_bar"], 0.0, m["n_returns"], m["skewness"], m["kurtosis"])
    sharpe = f"{m['sharpe']:.2f}±{se:.2f}" + (" gated" if "gate" in m else "")
    search = m.get("search", {})
    return (label, sharpe, f"{psr:.2f}", f"{m['sortino']:.2f}", f"{100 * m['max_drawdown']:.0f}%",
            f"{m['turnover_per_year']:.1f}", str(m["trades"]), f"{100 * m['total_return']:+.0f}%",
            f"{search['sharpe']:.2f}" if search else "", _dsr_cell(label, result, trials))


def _dsr_cell(label: str, result: EvalResult, trials: dict | None) -> str:
    if label != "evolved best":
        return "-"
    found = deflated(result, trials)
    if found is None:
        return "n/a"
    dsr, sr0, n = found
    return f"{dsr:.2f} N={n}"


def table(results: dict[str, EvalResult], reference: dict, cfg) -> tuple[list[str], list[tuple[str, ...]], list[str]]:
    trials = reference.get("trials")
    rows = [_row(label, results[label], trials) for label in _ordered(results)]
    return list(COLUMNS), rows, _notes(reference, cfg, trials, results.get("evolved best"))


def _notes(reference: dict, cfg, trials: dict | None, best: EvalResult | None) -> list[str]:
    held, search = reference.get("holdout_period", ["?", "?"]), reference.get("search_period", ["?", "?"])
    notes = [
        f"Market {reference.get('market', cfg.market)}: {', '.join(reference.get('assets', []))}, an equal-weight "
        f"book of one position per asset in [-1, 1], decided on the close, filled at the next close, "
        f"{cfg.cost_bps:g} bps per side on turnover. Held-out period {held[0]} to {held[1]}, never simulated "
        f"by a search evaluation; PARAMS re-tuned ({cfg.tune_trials} optuna trials) on the {cfg.tune_bars} "
        f"bars just before it.",
        "Sharpe±SE: annualized Sharpe of the book's daily held-out returns, ± its standard error under "
        "non-normal returns (Mertens 2002). PSR: probability that the true Sharpe is above 0 (Bailey & "
        "Lopez de Prado 2012). maxDD: largest fall of the compounded book. turn/yr: |position changes| per "
        "asset and year. trades: position changes, all assets. return: compounded over the holdout. "
        "Zero-trade programs are gated to fitness 0.",
        f"WF SR: walk-forward out-of-sample Sharpe on the search period ({search[0]} to {search[1]}, "
        f"{reference.get('folds', '?')} folds of {cfg.tune_bars} tune + {cfg.test_bars} test bars): the search score.",
        "random entries: long/flat with a deterministic hash draw, flipping at the SMA 50/200 crossover's "
        "measured flip rate on the search period, so its expected turnover matches SMA 50/200's.",
    ]
    if trials is None or int(trials.get("count", 0)) < 2:
        notes.append("DSR: not available here (no count of the run's trials; `atoll baselines` has none).")
    else:
        found = deflated(best, trials) if best is not None and best.status == Status.OK else None
        verdict = ("" if found is None else
                   f" The evolved best's DSR is {found[0]:.2f}: "
                   + ("significant at 95%." if found[0] > 0.95 else "not significant at 95%."))
        sr0 = f" (SR0 = {found[1]:.2f})" if found is not None else ""
        notes.append(f"DSR (Bailey & Lopez de Prado 2014): probability that the evolved best's WF SR beats "
                     f"SR0{sr0}, the expected best Sharpe of N = {trials['count']} zero-skill trials "
                     f"with the variance of the run's {len(trials.get('search_scores', []))} scored search "
                     f"Sharpes; N counts every program evaluated, so near-duplicates make it conservative."
                     + verdict)
    return notes
