"""The MILP branching domain: generators, real SCIP solves, the policy channel's failure modes."""
import os
import time

import numpy as np
import pydantic
import pytest

from evaluators.domains.milp import instances as milp_instances
from evaluators.sandbox.config import SandboxConfig
from evaluators.evaluator import Evaluator
from evaluators.domains.milp.programs import BASELINES
from evaluators.domains.milp.report import head_to_head
from evaluators.domains.milp.scip import solve
from evaluators.params import read_params
from evaluators.registry import get_domain
from evaluators.secrets import RunSecrets
from store.records import EvalResult, Status

# Set cover: search instances 1 and 2 and held-out instance 3 of the streams of replay seed 2024 (all of them
# branch; a drawn secret's small instances are sometimes solved at the root), one SCIP seed.
FIXED = RunSecrets.fixed(2024)
TINY = {"search_size": "fast", "heldout_size": "fast", "search_instances": 2, "heldout_instances": 1,
        "search_offset": 1, "heldout_offset": 3, "scip_seeds": 1, "time_limit_s": 20,
        "reference_rules": ["scip default"]}
HANG = "import numpy as np\n\ndef policy(state, params):\n    while True:\n        pass\n"
HANG_LATER = ("import numpy as np\nimport time\n\ndef policy(state, params):\n    if state['n_nodes'] > 3:\n"
              "        time.sleep(3600)\n    return state['infeasibility']\n")
NAN = "import numpy as np\n\ndef policy(state, params):\n    return np.full(state['n_cands'], np.nan)\n"
SHORT = "import numpy as np\n\ndef policy(state, params):\n    return np.ones(state['n_cands'] - 1)\n"
SCALAR = "def policy(state, params):\n    return 1.0\n"
CRASH = "def policy(state, params):\n    raise ValueError('no branching today')\n"


def in_process(code):
    """Run a trusted test program directly (the domain only ever sees a PolicyFn)."""
    namespace = {}
    exec(code, namespace)
    fn = namespace["policy"]
    return lambda batches: [fn(state, params) for state, params in batches]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator("milp", TINY, SandboxConfig(wall_s=60), secrets=FIXED)


@pytest.mark.parametrize("family", milp_instances.FAMILIES)
def test_generators_are_deterministic_by_seed(family):
    first = milp_instances.generate(family, "fast", 3)
    assert first == milp_instances.generate(family, "fast", 3)
    assert first != milp_instances.generate(family, "fast", 4)
    path = milp_instances.instance_path(family, "fast", 3)
    assert path.read_text() == first
    stamp = path.stat().st_mtime_ns
    assert milp_instances.instance_path(family, "fast", 3).stat().st_mtime_ns == stamp  # cached, not rewritten
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]


@pytest.mark.parametrize("family, sense", [("setcover", "minimize"), ("cauctions", "maximize"),
                                           ("facility", "minimize"), ("indset", "maximize")])
def test_every_family_is_feasible_and_solves(family, sense):
    record = solve(str(milp_instances.instance_path(family, "fast", 0)), 0, 60)
    assert record.solved and record.status == "optimal"
    assert milp_instances.generate(family, "fast", 0).startswith(sense)


def test_set_cover_covers_every_row_with_at_least_two_rows_per_column():
    text = milp_instances.generate("setcover", "fast", 0)
    rows = [line for line in text.split("subject to\n")[1].split("binary")[0].replace("\n   ", "").splitlines()]
    spec = milp_instances.SIZES["setcover"]["fast"]
    assert len(rows) == spec["rows"] and all(r.endswith(">= 1") and "x" in r for r in rows)
    per_col = np.bincount([int(t[1:]) for r in rows for t in r.split() if t.startswith("x")], minlength=spec["cols"])
    expected = spec["rows"] * spec["cols"] * spec["density"]
    assert per_col.min() >= 2 and per_col.sum() == pytest.approx(expected, rel=0.05)


def test_most_infeasible_needs_more_nodes_than_pscost_on_fixed_instances():
    paths = [str(milp_instances.instance_path("setcover", "fast", s)) for s in (1, 2)]
    nodes = {name: [solve(p, 0, 60, policy=in_process(BASELINES[name])).nodes for p in paths]
             for name in ("pscost", "most-infeasible")}
    assert sum(nodes["most-infeasible"]) > 2 * sum(nodes["pscost"]) > 2 * len(paths), nodes


def sleepy(seconds):
    """An in-process rule that waits `seconds` per decision: wall time, no CPU time."""
    def policy(batches):
        time.sleep(seconds)
        return [state["infeasibility"] for state, _ in batches]
    return policy


def test_nodes_without_a_solved_lp_are_left_to_scips_own_rules():
    """With the LP never solved, SCIP branches every node on its pseudo solution: the policy (LP
    candidates only) declines, SCIP's rules branch, and the solve ends normally."""
    from evaluators.domains.milp.scip import POLICY_PRIORITY, PolicyBranchrule, new_model

    model = new_model(str(milp_instances.instance_path("setcover", "fast", 1)), 0, 5.0)
    model.setParam("lp/solvefreq", -1)
    model.setParam("limits/nodes", 50)
    rule = PolicyBranchrule(sleepy(0.0), {})
    model.includeBranchrule(rule, "atoll_policy", "test", priority=POLICY_PRIORITY, maxdepth=-1, maxbounddist=1.0)
    model.optimize()  # raised "SCIP: unspecified error!" when the rule did not answer for pseudo solutions
    assert rule.error is None and rule.calls == 0
    assert model.getStatus() in ("nodelimit", "optimal") and model.getNNodes() > 1
    model.freeProb()


def test_the_cpu_clock_charges_the_wait_on_the_policy():
    path = str(milp_instances.instance_path("setcover", "fast", 1))
    wall = solve(path, 0, 60, policy=sleepy(0.02), clock="wall")
    cpu = solve(path, 0, 60, policy=sleepy(0.02), clock="cpu")
    assert wall.solved and cpu.solved and wall.nodes == cpu.nodes and cpu.calls > 5
    assert cpu.policy_s >= 0.02 * cpu.calls
    assert cpu.time_s >= cpu.policy_s  # the sleeps are not on SCIP's CPU clock, yet they are charged
    with pytest.raises(ValueError, match="unknown clock"):
        solve(path, 0, 60, clock="sundial")


def spinning(seconds):
    """An in-process rule that spends `seconds` of this process's user time per decision (as the channel
    does, on a smaller scale, packing requests and reading replies)."""
    import resource

    def policy(batches):
        end, x = resource.getrusage(resource.RUSAGE_SELF).ru_utime + seconds, 0
        while resource.getrusage(resource.RUSAGE_SELF).ru_utime < end:
            for i in range(20_000):
                x += i
        return [state["infeasibility"] for state, _ in batches]
    return policy


def test_the_cpu_clock_charges_the_trusted_sides_own_work_in_a_call_once():
    """SCIP's CPU clock (this process's user time) already holds what the evaluator's process spends
    in user mode inside a policy call; adding the call's whole wait on top charged that work twice."""
    path = str(milp_instances.instance_path("setcover", "fast", 1))
    base = solve(path, 0, 60, policy=sleepy(0.0))
    spun = solve(path, 0, 60, policy=spinning(0.03))
    assert base.solved and spun.solved and spun.nodes == base.nodes and spun.calls == base.calls > 5
    extra, waited, spent = spun.time_s - base.time_s, spun.policy_s - base.policy_s, 0.03 * spun.calls
    assert abs(extra - waited) < spent / 2, (extra, waited, spent)  # extra was waited + spent: charged twice


@pytest.mark.parametrize("clock", ["cpu", "wall"])
def test_a_slow_rule_is_stopped_at_the_time_limit_on_either_clock(clock):
    path = str(milp_instances.instance_path("setcover", "fast", 1))
    start = time.perf_counter()
    record = solve(path, 0, 0.5, policy=sleepy(0.2), clock=clock)
    assert not record.solved and record.status == "timelimit" and record.time_s == 0.5
    assert record.calls <= 4 and time.perf_counter() - start < 5


def test_evaluation_reports_per_run_figures_and_a_score_against_scip_default(evaluator):
    result = evaluator.evaluate("pscost", BASELINES["pscost"], "search")
    assert result.status == Status.OK, result.error
    m = result.metrics
    assert len(m["per_run"]) == m["runs"] == 2 and m["unsolved"] == 0 and m["policy_calls"] > 0
    assert result.score == pytest.approx(-m["time_ratio_to_default"])
    assert m["sgm_time_s"] / m["default_sgm_time_s"] == pytest.approx(m["time_ratio_to_default"])
    assert len(result.instance_scores) == 2 and len(result.descriptors) == 2
    assert 0.0 <= result.descriptors[1] <= 1.0


def test_heldout_instances_are_generated_only_by_heldout_evaluations(evaluator, tmp_path):
    seeds = {split: [s for _, s in evaluator.domain.labels(split)] for split in ("search", "validation", "heldout")}
    evaluator.evaluate("pscost", BASELINES["pscost"], "search")
    made = sorted(p.name for p in (tmp_path / "cache").rglob("*.lp"))
    assert made and all(name.endswith(tuple(f"-s{s}.lp" for s in seeds["search"])) for name in made), made
    evaluator.evaluate("pscost", BASELINES["pscost"], "heldout")
    assert any(p.name.endswith(f"-s{seeds['heldout'][0]}.lp") for p in (tmp_path / "cache").rglob("*.lp"))
    assert not any(p.name.endswith(f"-s{seeds['validation'][0]}.lp") for p in (tmp_path / "cache").rglob("*.lp"))


def test_instances_and_scip_seeds_derive_from_the_run_secrets():
    domain, twin = get_domain("milp", **TINY, secrets=FIXED), get_domain("milp", **TINY, secrets=FIXED)
    runs = {split: domain.runs(split) for split in ("search", "validation", "heldout")}
    assert all(twin.runs(split) == r for split, r in runs.items())  # one run: the same instances
    seeds = {split: {s for _, s in domain.labels(split)} for split in runs}
    assert len(set.union(*seeds.values())) == sum(map(len, seeds.values()))  # no instance in two splits
    assert min(set.union(*seeds.values())) >= 2 ** 32  # no small, guessable generator seed
    labels = [run.label for run in runs["search"]]
    assert labels == ["setcover-fast-search-1", "setcover-fast-search-2"]  # labels never carry the seed
    other = get_domain("milp", **TINY)  # drawn secrets: another run's instances and SCIP seeds
    assert not {s for _, s in other.labels("search")} & seeds["search"]
    assert [r.shift for r in other.runs("search")] != [r.shift for r in runs["search"]]


@pytest.mark.parametrize("options", [{}, {"search_default": "cached"}, {"tune_trials": 2}],
                         ids=["paired", "cached", "tuned"])
def test_no_process_of_the_program_runs_while_scip_default_is_timed(monkeypatch, options):
    """A program that loads the machine between its solves (a child it forked, code run at load)
    would slow the default it is compared with: its process is stopped before each default solve."""
    from evaluators.domains.milp import domain as milp_domain

    seen, alive_at_default = [], []

    def spy(path, scip_seed, time_limit_s, builtin=None, policy=None, **kw):
        if policy is not None:
            seen.append(policy)
        elif builtin is None:
            alive_at_default.append(any(p.alive for p in seen))
        return solve(path, scip_seed, time_limit_s, builtin=builtin, policy=policy, **kw)

    monkeypatch.setattr(milp_domain, "solve", spy)
    evaluator = Evaluator("milp", dict(TINY, **options), SandboxConfig(wall_s=60), secrets=FIXED)
    result = evaluator.evaluate("seed", evaluator.domain.seed_program, "search")
    assert result.status == Status.OK, result.error
    assert seen and alive_at_default and not any(alive_at_default), alive_at_default


def test_a_tuned_program_is_scored_on_a_pass_of_its_own_against_the_paired_default(monkeypatch):
    """The best trial's times are the least of several noisy measurements: they pick the values,
    and one more pass with them, each run paired with SCIP default, is the score."""
    from evaluators.domains.milp import domain as milp_domain

    solves = []

    def spy(path, scip_seed, time_limit_s, builtin=None, policy=None, params=None, **kw):
        record = solve(path, scip_seed, time_limit_s, builtin=builtin, policy=policy, params=params, **kw)
        solves.append(("program" if policy is not None else "default", params, record))
        return record

    monkeypatch.setattr(milp_domain, "solve", spy)
    evaluator = Evaluator("milp", dict(TINY, tune_trials=3), SandboxConfig(wall_s=90), secrets=FIXED)
    result = evaluator.evaluate("seed", evaluator.domain.seed_program, "search")
    assert result.status == Status.OK, result.error
    runs = len(evaluator.domain.runs("search"))
    assert [kind for kind, _, _ in solves].count("program") == 4 * runs  # three trials, then the scored pass
    last = solves[-2 * runs:]
    assert [kind for kind, _, _ in last] == ["program", "default"] * runs
    assert all(params == result.tuned_params for kind, params, _ in last if kind == "program")
    scored = [v for row in result.metrics["per_run"] for v in (row["time_s"], row["default_time_s"])]
    assert scored == pytest.approx([record.time_s for _, _, record in last], abs=0.01)  # per_run rounds


def test_validation_scores_like_search_on_instances_of_its_own(evaluator):
    search = evaluator.evaluate("pscost", BASELINES["pscost"], "search")
    validation = evaluator.evaluate("pscost", BASELINES["pscost"], "validation")
    assert validation.status == Status.OK, validation.error
    assert [r["instance"] for r in validation.metrics["per_run"]] == [f"setcover-fast-validation-{k}" for k in (0, 1)]
    assert validation.score == pytest.approx(-validation.metrics["time_ratio_to_default"])
    assert validation.metrics["per_run"] != search.metrics["per_run"]


@pytest.mark.parametrize("code", [HANG, HANG_LATER], ids=["first call", "after some calls"])
def test_a_hanging_rule_is_killed_by_the_wall_limit(code):
    evaluator = Evaluator("milp", TINY, SandboxConfig(wall_s=4, startup_s=10), secrets=FIXED)
    result = evaluator.evaluate("hang", code, "search")
    assert result.status == Status.TIMEOUT and "wall-clock limit of 4 s" in result.error
    assert result.duration_s < 30


@pytest.mark.parametrize("code, needle", [(NAN, "not finite"), (SHORT, "expected ("), (SCALAR, "shape ();")],
                         ids=["nan", "one short", "scalar"])
def test_bad_scores_are_invalid_with_a_reason(evaluator, code, needle):
    result = evaluator.evaluate("bad", code, "search")
    assert result.status == Status.INVALID
    assert needle in result.error and "decision 1" in result.error


def test_a_raising_rule_fails_with_its_error(evaluator):
    result = evaluator.evaluate("crash", CRASH, "search")
    assert result.status == Status.FAILED and "no branching today" in result.error


def test_tuning_starts_from_the_defaults_and_stays_in_range():
    domain = get_domain("milp", **dict(TINY, search_instances=1, tune_trials=2), secrets=FIXED)
    seed = domain.seed_program
    params = read_params(seed)
    outcome = domain.evaluate(in_process(seed), params, "search")
    assert set(outcome.tuned_params) == set(params)
    assert all(params[n].low <= v <= params[n].high for n, v in outcome.tuned_params.items())


def test_config_names_bad_sizes_and_has_no_public_seed():
    with pytest.raises(pydantic.ValidationError, match="huge"):
        get_domain("milp", search_size="huge")
    with pytest.raises(pydantic.ValidationError, match="heldout_seed"):
        get_domain("milp", heldout_seed=1)


def test_the_instance_cache_is_hidden_from_candidates():
    domain = get_domain("milp", **TINY)
    assert domain.sandbox_hide() == (os.path.join(os.environ["ATOLL_CACHE_DIR"]),)


def test_the_evolved_best_is_compared_with_each_program_run_by_run():
    def result(times, nodes):
        runs = [{"instance": f"i{k}", "scip_seed": 0, "time_s": t, "nodes": n, "default_time_s": 5.0,
                 "default_nodes": 10} for k, (t, n) in enumerate(zip(times, nodes))]
        return EvalResult("p", "heldout", Status.OK, score=0.0, metrics={"per_run": runs})

    rng = np.random.default_rng(0)
    base = rng.uniform(2.0, 8.0, size=8)
    results = {"evolved best": result(base * 0.8, [50] * 8), "pscost": result(base, [100] * 8),
               "twin": result(base * 0.8 * rng.uniform(0.9, 1.1, size=8), [50] * 8),
               "broken": EvalResult("q", "heldout", Status.TIMEOUT, error="killed")}
    notes = {note.split("'")[1]: note for note in head_to_head(results, shift=1.0)}
    assert set(notes) == {"pscost", "twin"}
    assert "faster on 8/8 runs: faster" in notes["pscost"] and "nodes 0.5" in notes["pscost"]
    assert "not measurably different" in notes["twin"]
    assert head_to_head({"pscost": results["pscost"]}, shift=1.0) == []
