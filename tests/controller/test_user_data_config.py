"""Bad data of a user's for a built-in domain: one clear line when the config loads, exit 2 from the CLI."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from controller.config import ConfigError, load_config
from tests.userdata_files import CONTROL, INVENTORY, MILP, TRADING, write_demand, write_instances, write_prices

ROOT = Path(__file__).resolve().parents[2]


def _edit(path: Path, old: str, new: str, count: int = 1) -> None:
    path.write_text(path.read_text().replace(old, new, count))


def _rows(path: Path, keep: int) -> None:
    path.write_text("\n".join(path.read_text().splitlines()[:keep]) + "\n")


def _no_early_demand(path: Path, item: str, periods: int) -> None:
    """The long demand file with `item` selling nothing in its first `periods` periods (a newer product)."""
    header, *rows = path.read_text().splitlines()
    cut = [r.split(",") for r in rows]
    rows = [f"{t},{i},0" if i == item and int(t) <= periods else f"{t},{i},{d}" for t, i, d in cut]
    path.write_text("\n".join([header, *rows]) + "\n")


def _long_without_an_asset(path: Path) -> None:
    """The wide prices file rewritten long (date, asset, price), its third row's asset left empty."""
    header, *rows = path.read_text().splitlines()
    assets = header.split(",")[1:]
    long = [f"{day},{asset},{price}" for day, *prices in (r.split(",") for r in rows)
            for asset, price in zip(assets, prices)]
    long[2] = long[2].replace(f",{assets[2]},", ",,")
    path.write_text("\n".join(["date,asset,price", *long]) + "\n")


# (config text, how to break the data in the folder, the line's expected key and words)
CASES = {
    "trading: no file": (TRADING, lambda d: (d / "prices.csv").unlink(),
                         r"domain\.options\.prices: file .*prices\.csv does not exist"),
    "trading: no date column": (TRADING, lambda d: _edit(d / "prices.csv", "date,", "day,"),
                                r"domain\.options\.prices: .*prices\.csv has no date column 'date' \(its columns: "
                                r"day, ACME, BOLT, CORE\); name it with prices\.date_column"),
    "trading: a price that is not a number": (TRADING, lambda d: _edit(d / "prices.csv", "\n2021-01-06,", "\n2021-01-06,n/a?"),
                                              r"prices\.csv: column 'ACME' holds a value that is not a number "
                                              r"\('n/a\?.*' in data row 3\)"),
    "trading: a negative price": (TRADING, lambda d: _edit(d / "prices.csv", "\n2021-01-05,", "\n2021-01-05,-"),
                                  r"asset 'ACME' has the price -.* on 2021-01-05; prices must be positive"),
    "trading: a row without an asset": (TRADING, lambda d: _long_without_an_asset(d / "prices.csv"),
                                        r"prices\.csv: column 'asset' is empty in data row 3$"),  # was 'None'
    "trading: too few rows": (TRADING, lambda d: _rows(d / "prices.csv", 300),
                              r"prices\.csv: the market has 299 bars: too few for lookback 253"),
    "trading: an asset listed twice": (TRADING, lambda d: _edit(d / "trading.toml", 'prices = "prices.csv"',
                                                                'prices = "prices.csv"\nassets = ["ACME", "BOLT", "ACME"]'),
                                       r"domain\.options\.assets: 'ACME' is listed twice; each entry counts once"),
    "inventory: a lead time listed twice": (INVENTORY, lambda d: _edit(d / "inventory.toml", "lead_times = [2]",
                                                                       "lead_times = [2, 4, 2]"),
                                            r"demand_history\.lead_times: 2 is listed twice; each entry counts once"),
    "inventory: no file": (INVENTORY, lambda d: (d / "demand.csv").unlink(),
                           r"domain\.options\.demand_history: file .*demand\.csv does not exist"),
    "inventory: a negative demand": (INVENTORY, lambda d: _edit(d / "demand.csv", "\n3,nuts,", "\n3,nuts,-"),
                                     r"demand\.csv: item 'nuts' has a negative demand in period 3 \(-\d+\)"),
    "inventory: a demand too large to count": (
        INVENTORY, lambda d: _edit(d / "demand.csv", "\n3,nuts,", "\n3,nuts,1e2"),  # was read as a negative
        r"item 'nuts' has a demand of more than 10\^12 units in period 3 \(1e\+2\d+\)"),
    "inventory: a row without an item": (INVENTORY, lambda d: _edit(d / "demand.csv", "\n3,nuts,", "\n3,,"),
                                         r"demand\.csv: column 'item' is empty in data row 6$"),
    "inventory: a gap": (INVENTORY, lambda d: _edit(d / "demand.csv", "\n3,nuts,", "\n3,screws,"),
                         r"item 'nuts' has no demand in period 3 \(write 0 for a period without demand\)"),
    "inventory: too few periods": (INVENTORY, lambda d: _rows(d / "demand.csv", 41),
                                   r"demand\.csv has 20 periods: with heldout_share 0\.3 and block 7, the search "
                                   r"part has 14 and the held-out part 6, and each needs at least 14"),
    "inventory: an item without demand in the search part": (  # every program's score was NaN, the seed's too
        INVENTORY, lambda d: _no_early_demand(d / "demand.csv", "nuts", 90),
        (r"item 'nuts' has no demand in the first 84 periods of .*demand\.csv \(the search part\): base-stock "
         r"costs nothing there")),
    "milp: no folder": (MILP, lambda d: os.rename(d / "instances", d / "elsewhere"),
                        r"domain\.options\.instances: folder .*instances does not exist"),
    "milp: no instances": (MILP, lambda d: [p.unlink() for p in (d / "instances").iterdir()],
                           r"instances holds no instance files \(names ending in \.mps, \.lp"),
    "milp: too few instances": (MILP, lambda d: [p.unlink() for p in sorted((d / "instances").iterdir())[1:]],
                                r"instances holds 1 instance file\(s\): too few for a search and a held-out split"),
    "milp: a file SCIP cannot read": (MILP, lambda d: (d / "instances" / "broken.mps").write_text(
                                          "NAME broken\nROWS\n N obj\nGARBAGE\n"),
                                      r"SCIP cannot read .*broken\.mps: Syntax error in line 4"),
    "control: an unregistered id": (CONTROL, lambda d: _edit(d / "control.toml", "CartPole-v1", "CartPole-v9"),
                                    r"domain\.options\.env: env 'CartPole-v9' is not a registered gymnasium environment"),
    "control: an unsupported space": (CONTROL, lambda d: _edit(d / "control.toml", "CartPole-v1", "FrozenLake-v1"),
                                      r"env 'FrozenLake-v1' observes Discrete\(16\); the control domain needs a flat "
                                      r"Box observation"),
}
CONFIG_NAMES = {TRADING: "trading.toml", INVENTORY: "inventory.toml", MILP: "milp.toml", CONTROL: "control.toml"}


def _broken(tmp_path: Path, case: str) -> Path:
    text, breaks, _ = CASES[case]
    write_prices(tmp_path / "prices.csv")
    write_demand(tmp_path / "demand.csv")
    write_instances(tmp_path / "instances", count=3)
    config = tmp_path / CONFIG_NAMES[text]
    config.write_text(text)
    breaks(tmp_path)
    return config


def test_the_example_configs_load_on_their_data(tmp_path):
    write_prices(tmp_path / "prices.csv")
    write_demand(tmp_path / "demand.csv")
    write_instances(tmp_path / "instances", count=3)
    for text, name in CONFIG_NAMES.items():
        (tmp_path / name).write_text(text)
        config, _ = load_config(tmp_path / name)
        assert config.domain.name in name


@pytest.mark.parametrize("case", list(CASES))
def test_bad_data_is_one_line_naming_the_option(tmp_path, case):
    config = _broken(tmp_path, case)
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    assert re.search(CASES[case][2], message), message


@pytest.mark.parametrize("case", ["trading: a negative price", "inventory: too few periods",
                                  "milp: a file SCIP cannot read", "control: an unregistered id"])
def test_atoll_check_says_it_in_one_line_and_exits_2(tmp_path, case):
    config = _broken(tmp_path, case)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "controller", "check", str(config)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("atoll: domain.options."), proc.stderr
    assert re.search(CASES[case][2], lines[0]), lines[0]
