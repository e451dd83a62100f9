"""The inventory domain's simulation: rows of trajectories stepped in lockstep, one policy round
trip per period for every instance, and the optuna tuner that simulates a round of trials at once.

Trusted side only: the policy is reached through `PolicyFn` (the sandbox's channel); its
replies are checked by `check_orders` before they touch the state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from evaluators import tuning
from evaluators._base import CandidateError, PolicyFn, numeric_reply
from evaluators.params import ParamSpec
from evaluators.tuning import EliteSampler, distributions, new_study, sobol_sampler
from store.records import Status

if TYPE_CHECKING:
    from evaluators.domains.inventory.domain import InstanceSpec, InventoryConfig


@dataclass
class RowStats:
    """Per-row results of one simulation (rows = trials x trajectories)."""

    cost: np.ndarray  # mean cost per measured period
    fill: np.ndarray  # share of demand met
    order_mean: np.ndarray
    order_std: np.ndarray

    def rows(self, index) -> RowStats:
        return RowStats(self.cost[index], self.fill[index], self.order_mean[index], self.order_std[index])


@dataclass
class Block:
    """One instance's rows in a lockstep simulation."""

    spec: InstanceSpec
    demand: np.ndarray  # (rows, warmup + periods), the trajectories tiled over trials
    params: dict[str, np.ndarray]  # name -> (rows,)
    start: int = 0  # stock on hand before the first period (the validation split's disturbed start)


def demand_matrix(spec: InstanceSpec, mean: float, rng: np.random.Generator, trajectories: int,
                  periods: int) -> np.ndarray:
    """The demand of every trajectory of `spec` drawn from `rng` (a stream of the run's secret)."""
    if spec.demand == "poisson":
        return rng.poisson(mean, size=(trajectories, periods))
    return rng.geometric(1.0 / (1.0 + mean), size=(trajectories, periods)) - 1


def check_orders(reply, rows: int, at: tuple, max_order: int,
                 out_of_range: tuning.OutOfRange | None = None) -> np.ndarray:
    """The policy's reply as integer orders, or a CandidateError saying what is wrong.

    `at` is (instance spec, period), named in the reason. With `out_of_range` (a tuning
    round, `evaluators.tuning.OutOfRange`), orders below zero or not finite mark their rows
    there and are taken as 0 instead of failing the program.
    """
    orders = numeric_reply(reply, "orders", lambda reason: _reject(at, reason), rows)
    if orders.shape != (rows,):
        _reject(at, f"orders have shape {orders.shape}; expected ({rows},), one per row of state['on_hand'], "
                    "or a scalar")
    low, high = orders.min(), orders.max()
    if not (low >= 0 and high < np.inf):  # NaN fails both comparisons
        bad = ~np.isfinite(orders.astype(float))
        reason = (f"{int(bad.sum())} of {rows} orders are not finite (e.g. {orders[bad][0]})" if bad.any()
                  else f"orders must be >= 0, got {low:g}")
        if out_of_range is None:
            _reject(at, reason)
        bad |= ~(orders >= 0)
        out_of_range.mark(bad, f"instance {at[0].key}, period {at[1]}: {reason}")
        orders = np.where(bad, 0, orders)
    return np.minimum(np.rint(orders), max_order).astype(np.int64)


def _reject(at: tuple, reason: str):
    raise CandidateError(Status.INVALID, f"instance {at[0].key}, period {at[1]}: {reason}")


class _Rows:
    """The trajectories of one block, period by period, with the records needed for stats.

    `orders[t]` holds the order that arrives in period t (placed in t - L), so the
    pipeline the policy sees in period t is `orders[t:t + L]`, oldest first.
    """

    def __init__(self, block: Block, horizon: int):
        m, lead = len(block.demand), block.spec.lead_time
        self.block, self.lead = block, lead
        self.demand = np.ascontiguousarray(block.demand.T)  # (horizon, m)
        self.on_hand = np.full(m, block.start, np.int64)
        self.orders = np.zeros((horizon + lead, m), np.int64)
        self.left = np.zeros((horizon, m), np.int64)  # stock left after demand
        self.lost = np.zeros((horizon, m), np.int64)

    def pipeline(self, t: int) -> np.ndarray:
        return np.ascontiguousarray(self.orders[t:t + self.lead].T)

    def step(self, t: int, orders: np.ndarray) -> None:
        self.orders[t + self.lead] = orders
        stock = self.on_hand + self.orders[t]
        demand = self.demand[t]
        sold = np.minimum(stock, demand)
        self.lost[t] = demand - sold
        self.on_hand = self.left[t] = stock - sold

    def stats(self, warmup: int, holding: float) -> RowStats:
        left, lost, demand = self.left[warmup:], self.lost[warmup:], self.demand[warmup:]
        placed = self.orders[warmup + self.lead:].astype(float)
        cost = (holding * left + self.block.spec.penalty * lost).mean(axis=0)
        total = demand.sum(axis=0)
        fill = np.where(total > 0, 1.0 - lost.sum(axis=0) / np.maximum(total, 1), 1.0)
        return RowStats(cost, fill, placed.mean(axis=0), placed.std(axis=0))


class Simulator:
    """Lockstep simulation of several instances' rows, one policy round trip per period."""

    def __init__(self, config: InventoryConfig, mean_of=None):
        self.config = config
        self.mean_of = mean_of or (lambda spec: config.mean_demand)

    def run(self, policy: PolicyFn, blocks: list[Block], warmup: int,
            violations: list[tuning.OutOfRange] | None = None) -> list[RowStats]:
        """Every block's rows to the horizon. With `violations` (a tuning round: one
        `tuning.OutOfRange` per block), out-of-range orders mark their rows there instead of failing."""
        cfg = self.config
        horizon = blocks[0].demand.shape[1]
        sims = [_Rows(b, horizon) for b in blocks]
        fixed = [self._constants(b) for b in blocks]
        marks = violations if violations is not None else [None] * len(sims)
        for t in range(horizon):
            batches = [(dict(c, on_hand=s.on_hand, pipeline=s.pipeline(t), period=t), s.block.params)
                       for s, c in zip(sims, fixed)]
            replies = policy(batches)
            for s, reply, mark in zip(sims, replies, marks):
                s.step(t, check_orders(reply, len(s.on_hand), (s.block.spec, t), cfg.max_order, mark))
        return [s.stats(warmup, cfg.holding) for s in sims]

    def _constants(self, block: Block) -> dict:
        spec, cfg = block.spec, self.config
        return {"lead_time": spec.lead_time, "penalty": spec.penalty, "holding": cfg.holding,
                "mean_demand": self.mean_of(spec)}


def base_stock_policy(batches):
    """Trusted base-stock, for the normalizer: order up to params['level']."""
    return [np.maximum(p["level"] - (s["on_hand"] + s["pipeline"].sum(axis=1)), 0) for s, p in batches]


@dataclass
class Tuned:
    """The best trial on one instance: its parameter values and its rows' results."""

    values: dict[str, float]
    stats: RowStats
    out_of_range: int = 0  # tuning trials that failed with an order out of range
    measured: RowStats | None = None  # its rows on the fresh trajectories, where the last round ran them


class Tuner:
    """Tunes a program's PARAMS with optuna on every instance at once, in rounds of asks."""

    def __init__(self, config: InventoryConfig, simulator: Simulator):
        self.config, self.simulator = config, simulator

    def tune(self, policy: PolicyFn, params: dict[str, ParamSpec], specs, demands, seeds, total: int,
             fresh: list[np.ndarray] | None = None) -> list[Tuned]:
        """Tune on each instance's `demands` with `total` trials; `seeds` are its samplers' seeds (from
        the run's secret).

        With `fresh` (per instance, trajectories as long as `demands`), the last round also runs every
        trial that could still be the best (its own and the best before it) on them, in the same
        pass: `measured` is then the best's rows there; a best that ordered out of range there is INVALID.
        """
        cfg = self.config
        if not params:
            blocks = [Block(s, d, {}) for s, d in zip(specs, demands)]
            return [Tuned({}, st) for st in self.simulator.run(policy, blocks, cfg.warmup)]
        studies = [new_study(params, sobol_sampler(seed)) for seed in seeds]
        dists = distributions(params)
        best: list[Tuned | None] = [None] * len(specs)
        first: list[str | None] = [None] * len(specs)  # per instance, the first reason an order was out of range
        failed = [0] * len(specs)  # per instance, the trials that failed so
        measured: list[RowStats | None] = [None] * len(specs)
        for start in range(0, total, cfg.tune_batch):
            n = min(cfg.tune_batch, total - start)
            trials = [[study.ask(dists) for _ in range(n)] for study in studies]
            blocks = [self._block(spec, d, ts, params) for spec, d, ts in zip(specs, demands, trials)]
            last = fresh is not None and start + n >= total
            candidates = [[dict(t.params) for t in ts] + ([b.values] if b else []) for ts, b in zip(trials, best)]
            checks = [self._candidates(spec, f, c) for spec, f, c in zip(specs, fresh, candidates)] if last else []
            violations = [tuning.OutOfRange(len(b.demand)) for b in blocks + checks]
            results = self.simulator.run(policy, blocks + checks, cfg.warmup, violations)
            for i, (study, ts, st, v) in enumerate(zip(studies, trials, results, violations)):
                gone = v.fail_trials(study, ts, len(demands[i]))
                best[i] = self._tell(study, ts, st, best[i], len(demands[i]), gone)
                first[i], failed[i] = first[i] or v.first, failed[i] + len(gone)
            if last:
                measured = [self._winner(spec, b, c, st, v, len(f)) for spec, b, c, st, v, f in
                            zip(specs, best, candidates, results[len(blocks):], violations[len(blocks):], fresh)]
            if start == 0:  # the first round: the defaults, then a scrambled Sobol design
                for study, seed in zip(studies, seeds):
                    study.sampler = EliteSampler(seed=seed)
        for tuned, reason in zip(best, first):
            if tuned is None:  # no trial kept its orders in range on this instance: the program's fault
                raise tuning.OutOfRange.none_kept(reason, total, "ordered")
        return [Tuned(t.values, t.stats, count, m) for t, count, m in zip(best, failed, measured)]

    @staticmethod
    def _candidates(spec, fresh: np.ndarray, candidates: list[dict]) -> Block:
        """Every candidate's parameter values on the `fresh` trajectories (candidate k: rows k * reps on)."""
        values = {n: np.repeat([c[n] for c in candidates], len(fresh)).astype(float) for n in candidates[0]}
        return Block(spec, np.tile(fresh, (len(candidates), 1)), values)

    @staticmethod
    def _winner(spec, best: Tuned | None, candidates: list[dict], stats: RowStats, marks: tuning.OutOfRange,
                reps: int) -> RowStats | None:
        """The best's rows on the fresh trajectories; None if there is no best. Rows of the best that left the
        range there make the program INVALID: they run once, so no later pass may measure the best on them
        (the process has met them: a program that read their demand, then spoiled its rows on purpose,
        was scored with hindsight there)."""
        if best is None:
            return None
        k = candidates.index(best.values)
        rows = slice(k * reps, (k + 1) * reps)
        if marks.any(rows):
            raise CandidateError(Status.INVALID, f"instance {spec.key}: the tuned PARAMS ordered out of range on "
                                                 "the fresh trajectories of the search score (the first such order "
                                                 f"of the round, of any trial: {marks.first})")
        return stats.rows(rows)

    @staticmethod
    def _block(spec, demand, trials, params) -> Block:
        reps = len(demand)
        values = {n: np.repeat([t.params[n] for t in trials], reps).astype(float) for n in params}
        return Block(spec, np.tile(demand, (len(trials), 1)), values)

    @staticmethod
    def _tell(study, trials, stats: RowStats, best: Tuned | None, reps: int, failed: set[int]) -> Tuned | None:
        """Tell each trial's mean cost but the `failed` ones' (orders out of range, told already)."""
        for k, trial in enumerate(trials):
            rows = slice(k * reps, (k + 1) * reps)
            if k in failed:
                continue
            cost = float(stats.cost[rows].mean())
            study.tell(trial, cost)
            if best is None or cost < best.stats.cost.mean():
                best = Tuned(dict(trial.params), stats.rows(rows))
        return best
