"""Performance statistics of a daily return series, and the Deflated Sharpe Ratio.

Sharpe ratios here are annualized with 252 bars a year unless a name says
`per_bar`. The Probabilistic and Deflated Sharpe Ratios follow Bailey and
Lopez de Prado (2012, "The Sharpe ratio efficient frontier"; 2014, "The
Deflated Sharpe Ratio: correcting for selection bias, backtest overfitting and
non-normality"), with the non-normality correction of Mertens (2002).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from evaluators.domains.trading.data import BARS_PER_YEAR

EULER_GAMMA = 0.5772156649015329
ANNUAL = math.sqrt(BARS_PER_YEAR)


def sharpe(returns: np.ndarray) -> float:
    """Annualized Sharpe ratio (zero risk-free rate); 0 for a series without variance."""
    sd = float(np.std(returns, ddof=1)) if len(returns) > 1 else 0.0
    return float(np.mean(returns)) / sd * ANNUAL if sd > 1e-15 else 0.0


def sortino(returns: np.ndarray) -> float:
    """Annualized Sortino ratio: mean over the root mean square of the losses."""
    downside = math.sqrt(float(np.mean(np.minimum(returns, 0.0) ** 2))) if len(returns) else 0.0
    return float(np.mean(returns)) / downside * ANNUAL if downside > 1e-15 else 0.0


def max_drawdown(returns: np.ndarray) -> float:
    """Largest fall of the compounded equity curve from a previous peak (a negative fraction)."""
    equity = np.cumprod(1.0 + np.asarray(returns))
    peak = np.maximum.accumulate(np.concatenate([[1.0], equity]))[1:]
    return float(np.min(equity / peak - 1.0)) if len(equity) else 0.0


def moments(returns: np.ndarray) -> dict:
    """What the PSR and DSR need: per-bar Sharpe, number of returns, skewness, (non-excess) kurtosis."""
    n = len(returns)
    flat = n < 3 or float(np.std(returns)) <= 1e-15
    return {"sharpe_per_bar": sharpe(returns) / ANNUAL, "n_returns": n,
            "skewness": 0.0 if flat else float(stats.skew(returns)),
            "kurtosis": 3.0 if flat else float(stats.kurtosis(returns, fisher=False))}


def sharpe_se(sr_per_bar: float, n: int, skewness: float, kurtosis: float) -> float:
    """Standard error of a per-bar Sharpe estimate under non-normal returns (Mertens 2002)."""
    if n < 2:
        return math.nan
    return math.sqrt(max(1.0 - skewness * sr_per_bar + (kurtosis - 1.0) / 4.0 * sr_per_bar ** 2, 1e-12)
                     / (n - 1))


def probabilistic_sharpe(sr_per_bar: float, benchmark_per_bar: float, n: int,
                         skewness: float, kurtosis: float) -> float:
    """P(true Sharpe > benchmark) given the observed per-bar Sharpe of n returns (PSR)."""
    se = sharpe_se(sr_per_bar, n, skewness, kurtosis)
    return float(stats.norm.cdf((sr_per_bar - benchmark_per_bar) / se)) if se == se else math.nan


def expected_max_sharpe(trial_variance: float, n_trials: int) -> float:
    """Expected largest of `n_trials` Sharpe estimates whose true value is zero (the DSR's SR0).

    Same units as `trial_variance` (its square root): (1 - g) Z(1 - 1/N) + g Z(1 - 1/(N e)).
    """
    if n_trials < 2:
        return 0.0
    z = stats.norm.ppf
    return math.sqrt(max(trial_variance, 0.0)) * ((1.0 - EULER_GAMMA) * z(1.0 - 1.0 / n_trials)
                                                  + EULER_GAMMA * z(1.0 - 1.0 / (n_trials * math.e)))


def deflated_sharpe(sr_per_bar: float, n: int, skewness: float, kurtosis: float,
                    trial_sharpes_per_bar, n_trials: int) -> tuple[float, float]:
    """(DSR, SR0 per bar): the PSR of the selected Sharpe against the expected best of N null trials.

    `trial_sharpes_per_bar` are the Sharpe ratios of the trials (their variance
    sets SR0); `n_trials` counts every trial, also those without a Sharpe.
    """
    trials = np.asarray(list(trial_sharpes_per_bar), dtype=float)
    variance = float(np.var(trials, ddof=1)) if len(trials) > 1 else 0.0
    sr0 = expected_max_sharpe(variance, n_trials)
    return probabilistic_sharpe(sr_per_bar, sr0, n, skewness, kurtosis), sr0


def summary(book: np.ndarray, positions: np.ndarray, moves: np.ndarray) -> dict:
    """Dense metrics of a book's daily returns, its assets' positions and |position changes| (assets, bars).

    Turnover is per asset and year (1.0: one full entry or exit a year).
    """
    years = max(book.size / BARS_PER_YEAR, 1e-9)
    rows = max(len(positions), 1)
    return {"sharpe": sharpe(book), "sortino": sortino(book), "max_drawdown": max_drawdown(book),
            "total_return": float(np.prod(1.0 + book) - 1.0),
            "annual_return": float(np.prod(1.0 + book) ** (1.0 / years) - 1.0),
            "volatility": float(np.std(book) * ANNUAL),
            "turnover_per_year": float(moves.sum() / rows / years),
            "trades": int((moves > 1e-12).sum()),
            "exposure": float(np.abs(positions).mean()) if positions.size else 0.0,
            **moments(book)}
