"""Exact long-run average cost of the lost-sales inventory problem, by relative value iteration.

Timing (the same as the simulator's): at the start of a period the order placed
L periods ago arrives, a new order is placed, then demand is drawn; unmet demand
is lost at `penalty` per unit and stock left at the end costs `holding` per unit.
The decision state is x = (x0, x1, ..., x_{L-1}): x0 is the stock on hand for
this period's demand, x_k the order arriving k periods from now. An order q
placed now arrives in L periods, so

    V(x) = c(x0) + min_q E V((x0 - D)^+ + x1, x2, ..., x_{L-1}, q).

The inventory position (the sum of x, plus q after ordering) is capped at
`cap = quantile of (L+1)-period demand at p/(p+h)` plus a margin: Morton's bound
says the optimal policy never orders above the backorder system's base-stock
level, which that quantile is, so the cap only trims states the optimum never
enters; `solve` checks the cap is not binding and widens it if it is. States
are a dense grid of side cap+1 in each of the L coordinates, so the work grows
like (cap+1)^(L+1). Measured on 2 cores: L <= 2 well under a second; L = 3
0.5 s (Poisson, p=9) to 6 s (geometric, p=39); L = 4 about a minute and some
GB of memory for Poisson p=4, more for higher penalties. `MAX_LEAD` (4) is the
hard limit; the inventory domain solves up to its `dp_max_lead` option (3).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evaluators.cache import cache_dir

MAX_LEAD = 4
_VERSION = 1


@dataclass(frozen=True)
class DPResult:
    """Optimal long-run average cost per period, and how it was reached."""

    cost: float
    cap: int
    iterations: int
    gap: float  # upper minus lower bound on the average cost at the stop


def _stats():
    """scipy.stats, imported at first use: half a second of every command's start (its driver reads the
    domain's config), where only the evaluations and the report need it."""
    from scipy import stats
    return stats


def demand_pmf(kind: str, mean: float, n: int) -> np.ndarray:
    """P(D = 0..n-1) for Poisson or geometric (on 0, 1, ...) demand of the given mean."""
    stats, k = _stats(), np.arange(n)
    if kind == "poisson":
        return stats.poisson.pmf(k, mean)
    if kind == "geometric":
        return stats.geom.pmf(k + 1, 1.0 / (1.0 + mean))
    raise ValueError(f"unknown demand distribution {kind!r}")


def lead_demand_quantile(kind: str, mean: float, periods: int, level: float) -> int:
    """Quantile of the total demand over `periods` periods."""
    stats = _stats()
    if kind == "poisson":
        return int(stats.poisson.ppf(level, mean * periods))
    return int(stats.nbinom.ppf(level, periods, 1.0 / (1.0 + mean)))


def position_cap(kind: str, mean: float, lead: int, penalty: float, holding: float) -> int:
    """Morton's upper bound on the optimal order-up-to position, plus a small margin."""
    base = lead_demand_quantile(kind, mean, lead + 1, penalty / (penalty + holding))
    return base + 2 + int(math.ceil(0.1 * base))


def _one_period_cost(kind, mean, penalty, holding, cap) -> np.ndarray:
    """c(x0) = h E(x0 - D)^+ + p E(D - x0)^+ for x0 = 0..cap."""
    x = np.arange(cap + 1)
    pmf = demand_pmf(kind, mean, cap + 1)
    over = np.array([(pmf[:s + 1] * (s - np.arange(s + 1))).sum() for s in x])
    under = over - (x - mean)  # E(D - x)^+ = E(x - D)^+ - (x - E D)
    return holding * over + penalty * under


def _leftover_weights(kind, mean, cap) -> np.ndarray:
    """W[x0, j] = P((x0 - D)^+ = j)."""
    pmf = demand_pmf(kind, mean, cap + 1)
    weights = np.zeros((cap + 1, cap + 1))
    for x0 in range(cap + 1):
        weights[x0, 1:x0 + 1] = pmf[:x0][::-1]
        weights[x0, 0] = max(0.0, 1.0 - pmf[:x0].sum())
    return weights


class _Model:
    """The grid, the one-period costs and the expectation step for one instance."""

    def __init__(self, kind, mean, lead, penalty, holding, cap):
        self.lead, self.cap = lead, cap
        side = cap + 1
        grids = np.indices((side,) * lead, sparse=True)
        total = sum(grids)
        self.valid = total <= cap                     # decision states x
        self.room = np.where(self.valid, cap - total, -1)  # largest allowed order
        self.cost = np.broadcast_to(
            _one_period_cost(kind, mean, penalty, holding, cap).reshape((side,) + (1,) * (lead - 1)),
            (side,) * lead)
        self.weights = _leftover_weights(kind, mean, cap)
        j = np.arange(side).reshape((side,) + (1,) * lead)
        z1 = np.arange(side).reshape((1, side) + (1,) * (lead - 1))
        self.first = np.minimum(j + z1, cap)          # (j + z1) index, clipped; clipped cells are never used
        self.rest = np.indices((side,) * lead, sparse=True)[1:]
        self.q_ok = np.arange(side).reshape((1,) * lead + (side,)) <= self.room[..., None]

    def expected_next(self, value: np.ndarray) -> np.ndarray:
        """E[x0, x1..x_{L-1}, q] = sum_j W[x0, j] V(j + x1, x2, ..., q)."""
        shifted = value[(self.first, *self.rest)] if self.lead > 1 else value[self.first]
        side = self.cap + 1
        flat = self.weights @ shifted.reshape(side, -1)
        return flat.reshape((side,) * (self.lead + 1))

    def bellman(self, value: np.ndarray, orders: np.ndarray | None = None):
        """One step of T (the optimal operator, or a fixed policy's when `orders` is given)."""
        expected = self.expected_next(value)
        if orders is None:
            masked = np.where(self.q_ok, expected, np.inf)
            orders = masked.argmin(axis=-1)
        best = np.take_along_axis(expected, orders[..., None], axis=-1)[..., 0]
        return np.where(self.valid, self.cost + best, 0.0), orders


def _iterate(model: _Model, orders=None, tol=1e-7, max_iter=20000) -> tuple[float, float, int, np.ndarray]:
    value = np.zeros(model.valid.shape)
    for it in range(1, max_iter + 1):
        new, chosen = model.bellman(value, orders)
        diff = (new - value)[model.valid]
        low, high = float(diff.min()), float(diff.max())
        value = new - new.flat[0]
        if high - low < tol * max(1.0, abs(high)):
            return 0.5 * (low + high), high - low, it, chosen
    raise RuntimeError(f"relative value iteration did not converge in {max_iter} iterations")


def _binding(model: _Model, orders: np.ndarray) -> bool:
    """True if the optimum wants to order up to the cap from a state reached by ordering."""
    positive = (orders > 0) & model.valid
    return bool((positive & (orders == model.room)).any())


def solve(kind: str, mean: float, lead: int, penalty: float, holding: float = 1.0) -> DPResult:
    """The optimal average cost; raises ValueError for L above `MAX_LEAD`."""
    if not 1 <= lead <= MAX_LEAD:
        raise ValueError(f"exact DP is implemented for lead times 1..{MAX_LEAD}, not {lead}")
    cap = position_cap(kind, mean, lead, penalty, holding)
    for _ in range(4):
        model = _Model(kind, mean, lead, penalty, holding, cap)
        cost, gap, its, orders = _iterate(model)
        if not _binding(model, orders):
            return DPResult(cost, cap, its, gap)
        cap = int(cap * 1.3) + 2
    raise RuntimeError("the position cap kept binding; the instance is outside the DP's range")


def base_stock_cost(kind: str, mean: float, lead: int, penalty: float, level: int,
                    holding: float = 1.0) -> float:
    """Exact average cost of base-stock with order-up-to `level` (for checks and reports)."""
    cap = max(level, position_cap(kind, mean, lead, penalty, holding))
    model = _Model(kind, mean, lead, penalty, holding, cap)
    position = sum(np.indices(model.valid.shape, sparse=True))
    orders = np.where(model.valid, np.clip(level - position, 0, None), 0)
    return _iterate(model, orders=orders)[0]


def cached_solve(kind: str, mean: float, lead: int, penalty: float, holding: float = 1.0) -> DPResult:
    """`solve`, remembered on disk in Atoll's cache (`evaluators.cache`)."""
    key = f"{kind}-mu{mean:g}-L{lead}-p{penalty:g}-h{holding:g}-v{_VERSION}"
    path = cache_dir() / "inventory_dp" / f"{key}.json"
    try:
        return DPResult(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    result = solve(kind, mean, lead, penalty, holding)
    _write_json(path, result.__dict__)
    return result


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
