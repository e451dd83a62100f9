"""MILP branching: evolve SCIP's variable-selection rule, scored by solve time against SCIP's default.

SCIP runs in the trusted evaluator process (`milp_scip`); the candidate only
scores LP branching candidates, one sandbox round trip per branching decision.
Instances come from the project's own generators (`milp_instances`, Gasse et
al. 2019 families), cached as `.lp` files. Each instance is solved with several
SCIP seeds under a fixed protocol (cuts at the root only, no restarts, one
thread, a time limit).

Score: minus the shifted geometric mean (shift `time_shift_s`) of solve time
over every (instance, SCIP seed) run, divided by the same mean for SCIP's
default rule (relpscost) on the same runs; unsolved runs count at the time
limit. The default's runs are measured by this domain object, in the same
process, so load conditions match: on the search split once (lazily, after the
first program's runs, kept in memory); on the held-out split each run is by
default re-solved with SCIP's default right after the program's run. With tuning
(`tune_trials` > 1) the best trial only picks the PARAMS values; the score is one
more pass with them. Held-out instances (optionally
of another size) are generated only inside held-out evaluations and reference
measurements. Instance generator seeds and SCIP seed shifts derive from the
run's secrets (`evaluators.secrets`), one per split: a candidate cannot
regenerate its instances, and every program of a run meets the same ones. The
validation split scores like the search split on instances of its own.

Every solve with the program is answered by a process of it that has seen no
earlier solve (`_base.renew`): an instance comes back under each SCIP seed and in
every tuning trial, so a rule that carried what it learned of one solve (the
tree, the optimum) into the next could buy time it did not earn.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np
import optuna
from pydantic import BaseModel, ConfigDict, Field, model_validator

from evaluators.domains.milp import instances as milp_instances
from evaluators.domains.milp import report as milp_report
from evaluators._base import Domain, Outcome, PolicyFn, check_split, renew, retire
from evaluators.domains.milp.programs import BASELINES, MOTIFS, SEED_PROGRAM
from evaluators.domains.milp.scip import BUILTIN_RULES, SolveRecord, solve
from evaluators.domains.milp.user_instances import InstanceFolder
from evaluators.params import ParamSpec
from evaluators.tuning import distributions, new_study
from evaluators.userdata import hidden
from store.records import EvalResult

NODE_SHIFT = 10.0


class Run(NamedTuple):
    """One solve of a split: an instance (label, .lp path) with its k-th SCIP seed (`shift`, secret)."""

    label: str
    path: str
    scip_seed: int  # k: which of the instance's SCIP seeds (what reports show)
    shift: int  # randomization/randomseedshift of that seed, drawn from the run's secret


class MilpConfig(BaseModel):
    """Options of the MILP branching domain (the `[domain.options]` table)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    family: Literal["setcover", "cauctions", "facility", "indset"] = Field(
        "setcover", description="Instance family (Gasse et al. 2019 generators).")
    search_size: str = Field("small", description="Size of search instances: fast, small, standard or large "
                                                  "(see milp_instances.SIZES).")
    heldout_size: str = Field("small", description="Size of held-out instances; a larger one tests transfer.")
    search_instances: int = Field(3, ge=1, le=1000, description="Instances in the search split.")
    validation_instances: int = Field(2, ge=1, le=1000, description="Instances in the validation split (size "
                                                                   "search_size, scored like the search split).")
    heldout_instances: int = Field(5, ge=1, le=1000, description="Instances in the held-out split.")
    search_offset: int = Field(0, ge=0, le=99_000, description="Index of the first search instance in the search "
                                                               "split's stream of instances (the stream itself is "
                                                               "secret; this only picks other instances of it).")
    validation_offset: int = Field(0, ge=0, le=99_000, description="Index of the first validation instance in its "
                                                                   "stream.")
    heldout_offset: int = Field(0, ge=0, le=99_000, description="Index of the first held-out instance in its stream.")
    scip_seeds: int = Field(2, ge=1, le=100, description="SCIP seeds per instance (each run's "
                                                        "randomization/randomseedshift drawn from the run's secret).")
    time_limit_s: float = Field(20.0, gt=0, le=3600, description="SCIP time limit per solve; unsolved runs count "
                                                                "at this time.")
    clock: Literal["cpu", "wall"] = Field(
        "cpu", description="Solve-time clock: 'cpu' is SCIP's CPU clock plus the policy's waits (steady when "
                           "other processes share the machine), 'wall' is SCIP's wall clock.")
    time_shift_s: float = Field(1.0, ge=0, le=100, description="Shift of the geometric mean of solve times.")
    tune_trials: int = Field(0, ge=0, le=1000, description="Optuna trials over PARAMS on the search split (each "
                                                          "solves every search run; 0 or 1: use the written "
                                                          "defaults); the score is one more pass with the best "
                                                          "trial's values, against the default as search_default "
                                                          "says.")
    search_default: Literal["paired", "cached"] = Field(
        "paired", description="SCIP default on search runs: 'paired' re-solves each run with the default right "
                              "after the program's run (twice the cost, but load drift cancels), 'cached' "
                              "measures it once per domain object (cheaper, biased when the load changes).")
    heldout_default: Literal["paired", "cached"] = Field(
        "paired", description="SCIP default on held-out runs: 'paired' re-solves each run with the default right "
                              "after the program's run (same load), 'cached' measures it once per domain object.")
    reference_rules: list[Literal["scip default", "scip pscost", "scip fullstrong"]] = Field(
        default_factory=lambda: list(BUILTIN_RULES), description="SCIP built-in rules measured as reference rows.")
    instances: InstanceFolder | None = Field(None, description="Your own instances instead of the generated ones: a "
                                             "folder of .mps or .lp files (relative to the config), split into "
                                             "search, validation and held-out files by its stated rule.")

    @model_validator(mode="after")
    def _own_or_generated(self):
        generated = {"family", "search_size", "heldout_size", "search_instances", "validation_instances",
                     "heldout_instances", "search_offset", "validation_offset", "heldout_offset"}
        given = sorted(generated & self.model_fields_set)
        if self.instances is not None and given:
            raise ValueError(f"{', '.join(given)} describe generated instances; with your own instances the "
                             "folder's split rule decides (see instances.heldout_share)")
        return self

    @model_validator(mode="after")
    def _check(self):
        sizes = milp_instances.SIZES[self.family]
        for field in ("search_size", "heldout_size"):
            if getattr(self, field) not in sizes:
                raise ValueError(f"{field} {getattr(self, field)!r} is not a size of {self.family}; "
                                 f"choose one of {', '.join(sizes)}")
        return self


def sgm(values, shift: float) -> float:
    """Shifted geometric mean: exp(mean(log(v + shift))) - shift."""
    v = np.asarray(values, dtype=float)
    return float(np.exp(np.mean(np.log(v + shift))) - shift)


class Milp(Domain):
    """Branching-variable selection in SCIP on one generated instance family."""

    name = "milp"
    config_model = MilpConfig
    descriptor_names = ("log node ratio to default", "chosen infeasibility x 2")
    racing = True  # the search split without tuning; with tune_trials > 1 the tuned pass runs in full

    def __init__(self, config: MilpConfig):
        self.config = config
        self._builtin: dict[tuple[str, str], list[SolveRecord]] = {}

    @property
    def seed_program(self) -> str:
        return SEED_PROGRAM

    def baselines(self) -> dict[str, str]:
        return dict(BASELINES)

    def tunes_params(self) -> bool:
        return self.config.tune_trials > 1  # the first trial is the written defaults

    def motifs(self) -> list[tuple[str, str, tuple]]:
        return list(MOTIFS)

    def sandbox_hide(self) -> tuple[str, ...]:
        own = hidden(self.config.instances.path) if self.config.instances else ()
        return (str(milp_instances.cache_dir()),) + own

    # -- data -------------------------------------------------------------------------------
    # An instance is a pure function of its generator seed, and each split's seeds derive from
    # the run's secret of that split (common to every program of the run, unknown to them),
    # as do the SCIP seed shifts. Labels name the split and index, never the seed.

    def _size(self, split: str) -> str:
        return self.config.heldout_size if split == "heldout" else self.config.search_size

    def labels(self, split: str) -> list[tuple[str, int]]:
        """(label, generator seed) of each instance of `split`; nothing is generated. Your own files: (name, 0)."""
        if self.config.instances is not None:
            return [(Path(path).name, 0) for path in self._own_files(split)]
        cfg, size = self.config, self._size(split)
        first, count = {"search": (cfg.search_offset, cfg.search_instances),
                        "validation": (cfg.validation_offset, cfg.validation_instances),
                        "heldout": (cfg.heldout_offset, cfg.heldout_instances)}[split]
        return [(f"{cfg.family}-{size}-{split}-{k}", self.secrets.seed(split, "instance", cfg.family, size, k, bits=63))
                for k in range(first, first + count)]

    def _own_files(self, split: str) -> list[str]:
        splits = self.config.instances.splits()
        return splits[split] or splits["search"]  # no validation files: the search files, other SCIP seeds

    def instances(self, split: str) -> list[tuple[str, str]]:
        """(label, .lp path) of each instance of `split`, generated here on first use (or your own files)."""
        if self.config.instances is not None:
            return [(Path(path).name, path) for path in self._own_files(split)]
        return [(label, str(milp_instances.instance_path(self.config.family, self._size(split), s)))
                for label, s in self.labels(split)]

    def runs(self, split: str) -> list[Run]:
        return [Run(label, path, k, self.secrets.seed(split, "scip", label, k, bits=30))
                for label, path in self.instances(split) for k in range(self.config.scip_seeds)]

    def builtin(self, rule: str, split: str) -> list[SolveRecord]:
        """A SCIP built-in rule's runs on `split`, measured once per domain object."""
        if (rule, split) not in self._builtin:
            self._builtin[(rule, split)] = [solve(run.path, run.shift, self.config.time_limit_s,
                                                  builtin=BUILTIN_RULES[rule], clock=self.config.clock)
                                            for run in self.runs(split)]
        return self._builtin[(rule, split)]

    # -- scoring ----------------------------------------------------------------------------

    def evaluate(self, policy: PolicyFn, params: dict[str, ParamSpec], split: str, race=None) -> Outcome:
        """`race` (search split, no tuning): a look after each instance's runs (`evaluators.racing`)."""
        runs = self.runs(check_split(split))
        values = {n: p.default for n, p in params.items()}
        searchlike = split != "heldout"  # validation: the search protocol on its own instances
        paired = (self.config.search_default if searchlike else self.config.heldout_default) == "paired"
        if searchlike and params and self.tunes_params():
            # the best trial only picks the values: its own times, the least of several noisy
            # measurements, would favour a program for having PARAMS at all
            values, race = self._tune(policy, params, runs, split), None  # tuned: never raced
        records, default = self._solve_runs(policy, values, runs, split, paired, race)
        if paired:
            return self._outcome(runs, records, default, values)
        # measured after the program's runs, never before its first call: a program cannot
        # load the machine while the default is timed and stop when its own runs begin
        return self._outcome(runs, records, self.builtin("scip default", split), values)

    def _solve_runs(self, policy, values, runs, split, paired, race) -> tuple[list[SolveRecord], list[SolveRecord]]:
        """The program's runs; paired: each then at once with SCIP default, under the same load.

        With a race, the instances in the race's order (`Race.shuffle`), a look after each
        instance's runs at the per-instance scores so far; the records kept in the runs' order.
        """
        limit, clock = self.config.time_limit_s, self.config.clock
        labels = list(dict.fromkeys(run.label for run in runs))
        order = race.shuffle(len(labels), self.secrets) if race is not None else range(len(labels))
        records, default, done = [None] * len(runs), [None] * len(runs), []
        for k in order:
            for i, run in enumerate(runs):
                if run.label != labels[k]:
                    continue
                records[i] = self._solve_program(policy, values, run)
                if paired:
                    default[i] = solve(run.path, run.shift, limit, clock=clock)
                done.append(i)
            if race is not None:
                ref = default if paired else self.builtin("scip default", split)
                race.look(self._instance_scores([runs[i] for i in done], [records[i] for i in done],
                                                [ref[i] for i in done]), len(labels))
        return records, default if paired else []

    def _solve_all(self, policy, values, runs) -> list[SolveRecord]:
        return [self._solve_program(policy, values, run) for run in runs]

    def _solve_program(self, policy, values, run: Run) -> SolveRecord:
        """One solve of `run` with the program, in a process of it that remembers no earlier solve.

        Its process is stopped once the solve ends: SCIP's default, timed next (paired, or cached
        after the first runs), never runs beside the program, which could slow it.
        """
        renew(policy)
        record = solve(run.path, run.shift, self.config.time_limit_s, policy=policy, params=values,
                       clock=self.config.clock)
        retire(policy)
        return record

    def _tune(self, policy, params, runs, split) -> dict:
        """The best trial's values: Optuna (TPE, seeded from the split's secret) over PARAMS, each trial
        against the cached default; the first trial is the written defaults."""
        seed = self.secrets.seed(split, "tuner", self.config.family, bits=32)
        study = new_study(params, optuna.samplers.TPESampler(seed=seed), direction="maximize")
        dists = distributions(params)
        best = None
        for _ in range(self.config.tune_trials):
            trial = study.ask(dists)
            records = self._solve_all(policy, dict(trial.params), runs)
            ratio = self._ratios(records, self.builtin("scip default", split))[0]
            study.tell(trial, -ratio)
            if best is None or ratio < best[0]:
                best = (ratio, dict(trial.params))
        return best[1]

    def _ratios(self, records, default) -> tuple[float, float]:
        shift = self.config.time_shift_s
        time_ratio = sgm([r.time_s for r in records], shift) / max(sgm([d.time_s for d in default], shift), 1e-9)
        node_ratio = sgm([r.nodes for r in records], NODE_SHIFT) / sgm([d.nodes for d in default], NODE_SHIFT)
        return time_ratio, node_ratio

    def _instance_scores(self, runs, records, default) -> list[float]:
        """Minus each instance's time ratio to SCIP default, over its SCIP seeds (the first len(runs) runs)."""
        labels = list(dict.fromkeys(run.label for run in runs))
        return [-self._ratios(*zip(*[(records[i], default[i]) for i, run in enumerate(runs) if run.label == label]))[0]
                for label in labels]

    def _outcome(self, runs, records, default, values) -> Outcome:
        shift = self.config.time_shift_s
        time_ratio, node_ratio = self._ratios(records, default)
        per_instance = self._instance_scores(runs, records, default)
        total_time = sum(r.time_s for r in records)
        calls = sum(r.calls for r in records)
        chosen = [r.chosen_infeasibility for r in records if r.calls]
        metrics = {"sgm_time_s": sgm([r.time_s for r in records], shift),
                   "sgm_nodes": sgm([r.nodes for r in records], NODE_SHIFT),
                   "time_ratio_to_default": time_ratio, "node_ratio_to_default": node_ratio,
                   "default_sgm_time_s": sgm([d.time_s for d in default], shift),
                   "default_sgm_nodes": sgm([d.nodes for d in default], NODE_SHIFT),
                   "wins_vs_default": sum(r.time_s < d.time_s for r, d in zip(records, default)),
                   "runs": len(records), "unsolved": sum(not r.solved for r in records),
                   "policy_calls": calls, "policy_time_share": sum(r.policy_s for r in records) / max(total_time, 1e-9),
                   "per_run": [milp_report.run_row(run, r, d) for run, r, d in zip(runs, records, default)]}
        descriptors = (float(np.clip(math.log(node_ratio), -5.0, 5.0)),
                       float(2.0 * np.mean(chosen)) if chosen else 0.0)
        return Outcome(score=-time_ratio, metrics=metrics, instance_scores=tuple(per_instance),
                       descriptors=descriptors, tuned_params=dict(values))

    # -- reports ----------------------------------------------------------------------------

    def reference(self, split: str) -> dict:
        """SCIP's built-in rules on `split`, measured here: per-run times and nodes, per rule."""
        runs = self.runs(check_split(split))
        return {"rules": {rule: [milp_report.run_row(run, r, d) for run, r, d in
                                 zip(runs, self.builtin(rule, split), self.builtin("scip default", split))]
                          for rule in self.config.reference_rules},
                "time_shift_s": self.config.time_shift_s, "time_limit_s": self.config.time_limit_s}

    def heldout_table(self, results: dict[str, EvalResult], reference: dict):
        return milp_report.heldout_table(self.config, [label for label, _ in self.labels("heldout")],
                                         results, reference)

    # -- for LLM prompts ----------------------------------------------------------------------

    def description(self) -> str:
        kind = self.config.family if self.config.instances is None else "the user's own"
        return (f"Branching-variable selection in the MILP solver SCIP on {kind} instances. At each "
                "branching decision the policy scores the LP candidates and SCIP branches on the highest score. "
                "The score is minus the shifted geometric mean of solve time relative to SCIP's default rule "
                "(-1.0 ties it; -0.8 is 20% faster). Small trees help only if the rule is cheap to compute.")

    def contract(self) -> str:
        return ("Define policy(state, params) -> one score per candidate (a float array of length "
                "state['n_cands']). Per-candidate arrays: lp_value, frac, infeasibility, ps_down, ps_up, "
                "ps_count_down, ps_count_up, ps_score, obj, locks_down, locks_up, col_nnz, lb, ub; node scalars: "
                "depth, n_nodes, n_cands, node_bound, lp_obj, primal_bound, gap, root_bound (1e20 is infinity), "
                "maximize. params[name] is a scalar per PARAMS entry. Scores must be finite. Use numpy only.")
