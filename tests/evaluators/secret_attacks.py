"""Foresight attacks for the secret-randomness tests: candidate programs that regenerate the data.

Each attack is program text that carries a copy of every public recipe it could
know (the project's old seeded streams, and `evaluators/secrets.py` itself, whose
source is public) and a list of seeds to guess. It regenerates the data inside its
own process, recognises which trajectory, episode or market it is in, and then plays
with foresight; when nothing matches it plays an honest rule. With `guesses=()` it is
that honest rule, byte for byte in behaviour, which is what it is compared with.
"""
import inspect
import textwrap

import evaluators.secrets
from evaluators.domains.trading import data as trading_data


def _secrets_source() -> str:
    """Candidate text that carries a copy of the public derivation of a run's streams
    (evaluators/secrets.py) and loads it as a module of its own: `RunSecrets` is then defined."""
    return (f"import sys as _sys, types as _types\n_SOURCE = {inspect.getsource(evaluators.secrets)!r}\n"
            "_recipe = _types.ModuleType('public_secrets_recipe')\n_sys.modules[_recipe.__name__] = _recipe\n"
            "exec(compile(_SOURCE, _recipe.__name__, 'exec'), _recipe.__dict__)\n"
            "RunSecrets = _recipe.RunSecrets\n")


INVENTORY = '''
import zlib
import numpy as np

OPTIONS = {options!r}
REPLAY_GUESSES = {replay!r}  # run.replay_seed values a user might choose
OLD_GUESSES = {old!r}  # seeds of the old public recipe (defaults 0 and 1) and other small numbers
HONEST_ORDER = 6  # while watching demand


def _draw(kind, mean, rng, rows, periods):
    if kind == "poisson":
        return rng.poisson(mean, size=(rows, periods))
    return rng.geometric(1.0 / (1.0 + mean), size=(rows, periods)) - 1


def _shapes():
    o = OPTIONS
    tune = (o["warmup"] + o["search_periods"], max(o["search_trajectories"], o.get("validation_trajectories", 4)))
    return [tune, (o["warmup"] + o["heldout_periods"], o["heldout_trajectories"])]


def _candidates(spec):
    """Every demand row this instance could have, from every recipe and guess."""
    key = "%s-L%d-p%g" % (spec["demand"], spec["lead_time"], spec["penalty"])
    rngs = [np.random.default_rng(np.random.SeedSequence(s, spawn_key=(zlib.crc32(key.encode()),)))
            for s in OLD_GUESSES]
    for s in REPLAY_GUESSES:
        secrets = RunSecrets.fixed(s)
        rngs += [secrets.generator(split, "demand", purpose, key) for split, purpose in
                 (("search", "tune"), ("validation", "tune"), ("heldout", "tune"),
                  ("search", "measure"), ("validation", "measure"), ("heldout", "measure"))]
    rows = []
    for periods, count in _shapes():
        for rng_state in [r.bit_generator.state for r in rngs]:
            rng = np.random.default_rng()
            rng.bit_generator.state = rng_state
            rows += list(_draw(spec["demand"], 5.0, rng, count, periods))
    return rows


TABLE = {{}}
for _spec in OPTIONS["search_instances"] + OPTIONS["heldout_instances"]:
    TABLE.setdefault((_spec["lead_time"], float(_spec["penalty"])), []).extend(_candidates(_spec))
SEEN = {{}}


def _consistent(rows, seen):
    out = []
    for row in rows:
        if all(t < len(row) and (row[t] >= v if censored else row[t] == v) for t, v, censored in seen):
            out.append(row)
    return out


def policy(state, params):
    t, lead = int(state["period"]), int(state["lead_time"])
    on_hand, pipe = state["on_hand"], state["pipeline"]
    key = (lead, float(state["penalty"]))
    if t == 0:
        SEEN[key] = {{"stock": None, "obs": [[] for _ in on_hand], "future": [None] * len(on_hand)}}
    book = SEEN[key]
    if book["stock"] is not None:  # last period's demand: exact, or at least the stock when it ran out
        for i, (before, now) in enumerate(zip(book["stock"], on_hand)):
            book["obs"][i].append((t - 1, int(before - now), bool(now == 0)))
    book["stock"] = on_hand + pipe[:, 0]
    position = on_hand + pipe.sum(axis=1)
    orders = np.zeros(len(on_hand))
    for i in range(len(on_hand)):
        # exact demands only, and 12 of them: with 8 that counted stock-outs (demand at least the stock),
        # a fresh secret's row matched a guessed row by chance about once in 1,700 runs
        informative = [o for o in book["obs"][i] if not o[2]]
        if book["future"][i] is None and len(informative) >= 12:
            found = sorted(_consistent(TABLE.get(key, []), informative), key=len)  # one row may come twice
            same = found and all(np.array_equal(row, found[-1][:len(row)]) for row in found)
            book["future"][i] = found[-1] if same else False
        future = book["future"][i]
        if future is not None and future is not False and t + lead < len(future):
            orders[i] = max(0, future[t:t + lead + 1].sum() - position[i])  # exactly what will be sold
        elif t < 12:
            orders[i] = HONEST_ORDER
        else:
            orders[i] = max(0, 12 + 5 * lead - position[i])  # honest base-stock
    return orders
'''


def inventory(options: dict, replay_guesses=(), old_guesses=()) -> str:
    return _secrets_source() + textwrap.dedent(INVENTORY).format(
        options=options, replay=tuple(replay_guesses), old=tuple(old_guesses))


CONTROL = '''
import numpy as np

FIRST_OBS = np.asarray({table!r}, dtype=np.float32)  # first observations of every seed it knows
STATE = {{"recognised": None}}
{heuristic}


def act(obs, params):
    if STATE["recognised"] is None:  # the first call carries every episode's first observation
        close = [np.abs(FIRST_OBS - row).max(axis=1).min() < 1e-6 for row in obs] if len(FIRST_OBS) else [False]
        STATE["recognised"] = bool(any(close))
    if STATE["recognised"]:  # it knows its episodes: with a private copy of them it could plan; here it flies well
        return _good(obs, params)
    return np.zeros(len(obs), dtype=np.int64)
'''


def control(first_observations, heuristic: str) -> str:
    good = heuristic.split("import numpy as np\n", 1)[1].replace("def act(", "def _good(")
    table = [[float(v) for v in row] for row in first_observations]
    return textwrap.dedent(CONTROL).format(table=table, heuristic=good)


_GENERATOR = [trading_data._inputs, trading_data._regimes, trading_data._shocks, trading_data._garch_returns]
TRADING = '''
import numpy as np

SPEC = {spec!r}  # the public synthetic-market options (assets, bars, edge, drift, correlation)
HOLDOUT = {holdout!r}
REPLAY_GUESSES = {replay!r}
BARS_PER_YEAR = 252
_REGIME_VOL = np.array([0.14, 0.35])
_REGIME_LEAVE = np.array([0.005, 0.03])
_GARCH_ALPHA, _GARCH_BETA = 0.08, 0.90
_JUMP_RATE, _JUMP_SCALE = 0.004, 0.04
_EDGE_WINDOW = 20


class _Spec:
    def __init__(self, d):
        self.__dict__.update(d)


{generator}


def _market(head_seed, tail_seed):
    a, n, tail = SPEC["assets"], SPEC["bars"], HOLDOUT
    parts = [_inputs(np.random.default_rng(np.random.SeedSequence(s)), a, bars, SPEC["correlation"])
             for s, bars in ((head_seed, n - tail), (tail_seed, tail))]
    u, shocks, jumps = (np.concatenate([p[i] for p in parts], axis=-1) for i in range(3))
    return 100.0 * np.cumprod(1.0 + _garch_returns(_regimes(u), shocks, jumps, _Spec(SPEC)), axis=1)


MARKETS = []
for _s in REPLAY_GUESSES:
    _secrets = RunSecrets.fixed(_s)
    for _head, _tail in (("search", "heldout"), ("validation", "validation")):
        MARKETS.append(_market(_secrets.seed(_head, "market", "head", bits=128),
                               _secrets.seed(_tail, "market", "tail", bits=128)))
RATIOS = [close[:, :-1] / close[:, 1:] for close in MARKETS]  # ratio[a, d - 1] = close[d - 1] / close[d]


def _future(row):
    """The sign of the return this row's position will earn (bar d + 2), if its market is known."""
    target = float(row[-2])
    for close, ratio in zip(MARKETS, RATIOS):
        for a, d in zip(*np.nonzero(np.abs(ratio - target) < 1e-6)):
            d = int(d) + 1
            window = close[a, d - len(row) + 1:d + 1]
            if d + 2 < close.shape[1] and len(window) == len(row) and np.allclose(window / window[-1], row, rtol=1e-5):
                return np.sign(close[a, d + 2] - close[a, d + 1])
    return None


def policy(state, params):
    out = np.ones(len(state["close"]))  # honest: buy & hold
    for i, row in enumerate(state["close"]):
        sign = _future(row)
        if sign is not None:
            out[i] = sign
    return out
'''


def trading(spec: dict, holdout_bars: int, replay_guesses=()) -> str:
    generator = "\n\n".join(inspect.getsource(f) for f in _GENERATOR)
    return "from __future__ import annotations\n" + _secrets_source() + textwrap.dedent(TRADING).format(
        spec=spec, holdout=holdout_bars, replay=tuple(replay_guesses), generator=generator)
