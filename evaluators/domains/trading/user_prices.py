"""The user's own price history for the trading domain (`market = "file"`).

A CSV or Parquet file of daily closes, either wide (a date column and one column
per asset) or long (date, asset and price columns; chosen when the file has the
asset and price columns). Rows are sorted by date; a missing price is allowed
(an asset listed later than another), and the market keeps the dates on which
every chosen asset has one, like the bundled data. Anything else that is wrong
(no date column, a value that is not a number, a price that is not positive, a
date twice) is one line naming the file, the column and the row.

When the file has no assets set aside for the validation split, that split
trades a reshuffle of the search period: its returns cut into blocks of
consecutive bars (the same bars for every asset, so their co-movement is kept),
the blocks put in an order drawn from the run's validation secret. Each bar
comes once: a block drawn twice, or two that overlap, would show the program
bars it has already met, and a program that remembered them could trade the
second showing with hindsight. The holdout's bars never enter it.
"""
from __future__ import annotations

import functools

import numpy as np
from pydantic import Field, model_validator

from evaluators.domains.trading.data import Market
from evaluators.userdata import UserData, column, dates, labels, numbers, read_table

BOOTSTRAP_BLOCK = 20  # bars per resampled block of the validation market (about a month)


class PriceHistory(UserData):
    """Daily closes of your own assets (`[domain.options.prices]`, or just its path): CSV or Parquet."""

    date_column: str = Field("date", min_length=1, description="The column of dates (YYYY-MM-DD, or typed dates).")
    asset_column: str = Field("asset", min_length=1, description="Long format only: the column naming the asset. "
                                                                 "A file with this and price_column is long; "
                                                                 "otherwise every column but the date is an asset.")
    price_column: str = Field("price", min_length=1, description="Long format only: the column of closes.")

    @model_validator(mode="after")
    def _readable(self):
        load_prices(self)
        return self


@functools.lru_cache(maxsize=8)
def load_prices(spec: PriceHistory) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """(asset names, dates, close[asset, bar] with NaN where missing), sorted by date."""
    table = read_table(spec.path)
    when = dates(column(table, spec.date_column, spec.path, "date", "prices.date_column"), spec.path,
                 f"column {spec.date_column!r}")
    if {spec.asset_column, spec.price_column} <= set(table.column_names):
        names, when, close = _long(table, when, spec)
    else:
        names = tuple(c for c in table.column_names if c != spec.date_column)
        close = np.array([numbers(table.column(n), spec.path, f"column {n!r}") for n in names]).reshape(len(names), -1)
        _no_repeats(when, spec.path)
    if not names:
        raise ValueError(f"{spec.path} has a date column but no asset column")
    order = np.argsort(when, kind="stable")
    when, close = when[order], close[:, order]
    _positive(names, when, close, spec.path)
    return names, when, close


def _long(table, when, spec: PriceHistory):
    assets = labels(table.column(spec.asset_column), spec.path, f"column {spec.asset_column!r}")
    price = numbers(table.column(spec.price_column), spec.path, f"column {spec.price_column!r}")
    names = tuple(dict.fromkeys(assets))
    days, at = np.unique(when, return_inverse=True)
    close = np.full((len(names), len(days)), np.nan)
    row_of = {n: i for i, n in enumerate(names)}
    seen = np.zeros_like(close, dtype=bool)
    for k, (asset, t) in enumerate(zip(assets, at)):
        if seen[row_of[asset], t]:
            raise ValueError(f"{spec.path}: asset {asset!r} has two prices on {days[t]} (data row {k + 1})")
        seen[row_of[asset], t] = True
        close[row_of[asset], t] = price[k]
    return names, days, close


def _no_repeats(when: np.ndarray, path: str) -> None:
    days, counts = np.unique(when, return_counts=True)
    if (counts > 1).any():
        raise ValueError(f"{path}: the date {days[counts > 1][0]} appears in {counts.max()} rows; one row per date")


def _positive(names, when, close, path: str) -> None:
    bad = np.isfinite(close) & (close <= 0)
    if bad.any():
        a, t = np.argwhere(bad)[0]
        raise ValueError(f"{path}: asset {names[a]!r} has the price {close[a, t]:g} on {when[t]}; prices must be "
                         "positive (adjusted closes)")
    if np.isinf(close).any():
        a, t = np.argwhere(np.isinf(close))[0]
        raise ValueError(f"{path}: asset {names[a]!r} has an infinite price on {when[t]}")


def user_market(spec: PriceHistory, assets: tuple[str, ...]) -> Market:
    """`assets` of the file on the dates where each of them has a price."""
    names, when, close = load_prices(spec)
    unknown = [a for a in assets if a not in names]
    if unknown:
        raise ValueError(f"assets {unknown} are not in {spec.path} (it has {', '.join(names)})")
    rows = close[[names.index(a) for a in assets]]
    keep = np.isfinite(rows).all(axis=0)
    return Market(tuple(assets), when[keep], rows[:, keep])


def resampled(market: Market, holdout_bars: int, rng: np.random.Generator) -> Market:
    """The search period of `market` (the bars before its holdout), its returns' blocks in a random order.

    Each bar's returns appear once, so no later bar repeats one the program has seen.
    """
    returns = market.returns()[:, 1:len(market.dates) - holdout_bars]
    starts = np.arange(0, returns.shape[1], BOOTSTRAP_BLOCK)
    index = np.concatenate([np.arange(s, min(s + BOOTSTRAP_BLOCK, returns.shape[1])) for s in rng.permutation(starts)])
    close = 100.0 * np.cumprod(np.concatenate([np.ones((len(returns), 1)), 1.0 + returns[:, index]], axis=1), axis=1)
    return Market(tuple(f"{n} (resampled)" for n in market.names), market.dates[:len(index) + 1], close)
