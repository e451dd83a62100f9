"""Small data files of a user's, for the built-in domains, and the configs that name them.

The tests write them into temporary folders; the README's examples are these
files and configs: `python -m tests.userdata_files DIR` writes all of them into DIR.
The data are synthetic (made here, with fixed seeds), shaped like real ones.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

BARS = 420  # enough for one walk-forward fold with the short windows below (and lookback 253)


def write_prices(path: Path, assets=("ACME", "BOLT", "CORE"), bars: int = BARS, seed: int = 1) -> Path:
    """Wide CSV: a date column and one column of daily closes per asset."""
    rng = np.random.default_rng(seed)
    days = np.busday_offset(np.datetime64("2021-01-04"), np.arange(bars), roll="forward")
    close = 50.0 * np.cumprod(1.0 + rng.normal(0.0004, 0.012, (len(assets), bars)), axis=1)
    lines = ["date," + ",".join(assets)] + [f"{d}," + ",".join(f"{c:.2f}" for c in close[:, t])
                                             for t, d in enumerate(days)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_prices_long_parquet(path: Path, bars: int = BARS, seed: int = 2) -> Path:
    """Long Parquet: date, asset and price columns, one row per asset and day."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    days = np.busday_offset(np.datetime64("2021-01-04"), np.arange(bars), roll="forward")
    assets = ("ACME", "BOLT", "CORE", "DYNA")
    close = 50.0 * np.cumprod(1.0 + rng.normal(0.0003, 0.012, (len(assets), bars)), axis=1)
    table = pa.table({"date": np.repeat(days, len(assets)), "asset": list(assets) * bars,
                      "price": close.T.ravel()})
    pq.write_table(table, path)
    return path


def write_demand(path: Path, periods: int = 120, seed: int = 3, later_shift: int = 0) -> Path:
    """Long CSV: period, item, demand (units per day of two items, a weekly peak on day 6).

    `later_shift` adds that much to every demand of the latest 30% of the periods (the held-out part),
    so a test can tell which part a trajectory was drawn from.
    """
    rng = np.random.default_rng(seed)
    cut = periods - round(0.3 * periods)
    lines = ["period,item,demand"]
    for t in range(periods):
        shift = later_shift if t >= cut else 0
        lines.append(f"{t + 1},bolts,{rng.poisson(4 + 3 * (t % 7 == 5)) + shift}")
        lines.append(f"{t + 1},nuts,{rng.poisson(9) + shift}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_instances(folder: Path, count: int = 4) -> Path:
    """A folder of small set-cover instances: `count - 1` .lp files and one .mps (written by SCIP)."""
    from pyscipopt import Model

    from evaluators.domains.milp.instances import generate

    folder.mkdir(parents=True, exist_ok=True)
    for k in range(count - 1):
        (folder / f"cover-{k:02d}.lp").write_text(generate("setcover", "fast", 100 + k))
    model = Model()
    model.hideOutput()
    model.readProblem(str(folder / "cover-00.lp"))
    model.writeProblem(str(folder / f"cover-{count - 1:02d}.mps"), verbose=False)
    return folder


TRADING = '''\
[run]
name = "my-prices"
max_evals = 40

[domain]
name = "trading"

[domain.options]
market = "file"
prices = "prices.csv"
lookback = 253
tune_bars = 60
test_bars = 30
holdout_bars = 40
tune_trials = 2
'''

INVENTORY = '''\
[run]
name = "my-demand"
max_evals = 40

[domain]
name = "inventory"

[domain.options]
search_periods = 200
heldout_periods = 400
warmup = 50
heldout_tune_trials = 32  # as the search's: the tests check the data's path, not the tuning

[domain.options.demand_history]
path = "demand.csv"
heldout_share = 0.3
block = 7
lead_times = [2]
penalties = [9.0]
'''

MILP = '''\
[run]
name = "my-instances"
max_evals = 20

[domain]
name = "milp"

[domain.options]
scip_seeds = 1
time_limit_s = 10
reference_rules = ["scip default", "scip pscost"]

[domain.options.instances]
path = "instances"
order = "name"
heldout_share = 0.25
'''

CONTROL = '''\
[run]
name = "my-env"
max_evals = 40

[domain]
name = "control"

[domain.options]
env = "CartPole-v1"
search_seeds = 5
validation_seeds = 3
heldout_seeds = 10
tune_trials = 8
tune_batch = 4
linear_trials = 40
'''


def write_example(folder: Path) -> list[Path]:
    """Every example's data and config into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    write_prices(folder / "prices.csv")
    write_demand(folder / "demand.csv")
    write_instances(folder / "instances")
    configs = {"trading.toml": TRADING, "inventory.toml": INVENTORY, "milp.toml": MILP, "control.toml": CONTROL}
    for name, text in configs.items():
        (folder / name).write_text(text)
    return [folder / name for name in configs]


if __name__ == "__main__":
    print("\n".join(str(p) for p in write_example(Path(sys.argv[1] if len(sys.argv) > 1 else "userdata"))))
