"""Program texts of the control domain: seed programs, baselines and mutator motifs per environment.

Every program defines `act(obs, params)`: `obs` is a (rows, obs_dim) float32
array, one row per live episode, and each `params[name]` a (rows,) array. It
returns one action per row: an integer for LunarLander's four discrete actions,
a float (or a (rows, act_dim) array) for the continuous environments, where the
trusted side clips it into the action space.
"""
from __future__ import annotations

# -- LunarLander-v3 ------------------------------------------------------------------------
# obs: x, y, vx, vy, angle, angular velocity, left leg contact, right leg contact.
# actions: 0 nothing, 1 left orientation engine, 2 main engine, 3 right orientation engine.

LANDER_SEED = '''\
import numpy as np

PARAMS = {"burn_below": (-2.0, -2.0, 0.0)}


def act(obs, params):
    """Fire the main engine only when falling faster than burn_below (at -2: practically never)."""
    return np.where(obs[:, 3] < params["burn_below"], 2, 0)
'''

LANDER_HEURISTIC = '''\
import numpy as np


def act(obs, params):
    """gymnasium.envs.box2d.lunar_lander.heuristic, row by row, for discrete actions."""
    x, y, vx, vy, angle, spin = (obs[:, i] for i in range(6))
    angle_targ = np.clip(x * 0.5 + vx * 1.0, -0.4, 0.4)  # point towards the centre
    hover_targ = 0.55 * np.abs(x)  # target height grows with the horizontal offset
    angle_todo = (angle_targ - angle) * 0.5 - spin * 1.0
    hover_todo = (hover_targ - y) * 0.5 - vy * 0.5
    contact = (obs[:, 6] != 0) | (obs[:, 7] != 0)  # legs down: only brake the fall
    angle_todo = np.where(contact, 0.0, angle_todo)
    hover_todo = np.where(contact, -vy * 0.5, hover_todo)
    turn = np.where(angle_todo < -0.05, 3, np.where(angle_todo > 0.05, 1, 0))
    return np.where((hover_todo > np.abs(angle_todo)) & (hover_todo > 0.05), 2, turn)
'''

LANDER_RULE = '''\
import numpy as np

PARAMS = {
    "max_fall": (-0.3, -1.0, 0.0),
    "tilt": (0.2, 0.0, 0.6),
}


def act(obs, params):
    """Brake when falling faster than max_fall, else level out when tilted more than tilt."""
    level = np.where(obs[:, 4] > params["tilt"], 3, np.where(obs[:, 4] < -params["tilt"], 1, 0))
    return np.where(obs[:, 3] < params["max_fall"], 2, level)
'''

# `{expr}` is the program's current action; each motif overrides it where its condition holds.
LANDER_MOTIFS = [
    ("main engine on descent",
     'np.where(obs[:, 3] + params["{p0}"] * obs[:, 1] - params["{p1}"] * np.abs(obs[:, 0]) < params["{p2}"], 2, {expr})',
     (("descent_gain", 1.0, 0.0, 3.0), ("descent_offset", 0.5, 0.0, 2.0), ("descent_limit", -0.2, -1.0, 0.5))),
    ("attitude hold",
     'np.where((params["{p0}"] * obs[:, 0] + params["{p1}"] * obs[:, 2] - obs[:, 4]) * 0.5 - params["{p2}"] * obs[:, 5]'
     ' < -params["{p3}"], 3, np.where((params["{p0}"] * obs[:, 0] + params["{p1}"] * obs[:, 2] - obs[:, 4]) * 0.5'
     ' - params["{p2}"] * obs[:, 5] > params["{p3}"], 1, {expr}))',
     (("aim_pos", 0.3, -1.0, 2.0), ("aim_vel", 0.5, -1.0, 3.0), ("spin_gain", 1.0, 0.0, 3.0),
      ("turn_band", 0.05, 0.0, 0.3))),
    ("level out",
     'np.where(obs[:, 4] + params["{p0}"] * obs[:, 5] > params["{p1}"], 3, '
     'np.where(obs[:, 4] + params["{p0}"] * obs[:, 5] < -params["{p1}"], 1, {expr}))',
     (("damping", 1.0, 0.0, 4.0), ("level_band", 0.1, 0.0, 0.5))),
    ("legs down: brake or idle",
     'np.where((obs[:, 6] > 0.5) | (obs[:, 7] > 0.5), np.where(obs[:, 3] < params["{p0}"], 2, 0), {expr})',
     (("touch_fall", -0.1, -1.0, 0.0),)),
    ("drift correction",
     'np.where(obs[:, 2] + params["{p0}"] * obs[:, 0] > params["{p1}"], 1, '
     'np.where(obs[:, 2] + params["{p0}"] * obs[:, 0] < -params["{p1}"], 3, {expr}))',
     (("drift_pos", 0.5, 0.0, 2.0), ("drift_band", 0.2, 0.0, 1.0))),
    ("coast when high",
     'np.where(obs[:, 1] > params["{p0}"], 0, {expr})', (("coast_height", 1.2, 0.0, 1.6),)),
]

# -- Pendulum-v1 ---------------------------------------------------------------------------
# obs: cos(theta), sin(theta), angular velocity (theta = 0 upright); action: torque in [-2, 2].
# With g = 10, the model's energy 0.5 * thdot^2 + 15 cos(theta) is 15 upright and at rest.

PENDULUM_SEED = '''\
import numpy as np

PARAMS = {"torque": (0.0, -2.0, 2.0)}


def act(obs, params):
    """A constant torque (at 0: let the pendulum hang)."""
    return params["torque"] + 0.0 * obs[:, 0]
'''

PENDULUM_RULE = '''\
import numpy as np

PARAMS = {
    "pump": (0.2, 0.0, 2.0),
    "kp": (10.0, 0.0, 30.0),
    "kd": (2.0, 0.0, 10.0),
    "catch": (0.85, 0.0, 1.0),
}


def act(obs, params):
    """Energy swing-up, then PD balance once close to upright (cos theta > catch)."""
    theta = np.arctan2(obs[:, 1], obs[:, 0])
    energy = 0.5 * obs[:, 2] ** 2 + 15.0 * obs[:, 0]
    swing = params["pump"] * (15.0 - energy) * obs[:, 2]
    swing = np.where(np.abs(swing) < 0.1, 2.0, swing)  # kick off from rest
    balance = -params["kp"] * theta - params["kd"] * obs[:, 2]
    return np.where(obs[:, 0] > params["catch"], balance, swing)
'''

PENDULUM_MOTIFS = [
    # written defaults act (none is a no-op); "energy pump" then "balance near upright" is the
    # energy swing-up baseline's structure, the rest are its ingredients
    ("angle feedback", '{expr} - params["{p0}"] * np.arctan2(obs[:, 1], obs[:, 0])', (("k_angle", 2.0, -20.0, 20.0),)),
    ("velocity damping", '{expr} - params["{p0}"] * obs[:, 2]', (("k_vel", 0.5, -10.0, 10.0),)),
    ("energy pump", '{expr} + params["{p0}"] * obs[:, 2] * (15.0 - 0.5 * obs[:, 2] ** 2 - 15.0 * obs[:, 0])',
     (("k_energy", 0.2, -1.0, 1.0),)),
    ("balance near upright",
     'np.where(obs[:, 0] > params["{p0}"], -params["{p1}"] * np.arctan2(obs[:, 1], obs[:, 0]) '
     '- params["{p2}"] * obs[:, 2], {expr})',
     (("catch", 0.85, 0.0, 1.0), ("kp", 10.0, 0.0, 30.0), ("kd", 2.0, 0.0, 10.0))),
    ("swing when hanging", 'np.where(obs[:, 0] < params["{p0}"], params["{p1}"] * np.sign(obs[:, 2] + 1e-3), {expr})',
     (("hang_cos", -0.5, -1.0, 1.0), ("swing_torque", 2.0, -2.0, 2.0))),
    ("torque limit", 'np.clip({expr}, -params["{p0}"], params["{p0}"])', (("torque_cap", 1.5, 0.0, 2.0),)),
    ("saturate", 'params["{p0}"] * np.tanh({expr})', (("tanh_scale", 2.0, 0.0, 2.0),)),
]

# -- MountainCarContinuous-v0 --------------------------------------------------------------
# obs: position in [-1.2, 0.6], velocity in [-0.07, 0.07]; action: force in [-1, 1].

MOUNTAINCAR_SEED = '''\
import numpy as np

PARAMS = {"push": (0.0, -1.0, 1.0)}


def act(obs, params):
    """A constant push (at 0: stay in the valley, at no fuel cost)."""
    return params["push"] + 0.0 * obs[:, 0]
'''

MOUNTAINCAR_RULE = '''\
import numpy as np

PARAMS = {"force": (1.0, 0.0, 1.0)}


def act(obs, params):
    """Bang-bang on velocity: push the way the car is moving (right from rest)."""
    return np.where(obs[:, 1] >= 0, params["force"], -params["force"])
'''

MOUNTAINCAR_MOTIFS = [
    ("velocity feedback", '{expr} + params["{p0}"] * obs[:, 1]', (("k_vel", 0.0, -100.0, 100.0),)),
    ("push with velocity", '{expr} + params["{p0}"] * np.sign(obs[:, 1] + 1e-6)', (("k_sign", 0.0, -1.0, 1.0),)),
    ("position feedback", '{expr} + params["{p0}"] * (obs[:, 0] + 0.5)', (("k_pos", 0.0, -10.0, 10.0),)),
    ("coast past", 'np.where(obs[:, 0] > params["{p0}"], params["{p1}"], {expr})',
     (("coast_from", 0.6, -1.2, 0.6), ("coast_force", 0.0, -1.0, 1.0))),
    ("force limit", 'np.clip({expr}, -params["{p0}"], params["{p0}"])', (("force_cap", 1.0, 0.0, 1.0),)),
]

# -- Shared baselines ----------------------------------------------------------------------


def random_program(discrete: bool, n: int, low: float = -1.0, high: float = 1.0) -> str:
    """Uniform actions from a fixed hash of each row's observation: seeded, reproducible
    episode by episode whatever the batching, and independent of the other rows."""
    pick = (f"np.minimum((u * {n}).astype(np.int64), {n - 1})" if discrete
            else f"{low!r} + u * {high - low!r}")
    return f'''\
import numpy as np


def act(obs, params):
    """Random actions: uniform, drawn from a fixed hash of the observation (seeded, deterministic)."""
    weights = np.sin(np.arange(1, obs.shape[1] + 1) * 12.9898) * 437.58
    u = np.modf(np.abs(np.sin(obs.astype(np.float64) @ weights + 0.5) * 43758.5453))[0]
    return {pick}
'''


def linear_names(obs_dim: int, actions: int, discrete: bool) -> list[str]:
    """Parameter names of the linear baseline; the tuner recognises it by exactly this set."""
    outs = range(1, actions) if discrete else range(actions)
    return [f"lin_w{i}_{j}" for j in outs for i in range(obs_dim)] + [f"lin_b{j}" for j in outs]


def linear_program(obs_dim: int, actions: int, discrete: bool, bound: float) -> str:
    """A linear policy: discrete, the argmax of linear action scores (action 0 scores 0);
    continuous, a linear map of the observation (clipped by the trusted side)."""
    lines = [f'    "{name}": (0.0, {-bound!r}, {bound!r}),' for name in linear_names(obs_dim, actions, discrete)]
    params = "PARAMS = {\n" + "\n".join(lines) + "\n}\n"
    if discrete:
        body = f'''\
    """Linear scores per action (obs @ W + b, action 0 fixed at 0); the best-scoring action."""
    scores = [np.zeros(len(obs))]
    for j in range(1, {actions}):
        scores.append(params[f"lin_b{{j}}"] + sum(params[f"lin_w{{i}}_{{j}}"] * obs[:, i] for i in range({obs_dim})))
    return np.argmax(np.stack(scores, axis=1), axis=1)
'''
    else:
        body = f'''\
    """A linear map of the observation: obs @ W + b, one column per action dimension."""
    cols = [params[f"lin_b{{j}}"] + sum(params[f"lin_w{{i}}_{{j}}"] * obs[:, i] for i in range({obs_dim}))
            for j in range({actions})]
    return np.stack(cols, axis=1)
'''
    return "import numpy as np\n\n" + params + "\n\ndef act(obs, params):\n" + body


def generic_seed(obs_dim: int, actions: int, discrete: bool, low: float = -1.0, high: float = 1.0) -> str:
    """The weak start for any environment without a program of its own: one weighted sum of the
    observation (every weight 0 by default, so a constant action) that tuning and mutation can shape."""
    lines = [f'    "w{i}": (0.0, -1.0, 1.0),' for i in range(obs_dim)] + ['    "bias": (0.0, -1.0, 1.0),']
    if discrete:
        action = f"np.clip(np.rint(s + {(actions - 1) / 2!r}), 0, {actions - 1}).astype(np.int64)"
        what = f"cut into the {actions} actions"
    else:
        action = f"np.repeat(np.clip(s * {(high - low) / 2!r}, {low!r}, {high!r})[:, None], {actions}, axis=1)"
        what = "scaled to the action range, the same for every action dimension"
    return f'''\
import numpy as np

PARAMS = {{
{chr(10).join(lines)}
}}


def act(obs, params):
    """A weighted sum of the observation, {what}."""
    s = params["bias"] + sum(params[f"w{{i}}"] * obs[:, i] for i in range({obs_dim}))
    return {action}
'''
