"""Score integrity: hostile candidates for the control domain, each through the real Evaluator.

Every hostile program's honest behaviour is to do nothing (action 0: no engine),
so none of them may score better than the honest do-nothing policy; each either
gets exactly that honest score or a status with a readable reason. The one that
remembers the tuning rounds' episodes plays a pseudo-random Pendulum policy instead,
and may score no better than that play without its memory.
"""
import os

import pytest

from evaluators.sandbox.config import SandboxConfig
from evaluators.domains.control.programs import LANDER_HEURISTIC
from evaluators.evaluator import Evaluator
from evaluators.secrets import RunSecrets
from store.records import Status
from tests.evaluators.hostile import (HUGE_REASON, SNOOP_PRELUDE, WRONG_READY_REASON, assert_outcome,
                                     forge_frame, remember_prelude, huge_reply, wrong_ready)

OPTIONS = {"search_seeds": 3, "heldout_seeds": 4, "max_steps": 150, "tune_trials": 2, "tune_batch": 2,
           "linear_trials": 2}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZERO = "import numpy as np\n\ndef act(obs, params):\n    return np.zeros(len(obs), dtype=np.int64)\n"

PATCH_SCORING = ZERO + '''
def _patch():
    import sys, builtins
    try:
        import gymnasium
        from gymnasium.envs.box2d import lunar_lander
        lunar_lander.LunarLander.step = lambda self, a: (self.state, 1000.0, True, False, {})
        gymnasium.Env.step = lambda self, a: (None, 1000.0, True, False, {})
    except Exception:
        pass
    try:
        import evaluators.domains.control.domain as control
        control.Control.evaluate = lambda *a, **k: None
        control.check_actions = lambda *a, **k: None
    except Exception:
        pass
    sys.modules["evaluators.domains.control.domain"] = None
    builtins.sum = lambda *a, **k: 1e9
    builtins.float = lambda *a, **k: 1e9
_patch()
'''

PATCH_NUMPY = '''\
import numpy as np
np.isfinite = lambda a, *r, **k: True
np.mean = lambda *a, **k: 1e9

def act(obs, params):
    np.add = lambda *a, **k: 1e9
    np.clip = lambda a, *r, **k: a
    return np.zeros(len(obs), dtype=np.int64)
'''

FORGE_FRAME = forge_frame("act(obs, params)", "np.zeros(len(obs), dtype=np.int64)",
                          {"score": 1e9, "status": "OK", "returns": [1e9], "metrics": {"mean_return": 1e9}})

SNOOP = SNOOP_PRELUDE + '''
def act(obs, params):
    _snoop_processes()
    _snoop_packages()
    _try("project", lambda: os.listdir(PROJECT))
    _try("files", lambda: [p for top in (os.path.dirname(PROJECT), os.path.expanduser("~root"), "/tmp")
                           for p in _walk(top, ("control", "seed"))])
    raise RuntimeError("snooped: " + " | ".join(FOUND))
'''

# A private copy of the simulator would let a candidate find the episode's seed from its first
# observation and plan on that copy; gymnasium and Box2D are hidden from its process.
OWN_SIMULATOR = '''\
import numpy as np

def _simulator():
    try:
        import gymnasium as gym
        return gym.make("LunarLander-v3")
    except Exception:
        pass
    try:
        import Box2D
        return Box2D.b2World()
    except Exception:
        return None

def act(obs, params):
    if _simulator() is not None:
        raise RuntimeError("the candidate has a private simulator")
    return np.zeros(len(obs), dtype=np.int64)
'''

REMEMBER = remember_prelude() + '\n' + LANDER_HEURISTIC.split("import numpy as np\n", 1)[1].replace("def act(", "def _good(") + '''

def act(obs, params):
    if REMEMBERED:  # a second evaluation that remembers would fly well
        return _good(obs, params)
    return np.zeros(len(obs), dtype=np.int64)
'''


@pytest.fixture(scope="module")
def evaluator():
    return Evaluator("control", OPTIONS, SandboxConfig(wall_s=60, startup_s=10))


@pytest.fixture(scope="module")
def honest(evaluator):
    """Scores of the honest do-nothing policy per split, checked to be well below the heuristic's."""
    scores = {}
    for split in ("search", "heldout"):
        zero, good = evaluator.evaluate("zero", ZERO, split), evaluator.evaluate("good", LANDER_HEURISTIC, split)
        assert zero.status == Status.OK and good.status == Status.OK
        assert good.score > zero.score + 50  # so "no better than doing nothing" is a real bar
        scores[split] = zero.score
    return scores



@pytest.mark.parametrize("name, code", [("patch scoring", PATCH_SCORING), ("patch numpy", PATCH_NUMPY),
                                        ("own simulator", OWN_SIMULATOR)], ids=lambda v: v[:20])
@pytest.mark.parametrize("split", ["search", "heldout"])
def test_patching_the_candidate_process_changes_nothing_trusted(evaluator, honest, name, code, split):
    assert_outcome(evaluator.evaluate(name, code, split), Status.OK, score=honest[split], tolerance=1e-9)


def test_forged_frames_are_rejected(evaluator, honest):
    result = evaluator.evaluate("forge", FORGE_FRAME, "search")
    assert_outcome(result, Status.INVALID, "malformed reply from the program: the reply has 4 fields")


def test_environments_seeds_and_project_are_out_of_reach(evaluator, honest, monkeypatch):
    monkeypatch.setenv("ATOLL_HELDOUT_SECRET", "s3cr3t-heldout-seed")
    result = evaluator.evaluate("snoop", SNOOP.replace("PROJECT", repr(ROOT)), "heldout")
    assert result.status == Status.FAILED and "snooped:" in result.error
    for leak in ("s3cr3t", "control.py", "control_programs", "environ:", "memory:", "maps:", "open files:",
                 "packages:", "imported ", "project:", "files:"):
        assert leak not in result.error, result.error


def test_nothing_written_in_one_evaluation_is_seen_by_the_next(evaluator, honest):
    code = REMEMBER.replace("PROJECT", repr(ROOT))
    first = evaluator.evaluate("remember", code, "search")
    second = evaluator.evaluate("remember", code, "search")
    assert_outcome(first, Status.OK, score=honest["search"], tolerance=1e-9)
    assert_outcome(second, Status.OK, score=honest["search"], tolerance=1e-9)
    assert not os.path.exists(os.path.join(ROOT, "atoll_note"))


@pytest.mark.parametrize("body, needle", [
    ("return np.full(len(obs), -1)", "discrete actions"),
    ("return np.zeros(len(obs)) + 0.5", "discrete actions"),
    ("return np.full(len(obs), 1e300)", "discrete actions"),
    ("return np.zeros(1 + len(obs), dtype=int)", "shape"),
    ("return np.zeros((len(obs), 4))", "shape"),
])
def test_bad_actions_are_invalid(evaluator, body, needle):
    result = evaluator.evaluate("bad", f"import numpy as np\n\ndef act(obs, params):\n    {body}\n", "search")
    assert result.status == Status.INVALID and needle in result.error and "step" in result.error


ANSWER = ('act(obs, params)', 'np.zeros(len(obs), dtype=np.int64)')
REPLIES = {"16 MiB reply": (huge_reply(*ANSWER), HUGE_REASON), "wrong ready": (wrong_ready(*ANSWER), WRONG_READY_REASON)}


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_replies_that_could_hurt_the_evaluator_are_invalid(evaluator, name):
    code, reason = REPLIES[name]
    assert_outcome(evaluator.evaluate("reply", code, "search"), Status.INVALID, reason)


# Pendulum: every episode runs to the step limit (the rows never change order), its dynamics
# are deterministic and each step's reward follows from the observation and the action, so a
# program can recognise an episode by its first observation, keep what its actions earned there
# and replay the best sequence it has met when the same episode comes again in a later round.
PLAY = '''\
import numpy as np

PARAMS = {"p": (0.0, 0.0, 10.0)}


def _honest(obs, params):  # a pseudo-random bang-bang play, a fixed function of the observation
    x = obs.astype(float) @ np.array([12.9898, 78.233, 37.719]) * 437.58 + params["p"] * 91.3
    return np.where(np.sin(x) >= 0, 2.0, -2.0)
'''
MEMORISE = PLAY + '''
BEST = {}  # episode (first observation) -> (return, actions)
RUN = {}


def _angle(obs):
    return np.arctan2(obs[:, 1].astype(float), obs[:, 0].astype(float))


def _continues(obs):
    prev = RUN.get("obs")
    if prev is None or len(prev) != len(obs):
        return False
    gap = _angle(obs) - _angle(prev) - obs[:, 2].astype(float) * 0.05
    return bool((np.abs((gap + np.pi) % (2 * np.pi) - np.pi) < 1e-3).all())


def _commit():
    for key, total, acts in zip(RUN.get("keys", []), RUN.get("returns", []), RUN.get("acts", [])):
        if key not in BEST or total > BEST[key][0]:
            BEST[key] = (total, list(acts))


def act(obs, params):
    if not _continues(obs):
        _commit()
        RUN.update(keys=[tuple(np.round(row, 4).tolist()) for row in obs], returns=[0.0] * len(obs),
                   acts=[[] for _ in obs], step=0)
    out = _honest(obs, params)
    step = RUN["step"]
    for i, key in enumerate(RUN["keys"]):
        if key in BEST and step < len(BEST[key][1]):
            out[i] = BEST[key][1][step]
    theta, speed = _angle(obs), obs[:, 2].astype(float)
    for i in range(len(obs)):
        RUN["returns"][i] -= theta[i] ** 2 + 0.1 * speed[i] ** 2 + 0.001 * out[i] ** 2
        RUN["acts"][i].append(float(out[i]))
    RUN["obs"], RUN["step"] = obs.copy(), step + 1
    return out
'''
REPLAY_OPTIONS = {"env": "Pendulum-v1", "search_seeds": 12, "validation_seeds": 12, "max_steps": 40,
                  "tune_trials": 12, "tune_batch": 10}


@pytest.mark.parametrize("split", ["search", "validation"])
def test_a_program_that_remembers_the_tuning_rounds_episodes_scores_what_its_play_earns_without_memory(split):
    """The tuning rounds replay the same episodes to one process: a program that kept the best
    actions it found per episode in round one and replayed them in round two would score the
    best of ten tries on every episode. Only episodes that tuning never showed may count, so its
    score is exactly that of its tuned play with no memory (the same episodes, nothing to tune)."""
    evaluator = Evaluator("control", REPLAY_OPTIONS, SandboxConfig(wall_s=60, startup_s=10),
                          secrets=RunSecrets.fixed(7))
    memorise = evaluator.evaluate("memorise", MEMORISE, split)
    assert memorise.status == Status.OK, memorise.error
    tuned = repr(memorise.tuned_params["p"])
    plain = PLAY.replace('PARAMS = {"p": (0.0, 0.0, 10.0)}', "") + (
        f"\n\ndef act(obs, params):\n    return _honest(obs, {{'p': np.full(len(obs), {tuned})}})\n")
    without_memory = evaluator.evaluate("plain", plain, split)
    assert without_memory.status == Status.OK, without_memory.error
    assert memorise.instance_scores == pytest.approx(without_memory.instance_scores, abs=1e-9), \
        (memorise.score, without_memory.score)
