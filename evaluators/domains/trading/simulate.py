"""The trading domain's walk-forward machinery: windows and folds, the bar-by-bar lockstep
simulator, and the tuning of each fold (see `domain` for the protocol).

Every row of a policy call is at the same decision bar, so no row can show another
row's future; the position decided at the close of bar d is filled at the close of
d + 1 and earns the return of bar d + 2, and each change of position costs
`cost_bps` per unit of turnover.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from evaluators._base import CandidateError, PolicyFn, numeric_reply
from evaluators.domains.trading.data import Market
from evaluators.domains.trading.stats import sharpe
from evaluators.params import ParamSpec
from evaluators.tuning import OutOfRange, distributions, new_study, sobol_sampler
from store.records import Status

if TYPE_CHECKING:
    from evaluators.domains.trading.domain import TradingConfig


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
    out_of_range: OutOfRange | None = None  # a tuning group's: its rows whose positions were out of range


def check_positions(reply, rows: int, at: str, out_of_range: OutOfRange | None = None,
                    tolerant: np.ndarray | None = None) -> np.ndarray:
    """The policy's reply as (rows,) positions in [-1, 1], or a CandidateError saying what is wrong.

    With `out_of_range` (a step with tuning rows, `evaluators.tuning.OutOfRange`), a position
    that is not finite or outside [-1, 1] on a row that `tolerant` marks marks that row there
    and is taken as 0 or clipped, instead of failing the program; on any other row it fails it.
    """
    pos = numeric_reply(reply, "positions", lambda reason: _reject(at, reason), rows)
    if pos.shape != (rows,):
        _reject(at, f"positions have shape {pos.shape}; expected ({rows},), one per row of state['close'], or a scalar")
    pos = pos.astype(float)
    if not np.isfinite(pos).all():
        _out_of_range(at, ~np.isfinite(pos), out_of_range, tolerant,
                      lambda bad: f"{int(bad.sum())} of {rows} positions are not finite (e.g. {pos[bad][0]})")
        pos = np.where(np.isfinite(pos), pos, 0.0)
    if rows and np.abs(pos).max() > 1.0:
        if np.abs(pos).max() > 1.0 + 1e-9:
            _out_of_range(at, np.abs(pos) > 1.0 + 1e-9, out_of_range, tolerant,
                          lambda bad: f"positions must be in [-1, 1], got {pos[bad][np.abs(pos[bad]).argmax()]:g}")
        pos = np.clip(pos, -1.0, 1.0)
    return pos


def _out_of_range(at: str, bad: np.ndarray, out_of_range: OutOfRange | None, tolerant: np.ndarray | None,
                  reason) -> None:
    """Fail the program with `reason(rows)` unless every bad row is a tuning row; else mark them."""
    strict = bad if out_of_range is None else bad & ~tolerant
    if strict.any():
        _reject(at, reason(strict))
    out_of_range.mark(bad, f"{at}: {reason(bad)}")


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
        tuning = [g.out_of_range is not None for g in live]
        marks = OutOfRange(len(assets)) if any(tuning) else None
        tolerant = np.repeat(tuning, [len(g.assets) for g in live]) if marks is not None else None
        positions = check_positions(reply, len(assets), at, marks, tolerant)
        offset = 0
        for g in live:
            j = d - (g.window.start - 2)
            rows = slice(offset, offset + len(g.assets))
            g.decisions[:, j] = positions[rows]
            if marks is not None and marks.any(rows):
                g.out_of_range.mark(marks.rows[rows], marks.first)
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
    out_of_range: int = 0  # tuning trials that failed with a position out of range


class WalkForward:
    """Builds the groups of a pass: tune trials per fold, then the fold's test with its best trial."""

    def __init__(self, config: TradingConfig, n_assets: int, sampler_seed):
        """`sampler_seed(index)`: the seed of fold `index`'s Sobol design (from the run's secret)."""
        self.config, self.n_assets, self.sampler_seed = config, n_assets, sampler_seed

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
        study = new_study(params, sobol_sampler(self.sampler_seed(index)))
        dists = distributions(params)
        trials = [study.ask(dists) for _ in range(cfg.tune_trials)]
        values = {n: np.repeat([t.params[n] for t in trials], a).astype(float) for n in params}

        def done(g: Group) -> None:
            failed = g.out_of_range.fail_trials(study, trials, a)  # their parameters' fault, not the program's
            if len(failed) == len(trials):  # no trial kept its positions in range: the program's fault
                raise OutOfRange.none_kept(g.out_of_range.first, len(trials))
            sharpes = [-np.inf if k in failed else sharpe(g.net[k * a:(k + 1) * a].mean(axis=0))
                       for k in range(len(trials))]
            for k, trial in enumerate(trials):
                if k not in failed:
                    study.tell(trial, -sharpes[k])
            res.values = dict(trials[int(np.argmax(sharpes))].params)
            res.out_of_range = len(failed)

        return Group(res.fold.tune, np.tile(np.arange(a), len(trials)), lambda: values, done,
                     out_of_range=OutOfRange(len(trials) * a))
