"""Program texts of the trading domain: the seed, the baselines and the mutator's motifs.

Every program is `policy(state, params)` over rows: `state["close"]` is
(rows, lookback) float32 closes up to and including the decision bar, divided
by that bar's close (so the last column is 1), and `state["position"]` is the
position each row decided at the previous bar (0 at a window's start).
`params` holds one (rows,) array per PARAMS entry. A policy returns one
position in [-1, 1] per row (or one scalar for all).
"""
from __future__ import annotations

SEED_PROGRAM = '''\
import numpy as np

PARAMS = {"lookback": (10.0, 1.0, 250.0)}


def policy(state, params):
    """Time-series momentum: long after a rise over `lookback` bars, short after a fall."""
    close = state["close"]
    n = np.clip(params["lookback"], 1, close.shape[1] - 1).astype(int)
    past = np.take_along_axis(close, (close.shape[1] - 1 - n)[:, None], axis=1)[:, 0]
    return np.sign(close[:, -1] - past)
'''

_CASH = '''\
import numpy as np


def policy(state, params):
    """Cash: never hold a position (zero trades, so zero fitness by the gate)."""
    return np.zeros(len(state["close"]))
'''

_BUY_AND_HOLD = '''\
import numpy as np


def policy(state, params):
    """Buy & hold: fully long from the first bar of every window."""
    return np.ones(len(state["close"]))
'''

_SMA_CROSSOVER = '''\
import numpy as np


def policy(state, params):
    """SMA 50/200 crossover, long/flat: long while the 50-bar average is above the 200-bar one."""
    close = state["close"].astype(np.float64)
    return (close[:, -50:].mean(axis=1) > close[:, -200:].mean(axis=1)).astype(float)
'''

_MOMENTUM_12_1 = '''\
import numpy as np


def policy(state, params):
    """12-1 momentum, long/flat: long while the return from 12 months to 1 month ago is positive."""
    close = state["close"]
    return (close[:, -22] > close[:, -253]).astype(float)
'''

_RANDOM_ENTRIES = '''\
import numpy as np

SWITCH = {rate!r}  # chance per bar of flipping between flat and long (see the domain's notes)
SEED = 7.0


def policy(state, params):
    """Random entries, long/flat, at the SMA 50/200 crossover's rate of position changes.

    The draw is a fixed hash of each row's last ten closes: deterministic, and
    unrelated to what comes next.
    """
    close = state["close"].astype(np.float64)
    x = np.sin(close[:, -11:-1] @ np.arange(1.0, 11.0) * 12.9898 + SEED) * 43758.5453
    u = x - np.floor(x)
    return np.where(u < SWITCH, 1.0 - state["position"], state["position"])
'''


def baselines(switch_rate: float) -> dict[str, str]:
    """Name -> program text; `switch_rate` is the random baseline's flip chance per bar."""
    return {"cash": _CASH, "buy & hold": _BUY_AND_HOLD, "SMA 50/200": _SMA_CROSSOVER,
            "12-1 momentum": _MOMENTUM_12_1,
            "random entries": _RANDOM_ENTRIES.replace("{rate!r}", repr(round(float(switch_rate), 6)))}


_CLOSE = 'state["close"]'
_BARS = f'{_CLOSE}.shape[1]'


def _window(param: str) -> str:
    return f'np.clip(params["{{{param}}}"], 2, {_BARS}).astype(int)'


def _sma(param: str) -> str:
    """Per-row moving average over the last params[param] closes (rows may differ)."""
    return (f'(np.take_along_axis(np.cumsum({_CLOSE}[:, ::-1], axis=1), {_window(param)}[:, None] - 1, axis=1)'
            f'[:, 0] / {_window(param)})')


def _ago(param: str) -> str:
    """Per-row close params[param] bars before the decision bar."""
    n = f'np.clip(params["{{{param}}}"], 1, {_BARS} - 1).astype(int)'
    return f'np.take_along_axis({_CLOSE}, ({_BARS} - 1 - {n})[:, None], axis=1)[:, 0]'


# (name, template, params) for the embedded mutator; `{expr}` is the policy's return value,
# a position in [-1, 1]; every template keeps it there.
MOTIFS = [
    ("trend filter", f'np.where({_CLOSE}[:, -1] >= {_sma("p0")}, {{expr}}, 0.0)',
     (("ma_window", 100.0, 5.0, 250.0),)),
    ("moving-average crossover", f'np.where({_sma("p0")} > {_sma("p1")}, {{expr}}, 0.0)',
     (("fast_window", 50.0, 2.0, 120.0), ("slow_window", 200.0, 20.0, 250.0))),
    ("volatility target",
     f'np.clip({{expr}} * params["{{p0}}"] / (np.std(np.diff(np.log({_CLOSE}[:, -61:]), axis=1), axis=1) '
     f'* np.sqrt(252.0) + 1e-06), -1.0, 1.0)', (("target_vol", 0.15, 0.02, 0.6),)),
    ("move threshold", f'np.where(np.abs(np.log({_CLOSE}[:, -1] / {_ago("p1")})) > params["{{p0}}"], {{expr}}, 0.0)',
     (("move_threshold", 0.0, 0.0, 0.2), ("move_window", 20.0, 1.0, 250.0))),
    ("hysteresis", 'np.where(np.abs({expr} - state["position"]) > params["{p0}"], {expr}, state["position"])',
     (("band", 0.0, 0.0, 1.0),)),
    ("smooth positions", 'params["{p0}"] * {expr} + (1.0 - params["{p0}"]) * state["position"]',
     (("speed", 1.0, 0.05, 1.0),)),
    ("long bias", 'np.clip({expr} + params["{p0}"], -1.0, 1.0)', (("bias", 0.0, -1.0, 1.0),)),
    ("drawdown stop", f'np.where({_CLOSE}[:, -1] >= (1.0 - params["{{p0}}"]) * {_CLOSE}.max(axis=1), {{expr}}, 0.0)',
     (("stop", 0.5, 0.02, 1.0),)),
    ("short-term reversal",
     f'np.clip({{expr}} - params["{{p0}}"] * np.sign(np.log({_CLOSE}[:, -1] / {_CLOSE}[:, -6])), -1.0, 1.0)',
     (("reversal", 0.0, 0.0, 1.0),)),
    ("12-1 momentum gate", f'np.where({_CLOSE}[:, -22] > {_CLOSE}[:, -253], {{expr}}, 0.0)', ()),
]
