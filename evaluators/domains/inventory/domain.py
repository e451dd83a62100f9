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
tuning trajectories, then the tuned values are measured on fresh trajectories of
the same split, against base-stock with S searched exhaustively by the trusted
side on the tuning data and measured on the same fresh ones. The tuning rounds
replay the same trajectories, and the candidate's process lives through all of
them: a program that recorded a round's demand would know every later round's
future. So no score comes from data the program has met before: the fresh
trajectories run once, as extra rows of the last tuning round (every trial that
could still be the best), and only the best's rows count. The validation split tunes the same way
on trajectories of the validation secret and measures on fresh ones in a pass of its own, each
starting with a high stock, so a policy that runs away from a state its tuning never reached fails
there, on the run's own data. The held-out split re-tunes on other
instances (on tuning trajectories of the held-out secret) and measures on fresh
trajectories with a longer horizon.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from evaluators.domains.inventory import dp as inventory_dp
from evaluators.domains.inventory import report
from evaluators.domains.inventory.history import DemandHistory, bootstrap
from evaluators.domains.inventory.programs import BASELINES, MOTIFS, SEED_PROGRAM
from evaluators.domains.inventory.simulation import (Block, Simulator, Tuned, Tuner, base_stock_policy,
                                                     demand_matrix)
from evaluators._base import Domain, DoesNotHoldUp, Outcome, PolicyFn, check_split
from evaluators.params import ParamSpec
from evaluators.userdata import distinct, hidden
from store.records import EvalResult

# An instance whose validation cost is this many times optimized base-stock's has run away
# (`Inventory._check_stable`): tuned programs come within a few percent of it, and a policy whose
# stock climbed without end over 2,000 periods cost 58 to 1,000 times as much on such trajectories.
RUNAWAY = 2.0


def _cost_ratios(tuned: list[Tuned], base: list[dict]) -> list[float]:
    """Each instance's mean cost over optimized base-stock's, on the same fresh trajectories."""
    return [float(t.stats.cost.mean() / b["costs"].mean()) for t, b in zip(tuned, base)]


class InstanceSpec(BaseModel):
    """One inventory instance of the Zipkin grid (mean demand and holding cost are shared)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lead_time: int = Field(ge=1, le=20, description="Periods between placing an order and its arrival.")
    penalty: float = Field(gt=0, le=1000, description="Cost per unit of demand lost.")
    demand: Literal["poisson", "geometric", "empirical"] = Field(description="Per-period demand distribution (mean: mean_demand); 'empirical': resampled from the item's history (set by demand_history, not by hand).")
    item: str | None = Field(None, description="The item of the demand history, for empirical demand.")

    @property
    def key(self) -> str:
        return f"{self.item if self.item is not None else self.demand}-L{self.lead_time}-p{self.penalty:g}"


def _grid(demand, leads, penalties):
    return [InstanceSpec(lead_time=lead, penalty=p, demand=demand) for lead in leads for p in penalties]


class InventoryConfig(BaseModel):
    """Options of the inventory domain (the `[domain.options]` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean_demand: float = Field(5.0, gt=0, le=50, description="Mean demand per period, for every instance.")
    holding: float = Field(1.0, gt=0, description="Holding cost per unit left at the end of a period.")
    search_instances: Annotated[list[InstanceSpec], AfterValidator(distinct)] = Field(
        default_factory=lambda: _grid("poisson", (1, 2, 4), (4, 19)), min_length=1,
        description="Instances of the search split.")
    heldout_instances: Annotated[list[InstanceSpec], AfterValidator(distinct)] = Field(
        default_factory=lambda: [InstanceSpec(lead_time=3, penalty=9, demand="poisson"),
                                 InstanceSpec(lead_time=6, penalty=39, demand="poisson"),
                                 InstanceSpec(lead_time=2, penalty=9, demand="geometric"),
                                 InstanceSpec(lead_time=3, penalty=39, demand="geometric"),
                                 InstanceSpec(lead_time=6, penalty=9, demand="geometric")],
        min_length=1, description="Instances of the held-out split; none of them should be a search instance.")
    validation_instances: Annotated[list[InstanceSpec], AfterValidator(distinct)] | None = Field(
        None, description="Instances of the validation split (scored like the search split, on demand drawn from "
                          "the run's validation secret); None: the search instances, on fresh demand.")
    search_periods: int = Field(250, ge=10, le=100_000, description="Measured periods per search trajectory (after warm-up); also the tuning horizon of validation and held-out instances.")
    validation_periods: int | None = Field(None, ge=10, le=1_000_000, description="Measured periods per fresh validation trajectory (after warm-up); None: search_periods. The validation's start with a high stock on hand (half the warm-up's demand, at most max_order) shows a policy that never works off a high stock at any horizon; heldout_periods would also show one that changes course after the search's horizon, at eight times the periods per validation trajectory.",
                                           json_schema_extra={"fingerprint": False})  # no search score depends on it
    heldout_periods: int = Field(2000, ge=10, le=1_000_000, description="Measured periods per held-out trajectory (after warm-up).")
    warmup: int = Field(200, ge=0, le=100_000, description="Periods simulated before costs are counted, from an empty system.")
    search_trajectories: int = Field(8, ge=1, le=1000, description="Demand trajectories per instance for tuning, and as many fresh ones for the search score (also the tuning data of held-out instances).")
    validation_trajectories: int = Field(4, ge=1, le=1000, description="Demand trajectories per instance of the validation split (tuned on, and as many fresh ones scored, like the search split).")
    heldout_trajectories: int = Field(16, ge=1, le=10_000, description="Fresh demand trajectories per instance for the held-out measurement.")
    tune_trials: int = Field(32, ge=1, le=10_000, description="Optuna trials per instance; the first is the program's PARAMS defaults.")
    tune_batch: int = Field(16, ge=1, le=1000, description="Trials asked at once and simulated together (one round).")
    heldout_tune_trials: int | None = Field(None, ge=1, le=10_000, description="Optuna trials per held-out instance; None: four times tune_trials. The held-out verdict is about a program's policy class, compared with base-stock searched over every level: with three or four parameters, 32 trials left it to the luck of the tuning data (one evolved best measured 1.5% better to 11% worse than optimized base-stock over eight secrets, 1% to 3% better with 128).",
                                            json_schema_extra={"fingerprint": False})  # no search score depends on it
    max_order: int = Field(100, ge=1, le=100_000, description="Orders are rounded to integers and clipped to this.")
    dp_max_lead: int = Field(3, ge=0, le=inventory_dp.MAX_LEAD, description="Largest lead time for which the exact DP optimum is computed for reports (0: none).")
    demand_history: DemandHistory | None = Field(None, description="Your own demand per item and period (CSV or Parquet, relative to the config): the instances become every item x lead time x penalty of this table, their demand resampled from the history (earlier periods for search, validation and tuning; the latest only for the held-out measurement).")

    @model_validator(mode="after")
    def _history_or_instances(self):
        given = sorted({"search_instances", "heldout_instances", "validation_instances"} & self.model_fields_set)
        if self.demand_history is not None and given:
            raise ValueError(f"{', '.join(given)} and demand_history exclude each other: with a demand history the "
                             "instances are its items x lead_times x penalties")
        for field in ("search_instances", "heldout_instances", "validation_instances"):
            if any(s.demand == "empirical" or s.item is not None for s in getattr(self, field) or ()):
                raise ValueError(f"{field}: empirical demand comes from demand_history, not from an instance")
        return self

    def history_instances(self) -> list[InstanceSpec]:
        """Every item x lead time x penalty of the demand history (each split's instances)."""
        h = self.demand_history
        return [InstanceSpec(lead_time=lead, penalty=p, demand="empirical", item=item)
                for item in h.chosen() for lead in h.lead_times for p in h.penalties]

    @model_validator(mode="after")
    def _validation_apart_from_heldout(self):
        shared = {s.key for s in self.validation_instances or ()} & {s.key for s in self.heldout_instances}
        if shared:
            raise ValueError(f"validation_instances {sorted(shared)} are held-out instances; the validation split "
                             "is selected on again and again, so it must not be the held-out split")
        return self

    @property
    def heldout_trials(self) -> int:
        """Optuna trials per held-out instance."""
        return self.heldout_tune_trials or 4 * self.tune_trials


class Inventory(Domain):
    """Lost-sales inventory with lead time on the Zipkin grid."""

    name = "inventory"
    config_model = InventoryConfig
    descriptor_names = ("fill rate", "order CV")

    def __init__(self, config: InventoryConfig):
        self.config = config
        self.simulator = Simulator(config, self.mean_demand)
        self.tuner = Tuner(config, self.simulator)
        self._base_stock: dict[str, list[dict]] = {}

    @property
    def seed_program(self) -> str:
        return SEED_PROGRAM

    def baselines(self) -> dict[str, str]:
        return dict(BASELINES)

    def tunes_params(self) -> bool:
        return self.config.tune_trials > 1  # the first trial is the written defaults

    def motifs(self) -> list[tuple[str, str, tuple]]:
        return list(MOTIFS)

    def output_bounds(self) -> tuple[float | None, float | None]:
        return 0.0, None  # orders: check_orders refuses any below zero

    def sandbox_hide(self) -> tuple[str, ...]:
        return hidden(self.config.demand_history.path) if self.config.demand_history else ()

    def mean_demand(self, spec: InstanceSpec) -> float:
        """The mean demand a policy is told: the configured one, or the item's mean over the search part."""
        if spec.demand != "empirical":
            return self.config.mean_demand
        return float(self.config.demand_history.part(spec.item, heldout=False).mean())

    def _draw(self, spec: InstanceSpec, rng: np.random.Generator, rows: int, periods: int,
              heldout_part: bool = False) -> np.ndarray:
        if spec.demand != "empirical":
            return demand_matrix(spec, self.config.mean_demand, rng, rows, periods)
        history = self.config.demand_history
        return bootstrap(history.part(spec.item, heldout_part), history.block, rng, rows, periods)

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
        return self._draw(spec, rng, rows, cfg.warmup + cfg.search_periods)

    def heldout_demand(self, spec: InstanceSpec) -> np.ndarray:
        """Fresh trajectories of a held-out instance, for the held-out measurement only."""
        cfg = self.config
        rng = self.secrets.generator("heldout", "demand", "measure", spec.key)
        return self._draw(spec, rng, cfg.heldout_trajectories, cfg.warmup + cfg.heldout_periods, heldout_part=True)

    def measure_demand(self, spec: InstanceSpec, split: str) -> np.ndarray:
        """The fresh trajectories `spec` is scored on: the program has not met them in its tuning."""
        if split == "heldout":
            return self.heldout_demand(spec)
        cfg = self.config
        rows = cfg.validation_trajectories if split == "validation" else cfg.search_trajectories
        rng = self.secrets.generator(split, "demand", "measure", spec.key)
        return self._draw(spec, rng, rows, cfg.warmup + self.measured_periods(split))

    def measured_periods(self, split: str) -> int:
        """Measured periods of `split`'s fresh trajectories (validation's: `validation_periods`, else the search's)."""
        cfg = self.config
        if split == "heldout":
            return cfg.heldout_periods
        if split == "validation":
            return cfg.validation_periods or cfg.search_periods
        return cfg.search_periods

    def tuner_seed(self, spec: InstanceSpec, split: str) -> int:
        return self.secrets.seed(split, "tuner", spec.key, bits=32)

    def instances(self, split: str) -> list[InstanceSpec]:
        cfg = self.config
        if cfg.demand_history is not None:
            return cfg.history_instances()
        if split == "validation":
            return list(cfg.validation_instances or cfg.search_instances)
        return list(cfg.search_instances if split == "search" else cfg.heldout_instances)

    # -- scoring ----------------------------------------------------------------------------

    def evaluate(self, policy: PolicyFn, params: dict[str, ParamSpec], split: str) -> Outcome:
        """Tune PARAMS on the tuning trajectories (when there are any), then measure on fresh ones: on
        search within the last tuning round's pass, on validation and held-out (longer) in a pass of its own;
        a validation result that shows the policy running away is INVALID (`_check_stable`)."""
        specs, trials = self.instances(check_split(split)), self.tune_trials(split)
        if not params:
            tuned = [Tuned({}, None)] * len(specs)
        else:
            tuning = [self.tuning_demand(s, split) for s in specs]
            fresh = [self.measure_demand(s, split) for s in specs] if split == "search" else None
            tuned = self.tuner.tune(policy, params, specs, tuning, [self.tuner_seed(s, split) for s in specs],
                                    trials, fresh)
        # validation, held-out, or no PARAMS: the fresh trajectories in a pass of their own (on search they ran in
        # the last tuning round, and are never run again: see Tuner._winner)
        pending = [i for i, t in enumerate(tuned) if t.measured is None]
        runs = self._measure(policy, [specs[i] for i in pending], [tuned[i].values for i in pending], split)
        measured = dict(zip(pending, runs))
        tuned = [Tuned(t.values, measured.get(i, t.measured), t.out_of_range) for i, t in enumerate(tuned)]
        base = self.base_stock(split)
        if split == "validation":
            self._check_stable(specs, tuned, base)
        return self._outcome(specs, tuned, params, base, trials)

    def _check_stable(self, specs, tuned: list[Tuned], base: list[dict]) -> None:
        """INVALID when an instance's validation cost is RUNAWAY times optimized base-stock's on the same
        trajectories: a tuned policy that far behind on data like its tuning's has run away from the
        validation's disturbed start or over its horizon (stock piling up, or orders stopping), which the search's
        trajectories, short and from an empty system, cannot show."""
        for spec, t, ratio in zip(specs, tuned, _cost_ratios(tuned, base)):
            if ratio > RUNAWAY:
                start = self.start_stock(self.measure_demand(spec, "validation"), "validation")
                raise DoesNotHoldUp(
                    f"instance {spec.key}: on the validation split's {len(t.stats.cost)} fresh trajectories of "
                    f"{self.measured_periods('validation')} periods, starting with {start} units on "
                    f"hand, the tuned policy cost {ratio:.3g} times optimized base-stock's (more than {RUNAWAY:g}): it "
                    f"works off a high stock too slowly (not within the {self.config.warmup} warm-up periods) or "
                    "never, or runs away over long horizons (stock or orders diverging)")

    def _measure(self, policy: PolicyFn, specs: list[InstanceSpec], values: list[dict], split: str) -> list:
        """Each instance's parameter `values` on its fresh trajectories of `split`, in a single pass."""
        if not specs:
            return []
        demands = [self.measure_demand(s, split) for s in specs]
        blocks = [Block(s, d, self._fixed(v, len(d)), self.start_stock(d, split))
                  for s, d, v in zip(specs, demands, values)]
        return self.simulator.run(policy, blocks, self.config.warmup)

    def start_stock(self, demand: np.ndarray, split: str) -> int:
        """Stock on hand before a measured trajectory's first period: none (an empty system), but on the
        validation split a disturbance: half the demand of the warm-up (the trajectories' mean), at most
        the largest order (`max_order`). A stable policy works it off within the warm-up, whose costs do
        not count (one that orders half the mean demand or less does so by construction); one with a
        state it never leaves (ordering more than the demand once the stock is high) is seen there,
        however rarely its tuning data reached it. With a short warm-up the disturbance is small."""
        warm = self.config.warmup
        if split != "validation" or not warm:
            return 0
        return int(min(self.config.max_order, demand[:, :warm].sum(axis=1).mean() / 2))

    def tune_trials(self, split: str) -> int:
        """Optuna trials per instance of `split`."""
        return self.config.heldout_trials if split == "heldout" else self.config.tune_trials

    @staticmethod
    def _fixed(values: dict[str, float], rows: int) -> dict[str, np.ndarray]:
        return {n: np.full(rows, float(v)) for n, v in values.items()}

    def base_stock(self, split: str) -> list[dict]:
        """Optimized base-stock per instance: S searched over all integers on the tuning data, then
        measured on the split's fresh trajectories, like every program's tuned parameters. Computed
        once per split and kept."""
        if split not in self._base_stock:
            specs = self.instances(split)
            levels = [self._best_level(s, self.tuning_demand(s, split)) for s in specs]
            runs = self._measure(base_stock_policy, specs, [{"level": lv} for lv in levels], split)
            self._base_stock[split] = [{"level": lv, "costs": st.cost} for lv, st in zip(levels, runs)]
        return self._base_stock[split]

    def _best_level(self, spec: InstanceSpec, demand: np.ndarray) -> int:
        cfg = self.config
        if spec.demand == "empirical":
            top = int(demand.max()) * (spec.lead_time + 1) + 5
        else:
            top = inventory_dp.lead_demand_quantile(spec.demand, cfg.mean_demand, spec.lead_time + 1, 0.9999) + 5
        levels = np.arange(0, min(top, cfg.max_order * (spec.lead_time + 1)) + 1)
        reps = len(demand)
        block = Block(spec, np.tile(demand, (len(levels), 1)), {"level": np.repeat(levels, reps).astype(float)})
        cost = self.simulator.run(base_stock_policy, [block], cfg.warmup)[0].cost.reshape(len(levels), reps)
        return int(levels[int(cost.mean(axis=1).argmin())])

    def _outcome(self, specs, tuned: list[Tuned], params, base: list[dict], trials: int) -> Outcome:
        ratios = _cost_ratios(tuned, base)
        per_instance = {s.key: self._instance_metrics(t, b) for s, t, b in zip(specs, tuned, base)}
        order_cv = [float(np.mean(t.stats.order_std) / max(np.mean(t.stats.order_mean), 1e-9)) for t in tuned]
        fill = [float(np.mean(t.stats.fill)) for t in tuned]
        medians = {n: float(np.clip(np.median([t.values[n] for t in tuned]), p.low, p.high))
                   for n, p in params.items()}
        metrics = {"mean_cost": float(np.mean([t.stats.cost.mean() for t in tuned])),
                   "mean_ratio_to_base_stock": float(np.mean(ratios)), "instances": per_instance,
                   "tune_trials": trials * len(specs) if params else 0,  # all instances' studies
                   "tune_out_of_range": sum(t.out_of_range for t in tuned)}
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
                "params": {k: float(v) for k, v in tuned.values.items()}, "tune_out_of_range": tuned.out_of_range,
                "trajectory_costs": [float(c) for c in st.cost],
                "base_stock_level": base["level"], "base_stock_cost": float(base["costs"].mean()),
                "base_stock_trajectory_costs": [float(c) for c in base["costs"]]}

    # -- reports ----------------------------------------------------------------------------

    def reference(self, split: str) -> dict:
        """Exact DP optimum per instance with lead time <= dp_max_lead (cached on disk)."""
        cfg, optimum = self.config, {}
        specs = self.instances(check_split(split))
        for spec in specs:
            if spec.demand != "empirical" and spec.lead_time <= cfg.dp_max_lead:
                optimum[spec.key] = inventory_dp.cached_solve(spec.demand, cfg.mean_demand, spec.lead_time,
                                                              spec.penalty, cfg.holding).cost
        return {"dp_optimum": optimum, "dp_max_lead": cfg.dp_max_lead, "instances": [s.key for s in specs],
                "without_dp": [s.key for s in specs if s.key not in optimum]}

    def heldout_table(self, results: dict[str, EvalResult], reference: dict):
        return report.heldout_table(self.config, results, reference)

    # -- for LLM prompts ----------------------------------------------------------------------

    def description(self) -> str:
        demand = (f"random demand (mean {self.config.mean_demand:g})" if self.config.demand_history is None else
                  "demand resampled from a real history (its mean is state['mean_demand'])")
        return ("Lost-sales inventory with a lead time. Each period the order placed lead_time periods ago "
                f"arrives, the policy places a new order, then {demand} is met from stock; unmet demand is lost at `penalty` per unit and "
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
