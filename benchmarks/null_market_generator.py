"""Is the null market null? Fixed rules on many fresh null markets, with the domain's own timing.

    python3 benchmarks/null_market_generator.py [--markets 200]

Each market is the trading domain's synthetic market of `configs/trading_null.toml`
(zero edge, zero drift), drawn from replay seed `--first-seed` + k. For every rule
(long, short, volatility-timed long, long only in calm or turbulent spells, SMA
50/200, 12-month momentum long/short, contrarian and trend on 20 bars) the position
decided on the close of bar d earns the return of bar d + 2, as in the domain, and
pays `cost_bps` per unit of turnover. Printed per rule:

- the mean annualized gross return of the equal-weight book over the whole series
  (every bar after the first year), with its standard error over markets: zero if the
  market's simple returns are unpredictable, whatever the rule times;
- over the holdout (the last `holdout_bars`) after costs: the mean and standard
  deviation of the annualized Sharpe ratio over markets, the share of markets whose
  PSR (as the held-out table computes it) exceeds 0.95, and a Kolmogorov-Smirnov test
  of the PSRs against uniform; the same two figures for the gross book. A fixed rule's
  PSR on fresh null data is about uniform before costs (below it after costs, which make
  an active rule's true Sharpe negative).
"""
from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

from evaluators.domains.trading import stats as ts  # noqa: E402
from evaluators.registry import get_domain  # noqa: E402
from evaluators.secrets import RunSecrets  # noqa: E402


def _mean(x: np.ndarray, w: int) -> np.ndarray:
    """Trailing mean over `w` bars (NaN before there are `w`)."""
    c = np.cumsum(np.concatenate([np.zeros((len(x), 1)), x], axis=1), axis=1)
    out = np.full(x.shape, np.nan)
    out[:, w - 1:] = (c[:, w:] - c[:, :-w]) / w
    return out


def rules(close: np.ndarray, r: np.ndarray) -> dict[str, np.ndarray]:
    """Each rule's position decided on the close of every bar (NaN-free, in [-1, 1])."""
    vol = np.sqrt(_mean(r ** 2, 20))
    calm = vol < 0.0125  # daily: between the calm (0.9%) and turbulent (2.2%) regimes' levels
    back = lambda w: np.concatenate([np.full((len(close), w), np.nan), close[:, w:] / close[:, :-w] - 1], axis=1)
    out = {"long": np.ones_like(close), "short": -np.ones_like(close),
           "vol-timed long": np.clip(0.006 / vol, 0, 1), "calm-only long": calm * 1.0,
           "turbulent-only long": (~calm) * 1.0, "SMA 50/200": (_mean(close, 50) > _mean(close, 200)) * 1.0,
           "12m momentum L/S": np.sign(back(252)), "trend 20d": np.sign(back(20)),
           "contrarian 20d": -np.sign(back(20))}
    return {k: np.nan_to_num(v) for k, v in out.items()}


def _psr(book: np.ndarray) -> float:
    m = ts.moments(book)
    return ts.probabilistic_sharpe(m["sharpe_per_bar"], 0.0, m["n_returns"], m["skewness"], m["kurtosis"])


def measure(close: np.ndarray, holdout: int, cost: float) -> dict[str, tuple[float, ...]]:
    """Per rule: (whole-series gross annual return, holdout net Sharpe, its PSR, the gross book's PSR)."""
    r = np.zeros_like(close)
    r[:, 1:] = close[:, 1:] / close[:, :-1] - 1.0
    out = {}
    for name, decided in rules(close, r).items():
        held = np.zeros_like(decided)
        held[:, 2:] = decided[:, :-2]  # decided on the close of d, filled at d + 1, earns bar d + 2
        gross = (held * r).mean(axis=0)
        net = (held * r - cost * np.abs(np.diff(held, axis=1, prepend=0.0))).mean(axis=0)[-holdout:]
        out[name] = (float(gross[252:].mean() * ts.BARS_PER_YEAR), ts.sharpe(net), _psr(net), _psr(gross[-holdout:]))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/trading_null.toml")
    parser.add_argument("--markets", type=int, default=200)
    parser.add_argument("--first-seed", type=int, default=5000, help="replay seed of the first market")
    args = parser.parse_args(argv)
    options = tomllib.loads(Path(args.config).read_text())["domain"]["options"]
    results: dict[str, list] = {}
    for k in range(args.markets):
        domain = get_domain("trading", secrets=RunSecrets.fixed(args.first_seed + k), **options)
        cfg = domain.config
        for name, figures in measure(domain.market.close, cfg.holdout_bars, cfg.cost_bps / 1e4).items():
            results.setdefault(name, []).append(figures)
    n = args.markets
    print(f"{n} null markets of {args.config} ({cfg.synthetic.assets} assets, {cfg.synthetic.bars} bars; "
          f"holdout {cfg.holdout_bars} bars, {cfg.cost_bps:g} bps per side)")
    print(f"{'rule':20s} {'whole-series gross %/yr':>24s} {'holdout net SR mean':>20s} {'SR sd':>6s} "
          f"{'PSR>0.95':>9s} {'KS p':>6s} {'gross: PSR>0.95':>16s} {'KS p':>6s}")
    for name, rows in results.items():
        ret, sr, psr, gross = (np.array(col) for col in zip(*rows))
        print(f"{name:20s} {100 * ret.mean():+11.3f} ± {100 * ret.std(ddof=1) / np.sqrt(n):.3f}      "
              f"{sr.mean():+12.3f} ± {sr.std(ddof=1) / np.sqrt(n):.3f} {sr.std(ddof=1):6.3f} "
              f"{np.mean(psr > 0.95):9.3f} {stats.kstest(psr, 'uniform').pvalue:6.3f} "
              f"{np.mean(gross > 0.95):16.3f} {stats.kstest(gross, 'uniform').pvalue:6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
