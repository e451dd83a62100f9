"""Trading: evolve a position rule over past daily closes, scored walk-forward after costs.

Protocol. The trusted side simulates bar by bar in calendar order: at each
decision bar d it makes ONE policy round trip whose batch holds every live
series (asset x window x tuning trial) with the `lookback` closes up to and
including d; every row of a batch is at the same bar, so no row can show
another row's future. The position decided at the close of d is filled at
the close of d + 1 (next-bar execution) and earns the return of bar d + 2;
each change of position costs `cost_bps` per unit of turnover.

Search split: rolling folds over the search period, each a tune window and
the test window right after it. A program's PARAMS are tuned by optuna on each
fold's tune window (all trials as extra rows of the same pass; objective: the
Sharpe of the equal-weight book of the fold's assets) and that fold's best is
traded on its test window. Score: the annualized Sharpe of the equal-weight
book's concatenated out-of-sample test returns. The final `holdout_bars` are
never simulated by a search evaluation; the held-out split tunes on the window
just before them, then measures them (and also repeats the walk-forward, so
its metrics carry what the Deflated Sharpe Ratio needs).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evaluators.domains.trading import report as trading_report
from evaluators._base import CandidateError, Domain, Outcome, PolicyFn, check_split
from evaluators.params import ParamSpec
from evaluators.registry import register
from evaluators.domains.trading.data import (Market, SyntheticMarket, load_sp500, skfolio_data_dir,
                                     synthetic_market)
from evaluators.domains.trading.programs import MOTIFS, SEED_PROGRAM, baselines
from evaluators.domains.trading.stats import sharpe, summary
from evaluators.tuning import distributions, new_study, sobol_sampler
from store.records import EvalResult, Status


DEFAULT_ASSETS = ("SP500", "JPM", "KO", "MSFT", "XOM")


class TradingConfig(BaseModel):
    """Options of the trading domain (the `[domain.options]` table). Bars are trading days (252 a year)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    market: Literal["sp500", "synthetic"] = Field("sp500", description="'sp500': daily adjusted closes shipped in skfolio (1990-2022); 'synthetic': the generated market of the `synthetic` table.")
    assets: list[str] = Field(default_factory=lambda: list(DEFAULT_ASSETS), min_length=1, description="For market 'sp500': skfolio tickers, and SP500 for the index.")
    synthetic: SyntheticMarket = Field(default_factory=SyntheticMarket, description="The synthetic market, for market 'synthetic'.")
    lookback: int = Field(260, ge=253, le=2000, description="Closes each row of a policy call shows, up to and including the decision bar (>= 253, for 12-month rules).")
    tune_bars: int = Field(756, ge=20, le=20_000, description="Bars of each fold's tune window (756: three years).")
    test_bars: int = Field(504, ge=20, le=20_000, description="Bars of each fold's test window (504: two years); folds step by this much, so PARAMS are re-tuned every test_bars.")
    holdout_bars: int = Field(1008, ge=20, le=20_000, description="Final bars seen only by the held-out split (1008: four years).")
    max_folds: int = Field(0, ge=0, le=1000, description="Keep only the most recent folds (0: every fold that fits after the first lookback).")
    cost_bps: float = Field(5.0, ge=0.0, le=500.0, description="Cost per side in basis points, charged on turnover |change of position|.")
    tune_trials: int = Field(6, ge=1, le=256, description="Optuna trials per tune window, all simulated in the same pass; the first is the PARAMS defaults.")
    tune_seed: int = Field(0, ge=0, description="Seed of the tuning sampler.")


@dataclass(frozen=True)
class Window:
    """Measured bars [start, stop): decisions at closes start - 2 ... stop - 3."""

    start: int
    stop: int


@dataclass(frozen=True)
class Fold:
    tune: Window
    test: Window


def layout(bars: int, cfg: TradingConfig) -> tuple[list[Fold], Fold]:
    """(search folds in time order, the held-out fold) for a series of `bars` closes.

    A test window starts one bar after its tune window ends, so the tuned
    PARAMS depend only on closes up to the test's first decision bar.
    """
    end, first = bars - cfg.holdout_bars, cfg.lookback + 1
    folds, k = [], 0
    while True:
        test = Window(end - (k + 1) * cfg.test_bars, end - k * cfg.test_bars)
        tune = Window(test.start - 1 - cfg.tune_bars, test.start - 1)
        if tune.start < first or (cfg.max_folds and k >= cfg.max_folds):
            break
        folds.append(Fold(tune, test))
        k += 1
    if not folds:
        raise ValueError(f"the market has {bars} bars: too few for lookback {cfg.lookback}, tune_bars "
                         f"{cfg.tune_bars}, test_bars {cfg.test_bars} and holdout_bars {cfg.holdout_bars}")
    return folds[::-1], Fold(Window(end - 1 - cfg.tune_bars, end - 1), Window(end, bars))


@dataclass
class Group:
    """Rows that share one window: `assets` per row, params resolved when the window starts."""

    window: Window
    assets: np.ndarray
    params: Callable[[], dict[str, np.ndarray]]
    done: Callable[["Group"], None] = lambda g: None
    values: dict = field(default_factory=dict)
    decisions: np.ndarray | None = None
    net: np.ndarray | None = None
    moves: np.ndarray | None = None


def check_positions(reply, rows: int, at: str) -> np.ndarray:
    """The policy's reply as (rows,) positions in [-1, 1], or a CandidateError saying what is wrong."""
    try:
        pos = reply if isinstance(reply, np.ndarray) else np.asarray(reply, dtype=float)
    except (ValueError, TypeError):
        _reject(at, "the policy's reply is not an array of numbers")
    if pos.dtype.kind not in "biuf":
        _reject(at, f"positions must be numbers, got dtype {pos.dtype}")
    if pos.shape in ((), (1,)):
        pos = np.full(rows, pos.reshape(()), dtype=float)
    elif pos.shape != (rows,):
        _reject(at, f"positions have shape {pos.shape}; expected ({rows},), one per row of state['close'], or a scalar")
    pos = pos.astype(float)
    if not np.isfinite(pos).all():
        bad = ~np.isfinite(pos)
        _reject(at, f"{int(bad.sum())} of {rows} positions are not finite (e.g. {pos[bad][0]})")
    if rows and np.abs(pos).max() > 1.0:
        if np.abs(pos).max() > 1.0 + 1e-9:
            _reject(at, f"positions must be in [-1, 1], got {pos[np.abs(pos).argmax()]:g}")
        pos = np.clip(pos, -1.0, 1.0)
    return pos


def _reject(at: str, reason: str):
    raise CandidateError(Status.INVALID, f"{at}: {reason}")


class Simulator:
    """Bar-by-bar lockstep over groups of rows, one policy round trip per decision bar."""

    def __init__(self, market: Market, lookback: int, cost_bps: float):
        self.market, self.lookback, self.cost = market, lookback, cost_bps / 1e4
        self.returns = market.returns()
        self._windows = np.lib.stride_tricks.sliding_window_view(market.close, lookback, axis=1)

    def run(self, policy: PolicyFn, groups: list[Group]) -> None:
        """Simulate every group; each gets decisions, net returns and |moves| (rows, bars) and `done`."""
        pending = sorted(groups, key=lambda g: g.window.start, reverse=True)
        live: list[Group] = []
        d, assets = pending[-1].window.start - 2, None
        while pending or live:
            while pending and pending[-1].window.start - 2 == d:
                live.append(pending.pop())
                assets = None
            if live:
                if assets is None:
                    assets = np.concatenate([g.assets for g in live])
                self._step(policy, d, live, assets)
                if any(d == g.window.stop - 3 for g in live):
                    live, assets = [g for g in live if d < g.window.stop - 3], None
            d += 1

    def _step(self, policy: PolicyFn, d: int, live: list[Group], assets: np.ndarray) -> None:
        closes = self._windows[:, d - self.lookback + 1]
        closes = (closes / closes[:, -1:]).astype(np.float32)
        for g in live:
            if g.decisions is None:
                g.values = g.params()
                g.decisions = np.zeros((len(g.assets), g.window.stop - g.window.start))
        previous = np.concatenate([self._previous(g, d) for g in live])
        names = list(live[0].values)
        params = {n: np.concatenate([g.values[n] for g in live]) for n in names}
        reply = policy([({"close": closes[assets], "position": previous}, params)])[0]
        at = f"bar {self.market.dates[d]}"
        positions = check_positions(reply, len(assets), at)
        offset = 0
        for g in live:
            j = d - (g.window.start - 2)
            g.decisions[:, j] = positions[offset:offset + len(g.assets)]
            offset += len(g.assets)
            if d == g.window.stop - 3:
                self._settle(g)
                g.done(g)

    @staticmethod
    def _previous(g: Group, d: int) -> np.ndarray:
        j = d - (g.window.start - 2)
        return g.decisions[:, j - 1] if j > 0 else np.zeros(len(g.assets))

    def _settle(self, g: Group) -> None:
        held = g.decisions  # held over bar start + j
        bars = self.returns[g.assets][:, g.window.start:g.window.stop]
        g.moves = np.abs(np.diff(held, axis=1, prepend=0.0))
        g.net = held * bars - self.cost * g.moves


@dataclass
class FoldResult:
    fold: Fold
    values: dict[str, float]
    group: Group | None = None


class WalkForward:
    """Builds the groups of a pass: tune trials per fold, then the fold's test with its best trial."""

    def __init__(self, config: TradingConfig, n_assets: int):
        self.config, self.n_assets = config, n_assets

    def groups(self, folds: list[Fold], params: dict[str, ParamSpec]) -> tuple[list[Group], list[FoldResult]]:
        results = [FoldResult(f, {n: p.default for n, p in params.items()}) for f in folds]
        groups = []
        for i, res in enumerate(results):
            if params and self.config.tune_trials > 1:
                groups.append(self._tune_group(res, params, i))
            test = Group(res.fold.test, np.arange(self.n_assets), lambda r=res: self._fixed(r.values))
            res.group = test
            groups.append(test)
        return groups, results

    def _fixed(self, values: dict[str, float]) -> dict[str, np.ndarray]:
        return {n: np.full(self.n_assets, float(v)) for n, v in values.items()}

    def _tune_group(self, res: FoldResult, params: dict[str, ParamSpec], index: int) -> Group:
        cfg, a = self.config, self.n_assets
        study = new_study(params, sobol_sampler(cfg.tune_seed * 7919 + index))
        dists = distributions(params)
        trials = [study.ask(dists) for _ in range(cfg.tune_trials)]
        values = {n: np.repeat([t.params[n] for t in trials], a).astype(float) for n in params}

        def done(g: Group) -> None:
            sharpes = [sharpe(g.net[k * a:(k + 1) * a].mean(axis=0)) for k in range(len(trials))]
            for trial, s in zip(trials, sharpes):
                study.tell(trial, -s)
            res.values = dict(trials[int(np.argmax(sharpes))].params)

        return Group(res.fold.tune, np.tile(np.arange(a), len(trials)), lambda: values, done)


@register
class Trading(Domain):
    """Daily position rules on several assets, walk-forward tuned, after costs, next-bar fills."""

    name = "trading"
    config_model = TradingConfig

    def __init__(self, config: TradingConfig):
        self.config = config
        self.market = self._load(config)
        self.simulator = Simulator(self.market, config.lookback, config.cost_bps)
        self.folds, self.holdout = layout(len(self.market.dates), config)
        self.walk_forward = WalkForward(config, len(self.market.names))

    @staticmethod
    def _load(cfg: TradingConfig) -> Market:
        if cfg.market == "synthetic":
            return synthetic_market(cfg.synthetic)
        return load_sp500(tuple(cfg.assets))

    @property
    def seed_program(self) -> str:
        return SEED_PROGRAM

    def baselines(self) -> dict[str, str]:
        return baselines(self.sma_switch_rate())

    def motifs(self) -> list[tuple[str, str, tuple]]:
        return list(MOTIFS)

    def sandbox_hide(self) -> tuple[str, ...]:
        try:
            return (str(skfolio_data_dir()),)
        except FileNotFoundError:
            return ()

    def sma_switch_rate(self) -> float:
        """Share of search-period bars on which SMA 50/200 (long/flat) changes position, over all assets.

        The random-entries baseline flips at this rate, so its expected turnover
        matches the SMA crossover's on the same data. Computed from search bars only.
        """
        close = self.market.close[:, :len(self.market.dates) - self.config.holdout_bars]
        c = np.cumsum(np.concatenate([np.zeros((len(close), 1)), close], axis=1), axis=1)
        fast = (c[:, 200:] - c[:, 150:-50]) / 50
        slow = (c[:, 200:] - c[:, :-200]) / 200
        signal = fast > slow
        return float(np.mean(signal[:, 1:] != signal[:, :-1]))

    # -- scoring ----------------------------------------------------------------------------

    def evaluate(self, policy: PolicyFn, params: dict[str, ParamSpec], split: str) -> Outcome:
        folds = self.folds + ([self.holdout] if check_split(split) == "heldout" else [])
        groups, results = self.walk_forward.groups(folds, params)
        self.simulator.run(policy, groups)
        search = self._measure(results[:len(self.folds)])
        if split == "search":
            return self._outcome(search, params, [r.values for r in results])
        held = self._measure(results[len(self.folds):])
        held["search"] = {k: search[k] for k in ("sharpe", "sharpe_per_bar", "n_returns", "skewness",
                                                 "kurtosis", "trades", "turnover_per_year")}
        held["tuned_on"] = [str(self.market.dates[self.holdout.tune.start]),
                            str(self.market.dates[self.holdout.tune.stop - 1])]
        return self._outcome(held, params, [results[-1].values])

    def _measure(self, results: list[FoldResult]) -> dict:
        net = np.concatenate([r.group.net for r in results], axis=1)
        moves = np.concatenate([r.group.moves for r in results], axis=1)
        held = np.concatenate([r.group.decisions for r in results], axis=1)
        book = net.mean(axis=0)
        metrics = summary(book, held, moves)
        metrics["per_asset"] = {name: sharpe(row) for name, row in zip(self.market.names, net)}
        metrics["windows"] = [self._window_metrics(r) for r in results]
        metrics["period"] = [str(self.market.dates[results[0].fold.test.start]),
                             str(self.market.dates[results[-1].fold.test.stop - 1])]
        if metrics["trades"] == 0:
            metrics["gate"] = "zero trades: the policy never held a position in any test window"
        return metrics

    def _window_metrics(self, r: FoldResult) -> dict:
        book = r.group.net.mean(axis=0)
        return {"test_start": str(self.market.dates[r.fold.test.start]), "return": float(np.prod(1 + book) - 1),
                "sharpe": sharpe(book), "params": {k: float(v) for k, v in r.values.items()}}

    def _outcome(self, metrics: dict, params: dict[str, ParamSpec], values: list[dict]) -> Outcome:
        score = 0.0 if "gate" in metrics else metrics["sharpe"]
        medians = {n: float(np.clip(np.median([v[n] for v in values]), p.low, p.high)) for n, p in params.items()}
        instance = tuple(0.0 if "gate" in metrics else s for s in metrics["per_asset"].values())
        descriptors = (metrics["exposure"], math.log1p(metrics["turnover_per_year"]))
        return Outcome(score=float(score), metrics=metrics, instance_scores=instance,
                       descriptors=descriptors, tuned_params=medians)

    # -- reports ----------------------------------------------------------------------------

    def reference(self, split: str) -> dict:
        fold = self.holdout if check_split(split) == "heldout" else None
        dates = self.market.dates
        out = {"market": self.config.market, "assets": list(self.market.names), "cost_bps": self.config.cost_bps,
               "folds": len(self.folds),
               "search_period": [str(dates[self.folds[0].test.start]), str(dates[self.folds[-1].test.stop - 1])]}
        if fold is not None:
            out["holdout_period"] = [str(dates[fold.test.start]), str(dates[fold.test.stop - 1])]
        return out

    def heldout_table(self, results: dict[str, EvalResult], reference: dict):
        return trading_report.table(results, reference, self.config)

    # -- for LLM prompts ----------------------------------------------------------------------

    def description(self) -> str:
        return ("Daily trading rules: at each bar the policy sets a position in [-1, 1] per asset from past closes "
                "only; it fills at the next close, and turnover pays costs. The score is the annualized Sharpe "
                "ratio of the equal-weight book's walk-forward out-of-sample returns (PARAMS are tuned on each "
                "fold's tuning years). Rules that never trade score 0.")

    def contract(self) -> str:
        return ("Define policy(state, params) -> positions. state['close'] is a float32 array (rows, lookback) of "
                "closes up to the decision bar, divided by that bar's close (the last column is 1); "
                "state['position'] is each row's previous position. params[name] is a (rows,) array per PARAMS "
                "entry. Return one finite position in [-1, 1] per row (or a scalar). Use numpy only.")
