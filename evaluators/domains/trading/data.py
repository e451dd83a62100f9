"""Daily closes for the trading domain: real S&P 500 data shipped in skfolio, or a synthetic market.

The real data are the gzip'd CSV files of the skfolio package (BSD-3-Clause),
read directly with gzip/csv/numpy: skfolio itself is never imported (it pulls
in pandas and scikit-learn). The synthetic market is a regime-switching
GARCH(1,1) with jumps and an optional planted edge; with `edge = 0` and
`drift = 0` it is a null market where nothing can be earned on average: its
simple returns are a martingale difference sequence (each bar's mean is zero
given everything before it), so the book of any positions decided on past bars
earns zero in expectation, before costs.

A synthetic market is drawn from two seeds that the trading domain derives
from the run's secrets: one for the bars before its final `tail_bars` (the
search period) and one for those (the holdout), so knowing one part's stream
tells nothing about the other.
"""
from __future__ import annotations

import csv
import functools
import gzip
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

BARS_PER_YEAR = 252
INDEX_NAME = "SP500"
_STOCKS_FILE, _INDEX_FILE = "sp500_dataset.csv.gz", "sp500_index.csv.gz"


@dataclass(frozen=True)
class Market:
    """Aligned daily closes of several assets: `close[asset, bar]`, strictly positive."""

    names: tuple[str, ...]
    dates: np.ndarray  # (bars,) datetime64[D]
    close: np.ndarray  # (assets, bars) float64

    def returns(self) -> np.ndarray:
        """Simple returns, `r[:, t] = close[:, t] / close[:, t - 1] - 1`; r[:, 0] is 0."""
        r = np.zeros_like(self.close)
        r[:, 1:] = self.close[:, 1:] / self.close[:, :-1] - 1.0
        return r


def skfolio_data_dir() -> Path:
    """The directory of skfolio's bundled data, found without importing skfolio."""
    spec = importlib.util.find_spec("skfolio")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the trading domain's real data ships in the skfolio package: "
                                "pip install 'skfolio>=1.12' (or use market = \"synthetic\")")
    return Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data"


def read_price_csv(path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(column names, dates, values[bar, column]) of one of skfolio's price files."""
    with gzip.open(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], [r for r in rows[1:] if r]
    dates = np.array([r[0] for r in body], dtype="datetime64[D]")
    values = np.array([[float(v) if v else np.nan for v in r[1:]] for r in body])
    return header[1:], dates, values


@functools.lru_cache(maxsize=4)
def load_sp500(assets: tuple[str, ...]) -> Market:
    """The chosen S&P 500 constituents (and `SP500`, the index) on their common dates."""
    folder = skfolio_data_dir()
    names, dates, values = read_price_csv(folder / _STOCKS_FILE)
    columns = dict(zip(names, values.T))
    if INDEX_NAME in assets:
        index_names, index_dates, index_values = read_price_csv(folder / _INDEX_FILE)
        if not np.array_equal(index_dates, dates):
            raise ValueError("skfolio's index and constituent files have different dates")
        columns[INDEX_NAME] = index_values[:, 0]
    unknown = [a for a in assets if a not in columns]
    if unknown:
        raise ValueError(f"unknown assets {unknown}; the skfolio data has {sorted(columns)}")
    close = np.array([columns[a] for a in assets])
    keep = np.isfinite(close).all(axis=0) & (close > 0).all(axis=0)
    return Market(tuple(assets), dates[keep], close[:, keep])


class SyntheticMarket(BaseModel):
    """A regime-switching GARCH(1,1) market with jumps (the `[domain.options.synthetic]` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    assets: int = Field(6, ge=1, le=100, description="Number of synthetic assets.")
    bars: int = Field(33 * BARS_PER_YEAR, ge=300, le=200_000, description="Daily bars per asset (252 a year). The prices themselves are drawn from the run's secrets: each run meets its own market.")
    edge: float = Field(0.0, ge=0.0, le=1.0, description="Planted edge: the next bar's mean is edge x its volatility x tanh(the standardized 20-bar past return). 0: no predictability.")
    drift: float = Field(0.0, ge=-0.5, le=0.5, description="Annual mean return outside the edge (0 for a null market, where buy & hold earns nothing on average).")
    correlation: float = Field(0.3, ge=0.0, lt=1.0, description="Correlation of shocks across assets (one common factor).")


# Regimes (calm, turbulent): annual volatility, the chance per bar of leaving the regime.
_REGIME_VOL = np.array([0.14, 0.35])
_REGIME_LEAVE = np.array([0.005, 0.03])
_GARCH_ALPHA, _GARCH_BETA = 0.08, 0.90
_JUMP_RATE, _JUMP_SCALE = 0.004, 0.04  # per bar; jump sizes ~ N(0, scale), mean zero
_EDGE_WINDOW = 20


@functools.lru_cache(maxsize=8)
def synthetic_market(spec: SyntheticMarket, head_seed: int, tail_seed: int, tail_bars: int) -> Market:
    """Prices of `spec`, starting at 100, on business days from 1990.

    The random inputs of the first `bars - tail_bars` bars come from `head_seed`,
    those of the last `tail_bars` from `tail_seed`; the regime chain and the
    GARCH variance run on across the seam. Deterministic in its arguments.
    """
    a, n = spec.assets, spec.bars
    head, tail = n - tail_bars, tail_bars
    parts = [_inputs(np.random.default_rng(np.random.SeedSequence(seed)), a, bars, spec.correlation)
             for seed, bars in ((head_seed, head), (tail_seed, tail))]
    u, shocks, jumps = (np.concatenate([p[i] for p in parts], axis=-1) for i in range(3))
    r = _garch_returns(_regimes(u), shocks, jumps, spec)
    close = 100.0 * np.cumprod(1.0 + r, axis=1)
    dates = np.busday_offset(np.datetime64("1990-01-02"), np.arange(n), roll="forward")
    return Market(tuple(f"SYN{i}" for i in range(a)), dates, close)


def _inputs(rng, a: int, n: int, rho: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The independent per-bar random inputs of `n` bars: regime uniforms, shocks, jumps."""
    u = rng.random(n)
    shocks = _shocks(rng, a, n, rho)
    jumps = (rng.random((a, n)) < _JUMP_RATE) * rng.normal(0.0, _JUMP_SCALE, (a, n))
    return u, shocks, jumps


def _regimes(u: np.ndarray) -> np.ndarray:
    """A two-state Markov chain shared by all assets (a market-wide regime), driven by uniforms `u`."""
    n = len(u)
    state, out = 0, np.empty(n, np.int64)
    for t in range(n):
        if u[t] < _REGIME_LEAVE[state]:
            state = 1 - state
        out[t] = state
    return out


def _shocks(rng, a: int, n: int, rho: float) -> np.ndarray:
    common = rng.standard_normal(n)
    return np.sqrt(rho) * common + np.sqrt(1.0 - rho) * rng.standard_normal((a, n))


def _garch_returns(regime, shocks, jumps, spec: SyntheticMarket) -> np.ndarray:
    """GARCH(1,1) variance toward the regime's level, plus the planted edge and jumps.

    The edge term uses only returns up to bar t - 1 to set bar t's mean, so a
    policy that sees bars up to d and is filled at d + 1 can still use it
    (the 20-bar feature barely moves in one bar).
    """
    a, n = shocks.shape
    target = (_REGIME_VOL / np.sqrt(BARS_PER_YEAR)) ** 2  # per-bar variance of each regime
    omega = target * (1.0 - _GARCH_ALPHA - _GARCH_BETA)
    base_sd = float(_REGIME_VOL[0] / np.sqrt(BARS_PER_YEAR))
    var, r = np.full(a, target[0]), np.zeros((a, n))
    window = np.zeros((a, _EDGE_WINDOW))
    drift = spec.drift / BARS_PER_YEAR
    for t in range(n):
        sd = np.sqrt(var)
        feature = np.tanh(window.sum(axis=1) / (base_sd * np.sqrt(_EDGE_WINDOW)))
        r[:, t] = drift + spec.edge * sd * feature + sd * shocks[:, t] + jumps[:, t]
        window[:, t % _EDGE_WINDOW] = r[:, t]
        var = omega[regime[t]] + _GARCH_ALPHA * (sd * shocks[:, t]) ** 2 + _GARCH_BETA * var
    return np.maximum(r, -0.9)


def edge_feature(close: np.ndarray) -> np.ndarray:
    """The planted edge's feature at every bar (NaN for the first bars): for tests and reports."""
    r = np.zeros_like(close)
    r[:, 1:] = close[:, 1:] / close[:, :-1] - 1.0
    out = np.full_like(close, np.nan)
    c = np.cumsum(r, axis=1)
    out[:, _EDGE_WINDOW:] = c[:, _EDGE_WINDOW:] - c[:, :-_EDGE_WINDOW]
    return out
