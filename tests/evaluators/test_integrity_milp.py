"""Score integrity for the MILP domain: hostile candidates, each through the real Evaluator and SCIP.

Every hostile program's honest behaviour is the most-infeasible rule. SCIP's
tree is deterministic for a given sequence of branching decisions, so a program
that branches like most-infeasible must get exactly its node counts on every
run, whatever else it tries; the trusted side recomputes the score from its own
clock. Anything else must end in a status with a readable reason.
"""
import os
import shutil
import tempfile

import pytest

from evaluators.sandbox.config import SandboxConfig
from evaluators.evaluator import Evaluator
from evaluators.domains.milp.programs import BASELINES
from evaluators.secrets import RunSecrets
from store.records import Status
from tests.evaluators.hostile import (HUGE_REASON, SNOOP_PRELUDE, WRONG_READY_REASON, assert_outcome,
                                     forge_frame, remember_prelude, huge_reply, wrong_ready)

OPTIONS = {"search_size": "fast", "heldout_size": "fast", "search_instances": 1, "heldout_instances": 1,
           "search_offset": 2, "heldout_offset": 3, "scip_seeds": 1, "time_limit_s": 20,
           "reference_rules": ["scip default"]}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HONEST = BASELINES["most-infeasible"]

PATCH_SCORING = HONEST + '''
def _patch():
    import sys, builtins
    for name in ("evaluators.domains.milp.domain", "evaluators.domains.milp.scip", "pyscipopt"):
        try:
            module = __import__(name, fromlist=["x"])
            for attr in ("solve", "sgm", "check_scores", "Model"):
                setattr(module, attr, lambda *a, **k: 0.0)
        except Exception:
            pass
        sys.modules[name] = None
    builtins.sum = lambda *a, **k: 0
    builtins.max = lambda *a, **k: 0
_patch()
'''

PATCH_NUMPY = '''\
import numpy as np
np.argmax = lambda *a, **k: 0
np.isfinite = lambda a, *r, **k: True
np.exp = lambda a, *r, **k: 0.0

def policy(state, params):
    np.log = lambda *a, **k: 0.0
    return np.asarray(state["infeasibility"], dtype=float)
'''

FORGE_FRAME = forge_frame("policy(state, params)", 'np.asarray(state["infeasibility"], dtype=float)',
                          {"score": 0.0, "status": "OK", "actions": [], "time_ratio_to_default": 0.01})

SNOOP = SNOOP_PRELUDE + '''
def policy(state, params):
    _snoop_processes()
    _snoop_packages()
    _try("instances", lambda: [f for d, _, fs in os.walk(CACHE) for f in fs])
    _try("instance text", lambda: open(LPFILE).read(64))
    _try("project", lambda: os.listdir(PROJECT))
    raise RuntimeError("snooped: " + " | ".join(FOUND))
'''

REMEMBER = remember_prelude(' + [os.path.join(CACHE, "atoll_note")]') + '''
def policy(state, params):
    if REMEMBERED:  # a second evaluation that remembers would branch differently
        return -np.asarray(state["infeasibility"], dtype=float)
    return np.asarray(state["infeasibility"], dtype=float)
'''

# Most-infeasible with a scale to tune (every value branches alike) that raises when a solve begins after
# another in its process (the node count falls back to the root's): what a rule that carried one solve's
# tree into the next (another SCIP seed of the instance, another tuning trial) would notice.
SECOND_SOLVE_REFUSED = '''\
import numpy as np

PARAMS = {"scale": (1.0, 0.5, 2.0)}
LAST = [0]


def policy(state, params):
    if int(state["n_nodes"]) < LAST[0]:
        raise RuntimeError("a second solve in this process")
    LAST[0] = int(state["n_nodes"])
    return np.asarray(state["infeasibility"], dtype=float) * (params["scale"] > 0)
'''

INF = "import numpy as np\n\ndef policy(state, params):\n    return np.full(state['n_cands'], np.inf)\n"
EXTRA_BATCH = ("import numpy as np\n\ndef policy(state, params):\n"
               "    return np.asarray(state['infeasibility'], dtype=float).reshape(1, -1)\n")


def _cache_base() -> str:
    """A cache outside the spots every sandbox hides anyway (/tmp, home, project), if one is writable."""
    for base in ("/run", "/srv", "/opt"):
        if os.access(base, os.W_OK):
            return base
    return tempfile.gettempdir()


@pytest.fixture(scope="module")
def cache():
    path = tempfile.mkdtemp(prefix="atoll-milp-integrity-", dir=_cache_base())
    old = os.environ.get("ATOLL_CACHE_DIR")
    os.environ["ATOLL_CACHE_DIR"] = path
    yield path
    if old is None:
        os.environ.pop("ATOLL_CACHE_DIR")
    else:
        os.environ["ATOLL_CACHE_DIR"] = old
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def evaluator(cache):
    # replay seed 2024: instances that branch (a drawn secret's small instances are sometimes solved at the root)
    return Evaluator("milp", OPTIONS, SandboxConfig(wall_s=60, startup_s=10), secrets=RunSecrets.fixed(2024))


@pytest.fixture(scope="module")
def honest(evaluator):
    """Per-run node counts of the honest most-infeasible rule, per split."""
    nodes = {}
    for split in ("search", "heldout"):
        result = evaluator.evaluate("honest", HONEST, split)
        assert result.status == Status.OK and result.metrics["policy_calls"] > 3
        nodes[split] = [r["nodes"] for r in result.metrics["per_run"]]
    return nodes


def _as_honest(result, nodes):
    assert result.status == Status.OK, result.error
    assert [r["nodes"] for r in result.metrics["per_run"]] == nodes
    assert result.score == pytest.approx(-result.metrics["time_ratio_to_default"])


@pytest.mark.parametrize("name, code", [("patch scoring", PATCH_SCORING), ("patch numpy", PATCH_NUMPY)],
                         ids=["patch scoring", "patch numpy"])
@pytest.mark.parametrize("split", ["search", "heldout"])
def test_patching_the_candidate_process_changes_nothing_trusted(evaluator, honest, name, code, split):
    _as_honest(evaluator.evaluate(name, code, split), honest[split])


def test_forged_frames_are_rejected(evaluator, honest):
    result = evaluator.evaluate("forge", FORGE_FRAME, "search")
    assert_outcome(result, Status.INVALID, "malformed reply from the program: the reply has 4 fields")


def test_instances_and_the_evaluator_are_out_of_reach(evaluator, honest, cache, monkeypatch):
    monkeypatch.setenv("ATOLL_HELDOUT_SECRET", "s3cr3t-heldout-seed")
    lp = next(os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f.endswith(".lp"))
    code = SNOOP.replace("CACHE", repr(cache)).replace("LPFILE", repr(lp)).replace("PROJECT", repr(ROOT))
    result = evaluator.evaluate("snoop", code, "heldout")
    assert result.status == Status.FAILED and "snooped:" in result.error
    for leak in ("s3cr3t", "environ:", "memory:", "open files:", "packages:", "imported ", "instances:",
                 "instance text:", "project:"):
        assert leak not in result.error, result.error


def test_nothing_written_in_one_evaluation_is_seen_by_the_next(evaluator, honest, cache):
    code = REMEMBER.replace("CACHE", repr(cache)).replace("PROJECT", repr(ROOT))
    for _ in range(2):
        _as_honest(evaluator.evaluate("remember", code, "search"), honest["search"])
    assert not os.path.exists(os.path.join(cache, "atoll_milp_note"))
    assert not os.path.exists(os.path.join(ROOT, "atoll_milp_note"))


@pytest.mark.parametrize("code, needle", [(INF, "not finite"), (EXTRA_BATCH, "shape")], ids=["inf", "2-d"])
def test_unbounded_or_misshapen_scores_are_invalid(evaluator, code, needle):
    result = evaluator.evaluate("bad", code, "search")
    assert result.status == Status.INVALID and needle in result.error


ANSWER = ('policy(state, params)', 'np.asarray(state["infeasibility"], dtype=float)')
REPLIES = {"16 MiB reply": (huge_reply(*ANSWER), HUGE_REASON), "wrong ready": (wrong_ready(*ANSWER), WRONG_READY_REASON)}


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_replies_that_could_hurt_the_evaluator_are_invalid(evaluator, name):
    code, reason = REPLIES[name]
    assert_outcome(evaluator.evaluate("reply", code, "search"), Status.INVALID, reason)


@pytest.mark.parametrize("options", [{"scip_seeds": 2}, {"tune_trials": 2}], ids=["two seeds", "two trials"])
def test_each_solve_starts_in_a_process_that_remembers_no_other(cache, options):
    """Each instance is solved under several SCIP seeds and in every tuning trial, all in one evaluation: each
    solve now gets a new process of the program (it failed at the second), and scores as the honest rule."""
    evaluator = Evaluator("milp", {**OPTIONS, **options, "search_default": "cached"},
                          SandboxConfig(wall_s=60, startup_s=10), secrets=RunSecrets.fixed(2024))
    honest = evaluator.evaluate("honest", HONEST, "search")
    assert honest.status == Status.OK and honest.metrics["runs"] == options.get("scip_seeds", 1)
    _as_honest(evaluator.evaluate("refused", SECOND_SOLVE_REFUSED, "search"),
               [r["nodes"] for r in honest.metrics["per_run"]])
