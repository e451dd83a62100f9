"""Lost-sales inventory with lead time: evolve an ordering policy class, tune its PARAMS.

Each period, per row (one trajectory of one tuning trial): the order placed L
periods ago arrives, the policy orders (seeing on-hand stock and the L orders in
the pipeline, oldest first), demand is drawn, unmet demand is lost at `penalty`
per unit and stock left over costs `holding` per unit. This timing reproduces
Zipkin's (2008) figures (see `inventory_dp`). Every policy of a run sees the
same demand matrix on an instance (common random numbers), drawn from the run's
secret (`evaluators.secrets`), so no candidate can regenerate it; one policy call
per period carries every instance at once (one batch each).

A program is a policy class: its PARAMS are tuned by optuna on each instance's
tuning trajectories, and it is scored against base-stock with S searched
exhaustively by the trusted side on the same data. The validation split does
the same on trajectories of the validation secret. The held-out split re-tunes
on other instances (on tuning trajectories of the held-out secret) and measures
on fresh trajectories with a longer horizon.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from evaluators.domains.inventory import dp as inventory_dp
from evaluators.domains.inventory import report
from evaluators.domains.inventory.programs import BASELINES, MOTIFS, SEED_PROGRAM
from evaluators._base import CandidateError, Domain, Outcome, PolicyFn, check_split
from evaluators.params import ParamSpec
from evaluators.tuning import EliteSampler, distributions, new_study, sobol_sampler
from store.records import EvalResult, Status

class InstanceSpec(BaseModel):
    """One inventory instance of the Zipkin grid (mean demand and holding cost are shared)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lead_time: int = Field(ge=1, le=20, description="Periods between placing an order and its arrival.")
    penalty: float = Field(gt=0, le=1000, description="Cost per unit of demand lost.")
    demand: Literal["poisson", "geometric"] = Field(description="Per-period demand distribution (mean: mean_demand).")

    @property
    def key(self) -> str:
        return f"{self.demand}-L{self.lead_time}-p{self.penalty:g}"


def _grid(demand, leads, penalties):
    return [InstanceSpec(lead_time=lead, penalty=p, demand=demand) for lead in leads for p in penalties]


class InventoryConfig(BaseModel):
    """Options of the inventory domain (the `[domain.options]` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean_demand: float = Field(5.0, gt=0, le=50, description="Mean demand per period, for every instance.")
    holding: float = Field(1.0, gt=0, description="Holding cost per unit left at the end of a period.")
    search_instances: list[InstanceSpec] = Field(
        default_factory=lambda: _grid("poisson", (1, 2, 4), (4, 19)), min_length=1,
        description="Instances of the search split.")
    heldout_instances: list[InstanceSpec] = Field(
        default_factory=lambda: [InstanceSpec(lead_time=3, penalty=9, demand="poisson"),
                                 InstanceSpec(lead_time=6, penalty=39, demand="poisson"),
                                 InstanceSpec(lead_time=2, penalty=9, demand="geometric"),
                                 InstanceSpec(lead_time=3, penalty=39, demand="geometric"),
                                 InstanceSpec(lead_time=6, penalty=9, demand="geometric")],
        min_length=1, description="Instances of the held-out split; none of them should be a search instance.")
    validation_instances: list[InstanceSpec] | None = Field(
        None, description="Instances of the validation split (scored like the search split, on demand drawn from "
                          "the run's validation secret); None: the search instances, on fresh demand.")
    search_periods: int = Field(250, ge=10, le=100_000, description="Measured periods per search (and validation) trajectory (after warm-up); also the tuning horizon of held-out instances.")
    heldout_periods: int = Field(2000, ge=10, le=1_000_000, description="Measured periods per held-out trajectory (after warm-up).")
    warmup: int = Field(200, ge=0, le=100_000, description="Periods simulated before costs are counted, from an empty system.")
    search_trajectories: int = Field(8, ge=1, le=1000, description="Demand trajectories per instance for tuning and the search score (also the tuning data of held-out instances).")
    validation_trajectories: int = Field(4, ge=1, le=1000, description="Demand trajectories per instance of the validation split (tuned on and scored, like the search split).")
    heldout_trajectories: int = Field(16, ge=1, le=10_000, description="Fresh demand trajectories per instance for the held-out measurement.")
    tune_trials: int = Field(32, ge=1, le=10_000, description="Optuna trials per instance; the first is the program's PARAMS defaults.")
    tune_batch: int = Field(16, ge=1, le=1000, description="Trials asked at once and simulated together (one round).")
    max_order: int = Field(100, ge=1, le=100_000, description="Orders are rounded to integers and clipped to this.")
    dp_max_lead: int = Field(3, ge=0, le=inventory_dp.MAX_LEAD, description="Largest lead time for which the exact DP optimum is computed for reports (0: none).")

    @model_validator(mode="after")
    def _validation_apart_from_heldout(self):
        shared = {s.key for s in self.validation_instances or ()} & {s.key for s in self.heldout_instances}
        if shared:
            raise ValueError(f"validation_instances {sorted(shared)} are held-out instances; the validation split "
                             "is selected on again and again, so it must not be the held-out split")
        return self


@dataclass
class RowStats:
    """Per-row results of one simulation (rows = trials x trajectories)."""

    cost: np.ndarray  # mean cost per measured period
    fill: np.ndarray  # share of demand met
    order_mean: np.ndarray
    order_std: np.ndarray

    def rows(self, index) -> "RowStats":
        return RowStats(self.cost[index], self.fill[index], self.order_mean[index], self.order_std[index])


@dataclass
class Block:
    """One instance's rows in a lockstep simulation."""

    spec: InstanceSpec
    demand: np.ndarray  # (rows, warmup + periods), the trajectories tiled over trials
    params: dict[str, np.ndarray]  # name -> (rows,)


def demand_matrix(spec: InstanceSpec, mean: float, rng: np.random.Generator, trajectories: int,
                  periods: int) -> np.ndarray:
    """The demand of every trajectory of `spec` drawn from `rng` (a stream of the run's secret)."""
    if spec.demand == "poisson":
        return rng.poisson(mean, size=(trajectories, periods))
    return rng.geometric(1.0 / (1.0 + mean), size=(trajectories, periods)) - 1


def check_orders(reply, rows: int, at: tuple, max_order: int) -> np.ndarray:
    """The policy's reply as integer orders, or a CandidateError saying what is wrong.

    `at` is (instance spec, period), named in the reason.
    """
    try:
        orders = reply if isinstance(reply, np.ndarray) else np.asarray(reply, dtype=float)
    except (ValueError, TypeError):
        _reject(at, "the policy's reply is not an array of numbers")
    if orders.dtype.kind not in "biuf":
        _reject(at, f"orders must be numbers, got dtype {orders.dtype}")
    if orders.shape in ((), (1,)):
        orders = np.full(rows, orders.reshape(()), dtype=float)
    elif orders.shape != (rows,):
        _reject(at, f"orders have shape {orders.shape}; expected ({rows},), one per row of state['on_hand'], "
                    "or a scalar")
    low, high = orders.min(), orders.max()
    if not (low >= 0 and high < np.inf):  # NaN fails both comparisons
        bad = ~np.isfinite(orders.astype(float))
        _reject(at, f"{int(bad.sum())} of {rows} orders are not finite (e.g. {orders[bad][0]})" if bad.any()
                else f"orders must be >= 0, got {low:g}")
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
        self.on_hand = np.zeros(m, np.int64)
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

    def __init__(self, config: InventoryConfig):
        self.config = config

    def run(self, policy: PolicyFn, blocks: list[Block], warmup: int) -> list[RowStats]:
        cfg = self.config
        horizon = blocks[0].demand.shape[1]
        sims = [_Rows(b, horizon) for b in blocks]
        fixed = [self._constants(b) for b in blocks]
        for t in range(horizon):
            batches = [(dict(c, on_hand=s.on_hand, pipeline=s.pipeline(t), period=t), s.block.params)
                       for s, c in zip(sims, fixed)]
            replies = policy(batches)
            for s, reply in zip(sims, replies):
                s.step(t, check_orders(reply, len(s.on_hand), (s.block.spec, t), cfg.max_order))
        return [s.stats(warmup, cfg.holding) for s in sims]

    def _constants(self, block: Block) -> dict:
        spec, cfg = block.spec, self.config
        return {"lead_time": spec.lead_time, "penalty": spec.penalty, "holding": cfg.holding,
                "mean_demand": cfg.mean_demand}


def base_stock_policy(batches):
    """Trusted base-stock, for the normalizer: order up to params['level']."""
    return [np.maximum(p["level"] - (s["on_hand"] + s["pipeline"].sum(axis=1)), 0) for s, p in batches]


@dataclass
class Tuned:
    """The best trial on one instance: its parameter values and its rows' results."""

    values: dict[str, float]
    stats: RowStats


class Tuner:
    """Tunes a program's PARAMS with optuna on every instance at once, in rounds of asks."""

    def __init__(self, config: InventoryConfig, simulator: Simulator):
        self.config, self.simulator = config, simulator

    def tune(self, policy: PolicyFn, params: dict[str, ParamSpec], specs, demands, seeds) -> list[Tuned]:
        """Tune on each instance's `demands`; `seeds` are its samplers' seeds (from the run's secret)."""
        cfg = self.config
        if not params:
            blocks = [Block(s, d, {}) for s, d in zip(specs, demands)]
            return [Tuned({}, st) for st in self.simulator.run(policy, blocks, cfg.warmup)]
        studies = [new_study(params, sobol_sampler(seed)) for seed in seeds]
        dists = distributions(params)
        best: list[Tuned | None] = [None] * len(specs)
        for start in range(0, cfg.tune_trials, cfg.tune_batch):
            n = min(cfg.tune_batch, cfg.tune_trials - start)
            trials = [[study.ask(dists) for _ in range(n)] for study in studies]
            blocks = [self._block(spec, d, ts, params) for spec, d, ts in zip(specs, demands, trials)]
            results = self.simulator.run(policy, blocks, cfg.warmup)
            for i, (study, ts, st) in enumerate(zip(studies, trials, results)):
                best[i] = self._tell(study, ts, st, best[i], len(demands[i]))
            if start == 0:  # the first round: the defaults, then a scrambled Sobol design
                for study, seed in zip(studies, seeds):
                    study.sampler = EliteSampler(seed=seed)
        return best

    @staticmethod
    def _block(spec, demand, trials, params) -> Block:
        reps = len(demand)
        values = {n: np.repeat([t.params[n] for t in trials], reps).astype(float) for n in params}
        return Block(spec, np.tile(demand, (len(trials), 1)), values)

    @staticmethod
    def _tell(study, trials, stats: RowStats, best: Tuned | None, reps: int) -> Tuned:
        for k, trial in enumerate(trials):
            rows = slice(k * reps, (k + 1) * reps)
            cost = float(stats.cost[rows].mean())
            study.tell(trial, cost)
            if best is None or cost < best.stats.cost.mean():
                best = Tuned(dict(trial.params), stats.rows(rows))
        return best


class Inventory(Domain):
    """Lost-sales inventory with lead time on the Zipkin grid."""

    name = "inventory"
    config_model = InventoryConfig
    descriptor_names = ("fill rate", "order CV")

    def __init__(self, config: InventoryConfig):
        self.config = config
        self.simulator = Simulator(config)
        self.tuner = Tuner(config, self.simulator)
        self._base_stock: dict[str, list[dict]] = {}

    @property
    def seed_program(self) -> str:
        return SEED_PROGRAM

    def baselines(self) -> dict[str, str]:
        return dict(BASELINES)

    def motifs(self) -> list[tuple[str, str, tuple]]:
        return list(MOTIFS)

    # -- data -------------------------------------------------------------------------------
    # Every stream derives from the run's secret of the split it serves, keyed by what it is
    # for and by the instance: the same for every policy of a run (common random numbers),
    # unknown to the candidate. A held-out instance's tuning data come from the held-out
    # secret too, so nothing about the held-out split follows from the search secret.

    def tuning_demand(self, spec: InstanceSpec, split: str = "search") -> np.ndarray:
        """The data `spec`'s PARAMS are tuned on (and, on search and validation, scored on)."""
        cfg = self.config
        rows = cfg.validation_trajectories if split == "validation" else cfg.search_trajectories
        rng = self.secrets.generator(split, "demand", "tune", spec.key)
        return demand_matrix(spec, cfg.mean_demand, rng, rows, cfg.warmup + cfg.search_periods)

    def heldout_demand(self, spec: InstanceSpec) -> np.ndarray:
        """Fresh trajectories of a held-out instance, for the held-out measurement only."""
        cfg = self.config
        rng = self.secrets.generator("heldout", "demand", "measure", spec.key)
        return demand_matrix(spec, cfg.mean_demand, rng, cfg.heldout_trajectories, cfg.warmup + cfg.heldout_periods)

    def tuner_seed(self, spec: InstanceSpec, split: str) -> int:
        return self.secrets.seed(split, "tuner", spec.key, bits=32)

    def instances(self, split: str) -> list[InstanceSpec]:
        cfg = self.config
        if split == "validation":
            return list(cfg.validation_instances or cfg.search_instances)
        return list(cfg.search_instances if split == "search" else cfg.heldout_instances)

    # -- scoring ----------------------------------------------------------------------------

    def evaluate(self, policy: PolicyFn, params: dict[str, ParamSpec], split: str) -> Outcome:
        specs = self.instances(check_split(split))
        if split == "heldout" and not params:
            tuned = [Tuned({}, None)] * len(specs)
        else:
            tuning = [self.tuning_demand(s, split) for s in specs]
            tuned = self.tuner.tune(policy, params, specs, tuning, [self.tuner_seed(s, split) for s in specs])
        if split == "heldout":
            blocks = [Block(s, self.heldout_demand(s), self._fixed(t.values, self.config.heldout_trajectories))
                      for s, t in zip(specs, tuned)]
            measured = self.simulator.run(policy, blocks, self.config.warmup)
            tuned = [Tuned(t.values, st) for t, st in zip(tuned, measured)]
        return self._outcome(specs, tuned, params, self.base_stock(split))

    @staticmethod
    def _fixed(values: dict[str, float], rows: int) -> dict[str, np.ndarray]:
        return {n: np.full(rows, float(v)) for n, v in values.items()}

    def base_stock(self, split: str) -> list[dict]:
        """Optimized base-stock per instance: S searched over all integers on the tuning data.

        On the held-out split that S is then measured on the held-out data, like
        every program's tuned parameters. Computed once per split and kept.
        """
        if split not in self._base_stock:
            specs = self.instances(split)
            levels = [self._best_level(s, self.tuning_demand(s, split)) for s in specs]
            if split != "heldout":
                self._base_stock[split] = [{"level": lv, "costs": c} for lv, c in levels]
            else:
                blocks = [Block(s, self.heldout_demand(s), self._fixed({"level": lv}, self.config.heldout_trajectories))
                          for s, (lv, _) in zip(specs, levels)]
                runs = self.simulator.run(base_stock_policy, blocks, self.config.warmup)
                self._base_stock[split] = [{"level": lv, "costs": st.cost} for (lv, _), st in zip(levels, runs)]
        return self._base_stock[split]

    def _best_level(self, spec: InstanceSpec, demand: np.ndarray) -> tuple[int, np.ndarray]:
        cfg = self.config
        top = inventory_dp.lead_demand_quantile(spec.demand, cfg.mean_demand, spec.lead_time + 1, 0.9999) + 5
        levels = np.arange(0, min(top, cfg.max_order * (spec.lead_time + 1)) + 1)
        reps = len(demand)
        block = Block(spec, np.tile(demand, (len(levels), 1)), {"level": np.repeat(levels, reps).astype(float)})
        cost = self.simulator.run(base_stock_policy, [block], cfg.warmup)[0].cost.reshape(len(levels), reps)
        k = int(cost.mean(axis=1).argmin())
        return int(levels[k]), cost[k]

    def _outcome(self, specs, tuned: list[Tuned], params, base: list[dict]) -> Outcome:
        ratios = [float(t.stats.cost.mean() / b["costs"].mean()) for t, b in zip(tuned, base)]
        per_instance = {s.key: self._instance_metrics(t, b) for s, t, b in zip(specs, tuned, base)}
        order_cv = [float(np.mean(t.stats.order_std) / max(np.mean(t.stats.order_mean), 1e-9)) for t in tuned]
        fill = [float(np.mean(t.stats.fill)) for t in tuned]
        medians = {n: float(np.clip(np.median([t.values[n] for t in tuned]), p.low, p.high))
                   for n, p in params.items()}
        metrics = {"mean_cost": float(np.mean([t.stats.cost.mean() for t in tuned])),
                   "mean_ratio_to_base_stock": float(np.mean(ratios)), "instances": per_instance}
        return Outcome(score=-float(np.mean(ratios)), metrics=metrics,
                       instance_scores=tuple(-r for r in ratios),
                       descriptors=(float(np.mean(fill)), float(np.mean(order_cv))), tuned_params=medians)

    @staticmethod
    def _instance_metrics(tuned: Tuned, base: dict) -> dict:
        st, n = tuned.stats, len(tuned.stats.cost)
        return {"cost": float(st.cost.mean()),
                "se": float(st.cost.std(ddof=1) / math.sqrt(n)) if n > 1 else None,
                "fill_rate": float(st.fill.mean()), "mean_order": float(st.order_mean.mean()),
                "order_std": float(st.order_std.mean()),
                "params": {k: float(v) for k, v in tuned.values.items()},
                "trajectory_costs": [float(c) for c in st.cost],
                "base_stock_level": base["level"], "base_stock_cost": float(base["costs"].mean()),
                "base_stock_trajectory_costs": [float(c) for c in base["costs"]]}

    # -- reports ----------------------------------------------------------------------------

    def reference(self, split: str) -> dict:
        """Exact DP optimum per instance with lead time <= dp_max_lead (cached on disk)."""
        cfg, optimum = self.config, {}
        specs = self.instances(check_split(split))
        for spec in specs:
            if spec.lead_time <= cfg.dp_max_lead:
                optimum[spec.key] = inventory_dp.cached_solve(spec.demand, cfg.mean_demand, spec.lead_time,
                                                              spec.penalty, cfg.holding).cost
        return {"dp_optimum": optimum, "dp_max_lead": cfg.dp_max_lead,
                "without_dp": [s.key for s in specs if s.key not in optimum]}

    def heldout_table(self, results: dict[str, EvalResult], reference: dict):
        return report.heldout_table(self.config, results, reference)

    # -- for LLM prompts ----------------------------------------------------------------------

    def description(self) -> str:
        return ("Lost-sales inventory with a lead time. Each period the order placed lead_time periods ago "
                "arrives, the policy places a new order, then random demand (mean "
                f"{self.config.mean_demand:g}) is met from stock; unmet demand is lost at `penalty` per unit and "
                f"stock left over costs {self.config.holding:g} per unit. The score is minus the mean over "
                "instances of the policy's long-run cost divided by optimized base-stock's cost on the same "
                "demand (-1.0 ties base-stock; -0.95 is 5% cheaper). PARAMS are tuned on each instance.")

    def contract(self) -> str:
        return ("Define policy(state, params) -> orders. Each call holds many rows (trajectories x trials): "
                "state['on_hand'] is an int array (rows,), state['pipeline'] an int array (rows, lead_time) of "
                "orders not yet arrived, oldest first; the scalars state['lead_time'], state['penalty'], "
                "state['holding'], state['mean_demand'] and state['period'] describe the instance. "
                "params[name] is a float array (rows,) per PARAMS entry. Return one order >= 0 per row "
                "(an array of shape (rows,), or a scalar); orders are rounded to integers. Use numpy only.")
