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
its metrics carry what the Deflated Sharpe Ratio needs). The validation split
walks the same folds over another market's search period (other assets, or an
independent draw of the synthetic market), scored like the search split.
"""
from __future__ import annotations

import functools
import math
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from evaluators.domains.trading import report as trading_report
from evaluators._base import Domain, Outcome, PolicyFn, check_split
from evaluators.params import ParamSpec
from evaluators.domains.trading.data import (Market, SyntheticMarket, load_sp500, skfolio_data_dir,
                                     synthetic_market)
from evaluators.domains.trading.programs import MOTIFS, SEED_PROGRAM, baselines
from evaluators.domains.trading.simulate import Fold, FoldResult, Simulator, WalkForward, layout
from evaluators.domains.trading.stats import sharpe, summary
from evaluators.domains.trading.user_prices import PriceHistory, resampled, user_market
from evaluators.userdata import distinct, hidden
from store.records import EvalResult


DEFAULT_ASSETS = ("SP500", "JPM", "KO", "MSFT", "XOM")
DEFAULT_VALIDATION_ASSETS = ("JNJ", "PG", "HD")


class TradingConfig(BaseModel):
    """Options of the trading domain (the `[domain.options]` table). Bars are trading days (252 a year)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    market: Literal["sp500", "synthetic", "file"] = Field("sp500", description="'sp500': daily adjusted closes shipped in skfolio (1990-2022); 'synthetic': the generated market of the `synthetic` table; 'file': your own price history (the `prices` option).")
    prices: PriceHistory | None = Field(None, description="For market 'file': your daily closes, a CSV or Parquet file (wide: a date column and one column per asset; long: date, asset and price columns), relative to the config.")
    assets: Annotated[list[str], AfterValidator(distinct)] = Field(default_factory=lambda: list(DEFAULT_ASSETS), min_length=1, description="For market 'sp500': skfolio tickers, and SP500 for the index. For market 'file': assets of the file (default: every asset not in validation_assets).")
    validation_assets: Annotated[list[str], AfterValidator(distinct)] = Field(default_factory=lambda: list(DEFAULT_VALIDATION_ASSETS), min_length=1, description="For market 'sp500': the validation split's tickers, walked forward over the search period like the search split (public data: other assets, not other randomness). The synthetic market's validation split is an independent draw of the same market from the run's validation secret. For market 'file': assets of the file if given; if not, the validation split trades the search assets' search-period returns reshuffled in blocks of 20 bars, each bar once (from the run's validation secret).")
    synthetic: SyntheticMarket = Field(default_factory=SyntheticMarket, description="The synthetic market, for market 'synthetic'.")
    lookback: int = Field(260, ge=253, le=2000, description="Closes each row of a policy call shows, up to and including the decision bar (>= 253, for 12-month rules).")
    tune_bars: int = Field(756, ge=20, le=20_000, description="Bars of each fold's tune window (756: three years).")
    test_bars: int = Field(504, ge=20, le=20_000, description="Bars of each fold's test window (504: two years); folds step by this much, so PARAMS are re-tuned every test_bars.")
    holdout_bars: int = Field(1008, ge=20, le=20_000, description="Final bars seen only by the held-out split (1008: four years).")
    max_folds: int = Field(0, ge=0, le=1000, description="Keep only the most recent folds (0: every fold that fits after the first lookback).")
    cost_bps: float = Field(5.0, ge=0.0, le=500.0, description="Cost per side in basis points, charged on turnover |change of position|.")
    tune_trials: int = Field(6, ge=1, le=256, description="Optuna trials per tune window, all simulated in the same pass; the first is the PARAMS defaults (the Sobol design's seed comes from the run's secret).")

    @model_validator(mode="after")
    def _prices_for_a_file_market(self):
        if (self.market == "file") != (self.prices is not None):
            raise ValueError("market 'file' and the prices option go together: give both, or neither")
        return self

    def file_assets(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """For market 'file': (search assets, validation assets; empty: a resample of the search period)."""
        from evaluators.domains.trading.user_prices import load_prices

        validation = tuple(self.validation_assets) if "validation_assets" in self.model_fields_set else ()
        if "assets" in self.model_fields_set:
            return tuple(self.assets), validation
        return tuple(n for n in load_prices(self.prices)[0] if n not in validation), validation

    @model_validator(mode="after")
    def _validation_assets_apart(self):
        shared = sorted(set(self.assets) & set(self.validation_assets))
        if self.market == "file":
            search, validation = self.file_assets()
            shared = sorted(set(search) & set(validation))
            if not search:
                raise ValueError(f"{self.prices.path} has no asset left for the search split once "
                                 f"validation_assets are set aside")
        if self.market in ("sp500", "file") and shared:
            raise ValueError(f"validation_assets {shared} are also search assets; choose others")
        return self

    @field_validator("assets", "validation_assets")
    @classmethod
    def _assets_exist(cls, assets: list[str], info: ValidationInfo) -> list[str]:
        """An unknown ticker (of either split) is refused when the config is loaded, not in an evaluator."""
        if info.data.get("market", "sp500") == "sp500":
            try:
                load_sp500(tuple(assets))
            except FileNotFoundError as exc:
                raise ValueError(str(exc)) from None
        return assets

    @model_validator(mode="after")
    def _folds_fit(self):
        """The market must hold the holdout and at least one walk-forward fold."""
        if self.market == "file":
            search, validation = self.file_assets()
            bars = len(user_market(self.prices, search + validation).dates)
            try:
                layout(bars, self)
            except ValueError as exc:
                raise ValueError(f"{self.prices.path}: {exc} (the rows on which every chosen asset has a price; "
                                 "shorten those windows or give a longer history)") from None
            return self
        bars = self.synthetic.bars if self.market == "synthetic" else len(load_sp500(tuple(self.assets)).dates)
        layout(bars, self)
        return self


class Trading(Domain):
    """Daily position rules on several assets, walk-forward tuned, after costs, next-bar fills."""

    name = "trading"
    config_model = TradingConfig
    descriptor_names = ("exposure", "log(1 + turnover per year)")

    def __init__(self, config: TradingConfig):
        self.config = config
        self._markets: dict[str, Market] = {}
        self._simulators: dict[str, Simulator] = {}

    # -- data -------------------------------------------------------------------------------
    # Search and held-out splits trade one market: its search period, then its holdout. The
    # validation split walks the same folds over the search period of another market: other
    # assets of the real data, or an independent draw of the synthetic one. Synthetic prices
    # derive from the run's secrets (the holdout's bars from the held-out secret); the real
    # history is public, and what protects its holdout is that no candidate reads the files
    # or ever receives a held-out bar.

    @staticmethod
    def _which(split: str) -> str:
        """The market `split` trades: 'validation' for the validation split, else 'main'."""
        return "validation" if check_split(split) == "validation" else "main"

    def market_of(self, split: str) -> Market:
        which = self._which(split)
        if which not in self._markets:
            self._markets[which] = self._load(which)
        return self._markets[which]

    @property
    def market(self) -> Market:
        """The market of the search and held-out splits."""
        return self.market_of("search")

    def _load(self, which: str) -> Market:
        cfg = self.config
        if cfg.market == "synthetic":
            tail = min(cfg.holdout_bars, cfg.synthetic.bars)
            head_split, tail_split = ("validation", "validation") if which == "validation" else ("search", "heldout")
            return synthetic_market(cfg.synthetic, self.secrets.seed(head_split, "market", "head", bits=128),
                                    self.secrets.seed(tail_split, "market", "tail", bits=128), tail)
        if cfg.market == "file":
            return self._load_file(which)
        both = load_sp500(tuple(dict.fromkeys(cfg.assets + cfg.validation_assets)))  # aligned on common dates
        names = cfg.validation_assets if which == "validation" else cfg.assets
        return Market(tuple(names), both.dates, both.close[[both.names.index(n) for n in names]])

    def _load_file(self, which: str) -> Market:
        """The user's file: its search assets, and its validation assets or a resample of the search period."""
        search, validation = self.config.file_assets()
        both = user_market(self.config.prices, search + validation)  # aligned on common dates
        if which == "main" or validation:
            names = validation if which == "validation" else search
            return Market(names, both.dates, both.close[[both.names.index(n) for n in names]])
        main = self.market_of("search")
        return resampled(main, self.config.holdout_bars, self.secrets.generator("validation", "market", "resample"))

    def simulator(self, split: str) -> Simulator:
        """The simulator of `split`'s market, kept per market, not per asset names: the synthetic
        market's validation draw has the same names as the search market's."""
        which = self._which(split)
        if which not in self._simulators:
            self._simulators[which] = Simulator(self.market_of(split), self.config.lookback, self.config.cost_bps)
        return self._simulators[which]

    @functools.cached_property
    def _layout(self) -> tuple[list[Fold], Fold]:
        return layout(len(self.market.dates), self.config)

    @property
    def folds(self) -> list[Fold]:
        return self._layout[0]

    @property
    def holdout(self) -> Fold:
        return self._layout[1]

    def walk_forward(self, split: str) -> WalkForward:
        """The split's walk-forward; each fold's sampler seed comes from the secret of the data it tunes on."""
        n_search = len(self.folds)

        def sampler_seed(index: int) -> int:
            secret = split if split == "validation" else "search" if index < n_search else "heldout"
            return self.secrets.seed(secret, "tuner", index, bits=32)

        return WalkForward(self.config, len(self.market_of(split).names), sampler_seed)

    @property
    def seed_program(self) -> str:
        return SEED_PROGRAM

    def baselines(self) -> dict[str, str]:
        return baselines(self.sma_switch_rate())

    def tunes_params(self) -> bool:
        return self.config.tune_trials > 1  # the first trial is the written defaults

    def motifs(self) -> list[tuple[str, str, tuple]]:
        return list(MOTIFS)

    def output_bounds(self) -> tuple[float | None, float | None]:
        return -1.0, 1.0  # positions: check_positions refuses any outside [-1, 1]

    def public_data(self) -> str:
        if self.config.market == "synthetic":
            return ""
        what = f"your price file {self.config.prices.path}" if self.config.prices else "skfolio's S&P 500 files"
        return (f"the market is real price history ({what}), hidden from the sandbox; no search evaluation "
                "sees its holdout")

    def sandbox_hide(self) -> tuple[str, ...]:
        if self.config.prices is not None:
            return hidden(self.config.prices.path)
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
        groups, results = self.walk_forward(split).groups(folds, params)
        self.simulator(split).run(policy, groups)
        market = self.market_of(split)
        search = self._measure(results[:len(self.folds)], market)
        if split != "heldout":
            return self._outcome(search, params, [r.values for r in results])
        held = self._measure(results[len(self.folds):], market)
        held["search"] = {k: search[k] for k in ("sharpe", "sharpe_per_bar", "n_returns", "skewness",
                                                 "kurtosis", "trades", "turnover_per_year")}
        held["tuned_on"] = [str(self.market.dates[self.holdout.tune.start]),
                            str(self.market.dates[self.holdout.tune.stop - 1])]
        return self._outcome(held, params, [results[-1].values])

    def _measure(self, results: list[FoldResult], market: Market) -> dict:
        net = np.concatenate([r.group.net for r in results], axis=1)
        moves = np.concatenate([r.group.moves for r in results], axis=1)
        held = np.concatenate([r.group.decisions for r in results], axis=1)
        book = net.mean(axis=0)
        metrics = summary(book, held, moves)
        metrics["per_asset"] = {name: sharpe(row) for name, row in zip(market.names, net)}
        metrics["windows"] = [self._window_metrics(r, market.dates) for r in results]
        metrics["tune_out_of_range"] = sum(r.out_of_range for r in results)
        metrics["period"] = [str(market.dates[results[0].fold.test.start]),
                             str(market.dates[results[-1].fold.test.stop - 1])]
        if metrics["trades"] == 0:
            metrics["gate"] = "zero trades: the policy never held a position in any test window"
        return metrics

    @staticmethod
    def _window_metrics(r: FoldResult, dates: np.ndarray) -> dict:
        book = r.group.net.mean(axis=0)
        return {"test_start": str(dates[r.fold.test.start]), "return": float(np.prod(1 + book) - 1),
                "sharpe": sharpe(book), "params": {k: float(v) for k, v in r.values.items()},
                "tune_out_of_range": r.out_of_range}

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
        market = self.market_of(split)
        dates = market.dates
        out = {"market": self.config.market, "assets": list(market.names), "cost_bps": self.config.cost_bps,
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
