"""The built-in domains on a user's own data: each runs evaluations on a small file the test makes,
through the real evaluator and sandbox (real SCIP, real gymnasium); the data stay out of the
candidate's sight, and a run's stored config pins them by content."""
import json

import numpy as np
import pytest

from controller.config import ConfigError, load_config, validate
from evaluators.check import Checker
from evaluators.evaluator import Evaluator
from evaluators.registry import DomainConfig, get_domain
from evaluators.sandbox.config import SandboxConfig
from evaluators.secrets import RunSecrets
from store.records import Status
from tests.userdata_files import (INVENTORY, TRADING, write_demand, write_instances, write_prices,
                                  write_prices_long_parquet)

LIMITS = SandboxConfig()
SECRETS = RunSecrets.fixed(7)
TRADING_OPTIONS = {"market": "file", "lookback": 253, "tune_bars": 60, "test_bars": 30, "holdout_bars": 40,
                   "tune_trials": 2}
INVENTORY_OPTIONS = {"search_periods": 100, "heldout_periods": 100, "warmup": 20, "search_trajectories": 2,
                     "validation_trajectories": 2, "heldout_trajectories": 2, "tune_trials": 4, "tune_batch": 4}


def test_trading_walks_forward_on_a_wide_csv_and_a_long_parquet(tmp_path):
    options = dict(TRADING_OPTIONS, prices=str(write_prices(tmp_path / "prices.csv")))
    evaluator = Evaluator("trading", options, LIMITS, secrets=SECRETS)
    domain = evaluator.domain
    assert domain.market.names == ("ACME", "BOLT", "CORE") and len(domain.market.dates) == 420
    assert len(domain.folds) == 2 and domain.holdout.test.stop == 420
    assert domain.market_of("validation").names[0] == "ACME (resampled)"  # no validation assets: a resample
    for split in ("search", "validation", "heldout"):
        result = evaluator.evaluate("seed", domain.seed_program, split)
        assert result.status == Status.OK, result.error
    assert result.metrics["period"][1] == str(domain.market.dates[-1])  # the holdout ends on the file's last day
    parquet = dict(TRADING_OPTIONS, prices=str(write_prices_long_parquet(tmp_path / "prices.parquet")),
                   validation_assets=["DYNA"])
    long = get_domain("trading", secrets=SECRETS, **parquet)
    assert long.market.names == ("ACME", "BOLT", "CORE") and long.market_of("validation").names == ("DYNA",)


def test_atoll_check_takes_a_price_file_for_public_data_not_for_a_stream_from_a_public_seed(tmp_path):
    """Real history scores alike under any secrets by design: the check says so and passes (it told the
    user to draw the prices from an rng, and `atoll check` exited 1 on configs/trading_sp500.toml too)."""
    options = dict(TRADING_OPTIONS, prices=str(write_prices(tmp_path / "prices.csv")))
    check = Checker(DomainConfig(name="trading", options=options), LIMITS).depends_on_secrets()
    assert check.passed and "real price history" in check.detail and "prices.csv" in check.detail, check.detail

def remembering_policy():
    """A cheat: remember the return that followed each 5-bar run of returns met so far, and trade on it
    when the same run comes again (its own memory, like a module global of a candidate's)."""
    memory = {}

    def policy(state, params):
        r = np.diff(state["close"].astype(np.float64)[:, -9:], axis=1) / state["close"][:, -9:-1]
        out = np.zeros(len(r))
        for i, row in enumerate(r):
            memory[tuple(np.round(row[-7:-2] * 1e4).astype(int))] = row[-1]
            hit = memory.get(tuple(np.round(row[-5:] * 1e4).astype(int)))
            out[i] = 0.0 if hit is None else np.sign(hit)
        return out

    return lambda batches: [policy(state, params) for state, params in batches]


def test_the_resampled_validation_market_shows_each_bar_once_so_remembering_earns_nothing(tmp_path):
    """A program that remembers every 5-bar run of returns it met, and trades on the return that followed
    it, has no bar twice to trade with hindsight: each search-period bar comes once, none of the holdout's."""
    options = dict(TRADING_OPTIONS, prices=str(write_prices(tmp_path / "prices.csv", bars=1000)))
    domain = get_domain("trading", secrets=SECRETS, **options)
    out = domain.evaluate(remembering_policy(), {}, "validation")
    assert out.metrics["trades"] == 0 and out.score == 0.0, out.metrics["sharpe"]
    shown = domain.market_of("validation").returns()[:, 1:]
    assert np.allclose(np.sort(shown, axis=1), np.sort(domain.market.returns()[:, 1:1000 - 40], axis=1))


def test_inventory_resamples_the_history_and_measures_held_out_on_the_latest_periods_only(tmp_path):
    # the latest 30% of the periods carry 100 more units each: a draw from them is unmistakable
    history = {"path": str(write_demand(tmp_path / "demand.csv", later_shift=100)), "lead_times": [1, 2]}
    evaluator = Evaluator("inventory", dict(INVENTORY_OPTIONS, demand_history=history), LIMITS, secrets=SECRETS)
    domain = evaluator.domain
    specs = domain.instances("search")
    assert [s.key for s in specs] == ["bolts-L1-p9", "bolts-L2-p9", "nuts-L1-p9", "nuts-L2-p9"]
    for split in ("search", "validation", "heldout"):
        assert domain.tuning_demand(specs[0], split).max() < 100  # tuning: the earlier periods only
    assert domain.heldout_demand(specs[0]).min() >= 100  # the held-out measurement: the later ones only
    assert not np.array_equal(domain.tuning_demand(specs[0], "search"), domain.tuning_demand(specs[0], "validation"))
    for split in ("search", "heldout"):
        result = evaluator.evaluate("seed", domain.seed_program, split)
        assert result.status == Status.OK, result.error
    assert set(result.metrics["instances"]) == {s.key for s in specs}


def test_milp_splits_a_folder_by_its_stated_rule_and_solves_with_scip(tmp_path):
    folder = write_instances(tmp_path / "instances", count=4)
    options = {"instances": {"path": str(folder), "heldout_share": 0.25}, "scip_seeds": 1, "time_limit_s": 10}
    evaluator = Evaluator("milp", options, LIMITS, secrets=SECRETS)
    domain = evaluator.domain
    assert [label for label, _ in domain.instances("search")] == ["cover-00.lp", "cover-01.lp", "cover-02.lp"]
    assert [label for label, _ in domain.instances("heldout")] == ["cover-03.mps"]  # the last name is held out
    hashed = get_domain("milp", secrets=SECRETS, instances={"path": str(folder), "order": "hash"})
    assert len(hashed.instances("heldout")) == 1 and len(hashed.instances("search")) == 3
    result = evaluator.evaluate("seed", domain.seed_program, "heldout")
    assert result.status == Status.OK, result.error
    assert [run["instance"] for run in result.metrics["per_run"]] == ["cover-03.mps"]


@pytest.mark.parametrize("env", ["CartPole-v1", "Acrobot-v1"])
def test_control_runs_any_registered_env(env):
    options = {"env": env, "search_seeds": 3, "validation_seeds": 2, "heldout_seeds": 3, "tune_trials": 4,
               "tune_batch": 4, "linear_trials": 4, "max_steps": 100}
    evaluator = Evaluator("control", options, LIMITS, secrets=SECRETS)
    assert "def act(obs, params)" in evaluator.domain.seed_program
    assert set(evaluator.domain.baselines()) == {"random", "seed program", "linear (CMA-ES)"}
    result = evaluator.evaluate("seed", evaluator.domain.seed_program, "search")
    assert result.status == Status.OK, result.error
    assert result.metrics["env"] == env and result.metrics["episodes"] == 3


SNOOP = '''\
import os
PATH = {path!r}
DATA = os.listdir(PATH) if os.path.isdir(PATH) else open(PATH, "rb").read()  # raises where it is out of sight

def {entry}(state, params):
    return 0.0
'''


def test_a_candidate_cannot_open_the_users_data(tmp_path):
    prices, demand = write_prices(tmp_path / "prices.csv"), write_demand(tmp_path / "demand.csv")
    folder = write_instances(tmp_path / "instances", count=2)
    cases = [("trading", dict(TRADING_OPTIONS, prices=str(prices)), prices),
             ("inventory", dict(INVENTORY_OPTIONS, demand_history=str(demand)), demand),
             ("milp", {"instances": {"path": str(folder), "heldout_share": 0.5}, "scip_seeds": 1}, folder)]
    for name, options, path in cases:
        evaluator = Evaluator(name, options, LIMITS, secrets=SECRETS)
        assert str(path) in evaluator.hide or not path.is_dir()  # a folder is also covered where modules are bound
        result = evaluator.evaluate("snoop", SNOOP.format(path=str(path), entry="policy"), "search")
        assert result.status == Status.FAILED and "No such file or directory" in result.error, (name, result)


def test_the_stored_config_pins_the_data_and_a_changed_file_is_refused(tmp_path):
    write_prices(tmp_path / "prices.csv")
    (tmp_path / "trading.toml").write_text(TRADING)
    config, _ = load_config(tmp_path / "trading.toml")
    stored = json.loads(json.dumps(config.model_dump(mode="json")))  # what the archive keeps
    prices = stored["domain"]["options"]["prices"]
    assert prices["path"] == str(tmp_path / "prices.csv") and len(prices["sha256"]) == 64
    assert validate(stored).domain.options["prices"] == prices  # a resume on the same data
    write_prices(tmp_path / "prices.csv", seed=99)  # the user overwrites the file
    with pytest.raises(ConfigError, match=r"^domain\.options\.prices: .*prices\.csv changed since the run "
                                          r"recorded it .*start a new run"):
        validate(stored)


ENV_MODULE = '''\
import gymnasium as gym
import numpy as np


class Switches(gym.Env):
    """A flat observation and {space} actions."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = {space}

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {{}}

    def step(self, action):
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), float(np.sum(action)), False, False, {{}}


gym.register("Switches-v0", entry_point=Switches, max_episode_steps=5)
'''


@pytest.mark.parametrize("space, supported", [("gym.spaces.MultiBinary(4)", False),
                                              ("gym.spaces.Box(-2.0, 2.0, (2,), np.float32)", True)])
def test_a_package_environment_runs_if_its_action_space_is_box_or_discrete(tmp_path, monkeypatch, space, supported):
    module = f"user_envs_{'box' if supported else 'multibinary'}"
    (tmp_path / f"{module}.py").write_text(ENV_MODULE.format(space=space))
    monkeypatch.syspath_prepend(str(tmp_path))
    options = {"env": f"{module}:Switches-v0", "search_seeds": 2, "validation_seeds": 1, "heldout_seeds": 2,
               "tune_trials": 2, "tune_batch": 2, "linear_trials": 2}
    if not supported:
        with pytest.raises(ValueError, match=r"has the action space MultiBinary\(4\); the control domain supports "
                                             r"Discrete \(starting at 0\) and a flat Box with finite bounds"):
            get_domain("control", **options)
        return
    domain = get_domain("control", secrets=SECRETS, **options)
    episodes = domain.runner.run(lambda batches: [np.full((len(s), 2), 9.0) for s, _ in batches],
                                 domain.seeds("search"), {})
    assert episodes.returns.tolist() == [20.0, 20.0]  # 5 steps of two actions clipped to 2.0


def _edit_prices(text: str, header: str | None = None, row: int | None = None, cells: str = "") -> str:
    """The prices file's text with its header, or one data row's cells after the date, replaced."""
    lines = text.splitlines()
    if header is not None:
        lines[0] = header
    if row is not None:
        lines[row] = cells
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("edit, message", [
    (lambda t: _edit_prices(t, header="date,ACME,ACME,CORE"),
     r"prices\.csv: the column 'ACME' appears 2 times in its header; give each column its own name"),
    (lambda t: _edit_prices(t, header="date,ACMÉ,BOLT,CORE").encode("latin-1"),
     r"prices\.csv: its header is not UTF-8 text; save the file as UTF-8"),
    (lambda t: _edit_prices(t, row=5, cells="," + ",".join(t.splitlines()[5].split(",")[1:])),
     r"prices\.csv: column 'date' is empty in data row 5$"),
])
def test_a_prices_file_with_a_bad_header_or_an_undated_row_is_one_line(tmp_path, edit, message):
    # an undated row was read as the file's latest bar (a date sorted last), a repeated column a KeyError
    text = write_prices(tmp_path / "prices.csv").read_text()
    edited = edit(text)
    (tmp_path / "prices.csv").write_bytes(edited if isinstance(edited, bytes) else edited.encode())
    (tmp_path / "trading.toml").write_text(TRADING)
    with pytest.raises(ConfigError, match=r"^domain\.options\.prices: .*" + message):
        load_config(tmp_path / "trading.toml")


@pytest.mark.parametrize("header, items, message", [
    ("period,bolts,bolts", ("1,2,3",), r"the column 'bolts' appears 2 times in its header"),
    ("period,item,demand", ("1,bölts,2", "1,nuts,3"),
     r"column 'item' holds text that is not UTF-8; save the file as UTF-8"),
])
def test_a_demand_file_with_repeated_columns_or_other_encodings_is_one_line(tmp_path, header, items, message):
    lines = [header] + [f"{t}{row[1:]}" for t in range(1, 61) for row in items]
    (tmp_path / "demand.csv").write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    (tmp_path / "inventory.toml").write_text(INVENTORY)
    with pytest.raises(ConfigError, match=r"^domain\.options\.demand_history: .*demand\.csv: " + message):
        load_config(tmp_path / "inventory.toml")
