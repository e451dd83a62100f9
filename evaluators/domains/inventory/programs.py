"""The inventory domain's programs: the seed, the baselines and the embedded mutator's motifs."""

SEED_PROGRAM = '''\
import numpy as np

PARAMS = {"level": (15.0, 0.0, 80.0)}


def policy(state, params):
    """Base-stock: order up to a level of inventory position (on hand plus pipeline)."""
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    return np.maximum(params["level"] - position, 0)
'''

BASELINES = {
    "optimized base-stock": SEED_PROGRAM,
    "capped base-stock": '''\
import numpy as np

PARAMS = {"level": (15.0, 0.0, 80.0), "cap": (8.0, 0.0, 20.0)}


def policy(state, params):
    """Capped base-stock (Xin 2021): order up to the level, but never more than the cap."""
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    return np.minimum(np.maximum(params["level"] - position, 0), params["cap"])
''',
    "constant order": '''\
import numpy as np

PARAMS = {"rate": (4.5, 0.0, 20.0)}


def policy(state, params):
    """Constant order: the same quantity every period, ignoring the state.

    Orders are integers, so a fractional rate is met on average: the order is
    the growth of floor(rate * t) from this period to the next.
    """
    t = state["period"]
    rate = params["rate"] + 0.0 * state["on_hand"]
    return np.floor(rate * (t + 1)) - np.floor(rate * t)
''',
    "myopic": '''\
import numpy as np

PARAMS = {"safety": (1.0, -3.0, 5.0)}


def policy(state, params):
    """Myopic: project stock to the period this order arrives, then cover that period.

    Stock is carried forward through the lead time with mean demand and lost
    sales (it cannot go below zero); the order brings it up to one period's
    mean demand plus `safety` standard deviations (Poisson scale, sqrt(mean)).
    """
    mean = state["mean_demand"]
    stock = state["on_hand"].astype(float)
    for k in range(state["lead_time"]):
        stock = np.maximum(stock + state["pipeline"][:, k] - mean, 0.0)
    target = mean + params["safety"] * np.sqrt(mean)
    return np.maximum(target - stock, 0.0)
''',
}

# (name, template, params) for the embedded mutator; `{expr}` is the policy's return value.
# "discounted pipeline" adds back (1 - w^age) of each pipeline order, so the position it
# orders against counts an order of age a (the oldest has age L) with weight w^a.
MOTIFS = [
    ("order cap", 'np.minimum({expr}, params["{p0}"])', (("cap", 12.0, 0.0, 40.0),)),
    ("discounted pipeline",
     'np.maximum({expr} + (state["pipeline"] * (1.0 - np.reshape(params["{p0}"], (-1, 1)) ** '
     'np.arange(state["pipeline"].shape[1], 0, -1))).sum(axis=1), 0.0)',
     (("pipe_weight", 1.0, 0.5, 1.5),)),
    ("order threshold",
     'np.where(state["on_hand"] + state["pipeline"].sum(axis=1) < params["{p0}"], {expr}, 0.0)',
     (("threshold", 80.0, 0.0, 80.0),)),
    ("smooth toward mean demand",
     'params["{p0}"] * {expr} + (1.0 - params["{p0}"]) * state["mean_demand"]',
     (("smooth", 1.0, 0.0, 1.0),)),
    ("minimum order", 'np.maximum({expr}, params["{p0}"])', (("floor", 0.0, 0.0, 10.0),)),
]
