"""Evaluator actors on real Ray: hostile candidates are contained and the actor keeps serving."""
import ray

from controller.actors import EvaluatorActor
from evaluators.sandbox.config import SandboxConfig
from evaluators.registry import get_domain
from store.records import Status
from tests.tiny import TINY_INVENTORY

HOSTILE = {
    "infinite loop": ("def policy(state, params):\n    while True:\n        pass", Status.TIMEOUT),
    "memory bomb": ("def policy(state, params):\n    return bytearray(10**10)", Status.FAILED),
    "fork bomb": ("import os\ndef policy(state, params):\n    while True:\n        os.fork()", Status.FAILED),
    "os._exit": ("import os\ndef policy(state, params):\n    os._exit(0)", Status.FAILED),
    "NaN orders": ("import numpy as np\ndef policy(state, params):\n    return state['on_hand'] * np.nan", Status.INVALID),
    "syntax error": ("def policy(state, params)\n    return 0", Status.INVALID),
}


def test_one_actor_contains_every_hostile_candidate_and_keeps_scoring(ray_cluster):
    # the infinite loop ends on its CPU time (3 s); the honest program, evaluated last, has the wall clock's
    # 60 s, where 6 s for everyone timed it out once on a loaded CI machine
    actor = EvaluatorActor.remote("inventory", TINY_INVENTORY, SandboxConfig(wall_s=60, cpu_s=3, memory_mb=1024))
    seed = get_domain("inventory", **TINY_INVENTORY).seed_program
    refs = {name: actor.evaluate.remote(name, code, "search") for name, (code, _) in HOSTILE.items()}
    refs["honest"] = actor.evaluate.remote("honest", seed, "search")
    results = {name: ray.get(ref, timeout=120) for name, ref in refs.items()}
    for name, (_, status) in HOSTILE.items():
        assert results[name].status == status, (name, results[name].error)
        assert results[name].score is None and results[name].error
    assert results["honest"].status == Status.OK and results["honest"].score is not None
    ray.kill(actor)
