"""The user's own demand history for the inventory domain (`demand_history`).

A CSV or Parquet file of demand per period and item, long (period, item and
demand columns) or wide (a period column and one column per item). Demand is a
count of units: whole and non-negative, one value per item and period (write 0
for a period without demand). Periods sort in their column's order (numbers,
dates, or text such as "2024-03").

The history is split in time: the earlier periods (the search part) feed the
search and validation splits and every split's tuning, the later
`heldout_share` (the held-out part) only the held-out measurement, so a policy
tuned on the past is measured on the future it has not seen. Trajectories are
moving-block bootstrap resamples of one part: blocks of `block` consecutive
periods (which keep weekly patterns and short trends) at random starts, drawn
from the run's secret stream of the split, so no candidate can rebuild them.
"""
from __future__ import annotations

import functools
from typing import Annotated, NamedTuple

import numpy as np
from pydantic import AfterValidator, Field, model_validator

from evaluators.userdata import UserData, column, distinct, labels, numbers, read_table

MAX_DEMAND = 10 ** 12  # units per period: the simulation counts in int64, summed over up to 10^6 periods


class DemandHistory(UserData):
    """Past demand per item (`[domain.options.demand_history]`, or just its path): CSV or Parquet."""

    period_column: str = Field("period", min_length=1, description="The column of periods (sorted in its own order).")
    item_column: str = Field("item", min_length=1, description="Long format: the column naming the item. A file "
                                                               "with this and demand_column is long; otherwise "
                                                               "every column but the period is an item.")
    demand_column: str = Field("demand", min_length=1, description="Long format: the column of demand (units).")
    items: Annotated[list[str], AfterValidator(distinct)] = Field(default_factory=list, description="Items to use (default: every item of the file).")
    heldout_share: float = Field(0.3, gt=0.0, lt=1.0, description="The latest share of the periods: the held-out "
                                                                  "measurement draws only from them, everything "
                                                                  "else only from the periods before.")
    block: int = Field(7, ge=1, le=365, description="Periods per bootstrap block (7: a week of days).")
    lead_times: Annotated[list[int], AfterValidator(distinct)] = Field(default_factory=lambda: [2], min_length=1, description="Lead times to test; "
                                  "the instances are every item x lead time x penalty.")
    penalties: Annotated[list[float], AfterValidator(distinct)] = Field(default_factory=lambda: [9.0], min_length=1, description="Lost-sale penalties "
                                   "per unit to test (holding costs `holding`).")

    @model_validator(mode="after")
    def _enough(self):
        names, demand = load_demand(self)
        unknown = [i for i in self.items if i not in names]
        if unknown:
            raise ValueError(f"items {unknown} are not in {self.path} (it has {', '.join(names)})")
        if any(not 1 <= lead <= 20 for lead in self.lead_times) or any(not 0 < p <= 1000 for p in self.penalties):
            raise ValueError("lead_times must lie in 1..20 and penalties in (0, 1000]")
        cut, n = self.cut(demand.shape[1]), demand.shape[1]
        need = 2 * self.block
        if min(cut, n - cut) < need:
            raise ValueError(f"{self.path} has {n} periods: with heldout_share {self.heldout_share:g} and block "
                             f"{self.block}, the search part has {cut} and the held-out part {n - cut}, and each "
                             f"needs at least {need} (two blocks); give a longer history or a smaller block")
        idle = [item for item in self.chosen() if not demand[names.index(item), :cut].any()]
        if idle:
            raise ValueError(f"item {idle[0]!r} has no demand in the first {cut} periods of {self.path} (the search "
                             "part): base-stock costs nothing there, so no policy's cost can be set against it; "
                             "leave it out of items or give a history in which it sells early on")
        return self

    def cut(self, periods: int) -> int:
        """The first period of the held-out part."""
        return max(0, periods - max(1, round(self.heldout_share * periods)))

    def chosen(self) -> tuple[str, ...]:
        return tuple(self.items) or load_demand(self)[0]

    def part(self, item: str, heldout: bool) -> np.ndarray:
        """The item's demand in the search part (earlier) or the held-out part (later)."""
        names, demand = load_demand(self)
        series = demand[names.index(item)]
        cut = self.cut(len(series))
        return series[cut:] if heldout else series[:cut]


def load_demand(spec: DemandHistory) -> tuple[tuple[str, ...], np.ndarray]:
    """(item names, demand[item, period] as int64), periods in order; read once per content."""
    return _load(_Source(spec.path, spec.sha256, spec.period_column, spec.item_column, spec.demand_column))


class _Source(NamedTuple):
    """What the table's reading depends on (the cache's key; the content is named by its digest)."""

    path: str
    sha256: str | None
    period_column: str
    item_column: str
    demand_column: str


@functools.lru_cache(maxsize=8)
def _load(spec: _Source) -> tuple[tuple[str, ...], np.ndarray]:
    table = read_table(spec.path)
    period = column(table, spec.period_column, spec.path, "period", "demand_history.period_column")
    if {spec.item_column, spec.demand_column} <= set(table.column_names):
        items = labels(table.column(spec.item_column), spec.path, f"column {spec.item_column!r}")
        names = tuple(dict.fromkeys(items))
        values = numbers(table.column(spec.demand_column), spec.path, f"column {spec.demand_column!r}")
        periods, at = _periods(period.to_pylist(), spec.path)
        demand = np.full((len(names), len(periods)), np.nan)
        for k, (item, t) in enumerate(zip(items, at)):
            if not np.isnan(demand[names.index(item), t]):
                raise ValueError(f"{spec.path}: item {item!r} has two demands in period {periods[t]} "
                                 f"(data row {k + 1})")
            demand[names.index(item), t] = values[k]
    else:
        names = tuple(c for c in table.column_names if c != spec.period_column)
        periods, at = _periods(period.to_pylist(), spec.path)
        if len(periods) != len(at):
            raise ValueError(f"{spec.path}: a period appears in two rows; one row per period")
        demand = np.full((len(names), len(periods)), np.nan)
        for i, name in enumerate(names):
            demand[i, at] = numbers(table.column(name), spec.path, f"column {name!r}")
    if not names:
        raise ValueError(f"{spec.path} has a period column but no item")
    return names, _counts(names, periods, demand, spec.path)


def _periods(values: list, path: str) -> tuple[list, np.ndarray]:
    """The distinct periods in order, and each row's index among them."""
    if any(v is None for v in values):
        raise ValueError(f"{path}: a row has no period (data row {values.index(None) + 1})")
    try:
        periods = sorted(set(values))
    except TypeError:
        raise ValueError(f"{path}: the periods mix kinds of values that do not sort together") from None
    where = {p: i for i, p in enumerate(periods)}
    return periods, np.array([where[v] for v in values], dtype=np.int64)


def _counts(names, periods, demand: np.ndarray, path: str) -> np.ndarray:
    """Demand as whole non-negative units; a gap, a negative, a fraction or a count too large for the
    simulation's integers is one line naming the cell."""
    for test, what in ((np.isnan(demand), "no demand"), (demand < 0, "a negative demand"),
                       (np.isinf(demand), "an infinite demand"),
                       (demand > MAX_DEMAND, "a demand of more than 10^12 units"),
                       (demand != np.rint(demand), "a demand that is not a whole number of units")):
        bad = np.argwhere(test)  # the gaps are refused first, so the later tests meet numbers only
        if len(bad):
            i, t = bad[0]
            raise ValueError(f"{path}: item {names[i]!r} has {what} in period {periods[t]}"
                             + (" (write 0 for a period without demand)" if np.isnan(demand[i, t])
                                else f" ({demand[i, t]:g})"))
    return demand.astype(np.int64)


def bootstrap(series: np.ndarray, block: int, rng: np.random.Generator, rows: int, periods: int) -> np.ndarray:
    """`rows` trajectories of `periods` periods, each a chain of blocks of `series` at random starts."""
    blocks = -(-periods // block)
    starts = rng.integers(0, len(series) - block + 1, size=(rows, blocks))
    index = (starts[:, :, None] + np.arange(block)).reshape(rows, -1)[:, :periods]
    return series[index]
