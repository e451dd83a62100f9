"""Branching programs of the MILP domain: the seed, the Python baselines, the mutator's motifs.

A program defines `policy(state, params)` returning one score per LP branching
candidate; SCIP branches on the highest. `state` holds, per candidate (arrays of
length `n_cands`): lp_value, frac (x - floor x), infeasibility (min(frac, 1 - frac)),
ps_down / ps_up (SCIP's per-unit pseudocosts), ps_count_down / ps_count_up
(branchings so far in each direction), ps_score (SCIP's own pseudocost product
score), obj, locks_down / locks_up, col_nnz (nonzeros of the column in the LP),
lb / ub (local bounds); and scalars for the node: depth, n_nodes, n_cands,
node_bound, lp_obj, primal_bound, gap, root_bound (1e20 stands for infinity)
and maximize (the objective sense).
"""

SEED_PROGRAM = '''\
import numpy as np

PARAMS = {"eps": (0.01, 0.0, 1.0), "w_down": (1.0, 0.0, 3.0), "w_up": (1.0, 0.0, 3.0)}


def policy(state, params):
    """Pseudocost product: expected objective gain down times gain up, each floored at eps."""
    f = state["frac"]
    gain_down = np.maximum(state["ps_down"] * f, params["eps"])
    gain_up = np.maximum(state["ps_up"] * (1.0 - f), params["eps"])
    return gain_down ** params["w_down"] * gain_up ** params["w_up"]
'''

BASELINES = {
    "pscost": '''\
import numpy as np


def policy(state, params):
    """SCIP-style pseudocost product score (floor 1e-6), computed in the candidate's process."""
    f = state["frac"]
    return np.maximum(state["ps_down"] * f, 1e-6) * np.maximum(state["ps_up"] * (1.0 - f), 1e-6)
''',
    "most-infeasible": '''\
import numpy as np


def policy(state, params):
    """Most infeasible (most fractional): the candidate whose LP value is nearest one half."""
    return np.asarray(state["infeasibility"], dtype=float)
''',
    "random": '''\
import numpy as np


def policy(state, params):
    """Uniformly random candidate, seeded by the node count so that runs repeat."""
    return np.random.default_rng(int(state["n_nodes"])).random(int(state["n_cands"]))
''',
}

# (name, template, params) for the embedded mutator; `{expr}` is the policy's return value.
# Each motif's written defaults change the rule (none starts as a no-op); the mutator's
# constant perturbations then tune them.
MOTIFS = [
    ("fractionality tilt", '{expr} * (state["infeasibility"] + params["{p0}"])',
     (("frac_shift", 0.5, 0.0, 2.0),)),
    ("reliability fallback",
     'np.where(np.minimum(state["ps_count_down"], state["ps_count_up"]) >= params["{p0}"], {expr}, '
     'params["{p1}"] * state["infeasibility"] * np.max({expr}))',
     (("reliable", 1.0, 0.0, 8.0), ("fallback_w", 1.0, 0.0, 2.0))),
    ("lock weight",
     '{expr} * (1.0 + params["{p0}"] * (state["locks_down"] + state["locks_up"]) / '
     '(1.0 + np.max(state["locks_down"] + state["locks_up"])))',
     (("lock_w", 1.0, 0.0, 3.0),)),
    ("column density", '{expr} * (1.0 + state["col_nnz"]) ** params["{p0}"]', (("nnz_exp", 0.5, -1.0, 1.0),)),
    ("objective power",
     '{expr} * (1e-6 + np.abs(state["obj"]) / (1e-9 + np.max(np.abs(state["obj"])))) ** params["{p0}"]',
     (("obj_exp", 1.0, -1.0, 2.0),)),
    ("fractional part tilt", '{expr} * (params["{p0}"] + state["frac"])',
     (("lp_shift", 0.5, 0.05, 2.0),)),
]
