"""SCIP in the trusted process: one solve under the benchmark protocol, with or without a policy.

`PolicyBranchrule` is a PySCIPOpt branching rule above SCIP's default. At each
LP branching decision it gathers the features of the LP candidates into numpy
arrays, makes ONE `PolicyFn` call, checks the reply (one finite score per
candidate) and branches on the best. Anything that goes wrong inside the
callback (a `CandidateError`: timeout, crash, bad frame, bad scores) is kept,
the solve is interrupted and the error is raised again after `optimize()`,
because an exception cannot cross SCIP's C frames.

Protocol: no cuts below the root (`separating/maxrounds=0`), no restarts, one
thread, a time limit, SCIP's seed shifted per run, output off.

Clock: "cpu" (the default) times SCIP with its CPU clock, which other processes
on the machine (a second evaluator, the controller) barely move, and adds the
wall time spent waiting on the policy, which runs in another process and so is
not on that clock: a program is charged for its own computation. SCIP's CPU
clock is this process's user time, so what the process itself spends in user
mode during a policy call (packing the request, reading the reply) is on that
clock already: it is taken off the wait, never charged twice. "wall" times
everything with SCIP's wall clock. Either way the time limit holds for the sum.
"""
from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass

import numpy as np
from pyscipopt import SCIP_BRANCHDIR, SCIP_RESULT, Branchrule, Model

from evaluators._base import CandidateError, PolicyFn, numeric_reply
from store.records import Status

POLICY_PRIORITY = 1_000_000  # above relpscost's 10000
BUILTIN_RULES = {"scip default": None, "scip pscost": "pscost", "scip fullstrong": "fullstrong"}
_BIG = 1e20
CLOCKS = {"cpu": 1, "wall": 2}  # SCIP's timing/clocktype


@dataclass(frozen=True)
class SolveRecord:
    """One solve of one instance with one SCIP seed."""

    time_s: float  # SCIP's solving time plus the policy's (see Clock above), the time limit when unsolved
    nodes: int
    status: str
    solved: bool
    calls: int = 0  # policy calls
    policy_s: float = 0.0  # wall time spent waiting on the policy
    chosen_infeasibility: float = 0.0  # mean min(f, 1 - f) of the chosen candidates


def new_model(path: str, scip_seed: int, time_limit_s: float, clock: str = "cpu") -> Model:
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}; choose one of {', '.join(CLOCKS)}")
    model = Model()
    model.hideOutput()
    model.readProblem(path)
    for name, value in (("separating/maxrounds", 0), ("presolving/maxrestarts", 0),
                        ("parallel/maxnthreads", 1), ("lp/threads", 1),
                        ("randomization/randomseedshift", scip_seed), ("limits/time", time_limit_s),
                        ("timing/clocktype", CLOCKS[clock])):
        model.setParam(name, value)
    return model


def solve(path: str, scip_seed: int, time_limit_s: float, builtin: str | None = None,
          policy: PolicyFn | None = None, params: dict | None = None, clock: str = "cpu") -> SolveRecord:
    """Solve once; `builtin` names a SCIP rule given top priority, `policy` plugs in a program."""
    model = new_model(path, scip_seed, time_limit_s, clock)
    if builtin:
        model.setParam(f"branching/{builtin}/priority", POLICY_PRIORITY)
    rule = None
    if policy is not None:
        # on the CPU clock the policy's waits are not on SCIP's clock: the rule stops the solve
        # itself once SCIP's time plus those waits reach the limit
        rule = PolicyBranchrule(policy, dict(params or {}), time_limit_s if clock == "cpu" else math.inf)
        model.includeBranchrule(rule, "atoll_policy", "an evolved program, via the sandbox",
                                priority=POLICY_PRIORITY, maxdepth=-1, maxbounddist=1.0)
    model.optimize()
    if rule is not None and rule.error is not None:
        raise rule.error
    status = model.getStatus()
    spent = float(model.getSolvingTime())
    if rule is not None and clock == "cpu":
        spent += rule.charged_s
    if rule is not None and rule.out_of_time:
        status = "timelimit"
    solved = status in ("optimal", "infeasible")
    record = SolveRecord(min(spent, float(time_limit_s)) if solved else float(time_limit_s),
                         int(model.getNNodes()), status, solved)
    if rule is not None:
        record = SolveRecord(record.time_s, record.nodes, status, solved, rule.calls, rule.policy_s,
                             float(np.mean(rule.chosen)) if rule.chosen else 0.0)
    model.freeProb()
    return record


def check_scores(reply, n: int, where: str) -> np.ndarray:
    """The reply as n finite scores, or CandidateError INVALID naming what is wrong."""
    scores = numeric_reply(reply, "scores", lambda reason: _reject(where, reason))
    if scores.shape != (n,):
        _reject(where, f"scores have shape {scores.shape}; expected ({n},), one per candidate")
    bad = ~np.isfinite(scores.astype(float))
    if bad.any():
        _reject(where, f"{int(bad.sum())} of {n} scores are not finite (e.g. {scores[bad][0]})")
    return scores.astype(float)


def _reject(where: str, reason: str):
    raise CandidateError(Status.INVALID, f"{where}: {reason}")


def _user_s() -> float:
    """This process's user CPU time: what SCIP's CPU clock counts (`times()`' user part), finer grained."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def _finite(x: float) -> float:
    return float(min(max(x, -_BIG), _BIG)) if not math.isnan(x) else 0.0


class PolicyBranchrule(Branchrule):
    """Branch on the LP candidate the policy scores highest; one policy call per decision."""

    def __init__(self, policy: PolicyFn, params: dict, limit_s: float = math.inf):
        self.policy, self.params, self.limit_s = policy, params, limit_s
        self.error: BaseException | None = None
        self.out_of_time = False
        self.calls, self.policy_s, self.chosen = 0, 0.0, []
        self.charged_s = 0.0  # policy_s less this process's user time in the calls (on SCIP's CPU clock already)
        self._nnz: dict[int, int] | None = None

    def branchexeclp(self, allowaddcons):
        if self.error is not None:
            return {"result": SCIP_RESULT.DIDNOTRUN}
        try:
            return self._branch()
        except BaseException as exc:  # noqa: BLE001 - re-raised after optimize(); SCIP's C frames sit between
            self.error = exc
            self.model.interruptSolve()
            return {"result": SCIP_RESULT.DIDNOTRUN}

    # A node whose LP SCIP did not solve (an interrupted or failed LP, a time limit reached inside
    # it) is branched on its pseudo solution or external candidates. The policy decides among LP
    # candidates only, so it declines those and SCIP's own rules branch there; PySCIPOpt's
    # defaults raise, which made SCIP abort the whole solve.
    def branchexecps(self, allowaddcons):
        return {"result": SCIP_RESULT.DIDNOTRUN}

    def branchexecext(self, allowaddcons):
        return {"result": SCIP_RESULT.DIDNOTRUN}

    def _branch(self):
        if self.model.getSolvingTime() + self.charged_s >= self.limit_s:
            self.out_of_time = True
            self.model.interruptSolve()
            return {"result": SCIP_RESULT.DIDNOTRUN}
        cands, sols, fracs, _, npriocands, _ = self.model.getLPBranchCands()
        cands, state = cands[:npriocands], self.features(cands[:npriocands], sols, fracs)
        start, own = time.perf_counter(), _user_s()
        self.calls += 1
        try:
            reply = self.policy([(state, self.params)])[0]
        finally:
            waited = time.perf_counter() - start
            self.policy_s += waited
            self.charged_s += max(waited - (_user_s() - own), 0.0)
        scores = check_scores(reply, len(cands), f"node {self.model.getNNodes()}, decision {self.calls}")
        best = int(np.argmax(scores))
        self.chosen.append(float(state["infeasibility"][best]))
        self.model.branchVar(cands[best])
        return {"result": SCIP_RESULT.BRANCHED}

    def features(self, cands, sols, fracs) -> dict:
        """Per-candidate arrays and node scalars: everything a classic rule needs, nothing more."""
        m, n = self.model, len(cands)
        frac = np.asarray(fracs[:n], dtype=float)
        down, up = SCIP_BRANCHDIR.DOWNWARDS, SCIP_BRANCHDIR.UPWARDS
        nnz = self._column_counts()
        per = np.array([(m.getVarPseudocost(v, down), m.getVarPseudocost(v, up),
                         v.getNBranchings(down), v.getNBranchings(up), m.getVarPseudocostScore(v, s),
                         v.getObj(), v.getNLocksDown(), v.getNLocksUp(), nnz.get(v.getIndex(), 0),
                         v.getLbLocal(), v.getUbLocal()) for v, s in zip(cands, sols[:n])], dtype=float)
        per = np.nan_to_num(per, nan=0.0, posinf=_BIG, neginf=-_BIG).reshape(n, 11)
        node = m.getCurrentNode()
        state = {"lp_value": np.asarray(sols[:n], dtype=float), "frac": frac,
                 "infeasibility": np.minimum(frac, 1.0 - frac)}
        for k, key in enumerate(("ps_down", "ps_up", "ps_count_down", "ps_count_up", "ps_score", "obj",
                                 "locks_down", "locks_up", "col_nnz", "lb", "ub")):
            state[key] = np.ascontiguousarray(per[:, k])
        state.update(depth=int(m.getDepth()), n_nodes=int(m.getNNodes()), n_cands=n,
                     node_bound=_finite(node.getLowerbound()), lp_obj=_finite(m.getLPObjVal()),
                     primal_bound=_finite(m.getPrimalbound()), gap=_finite(m.getGap()),
                     root_bound=_finite(m.getDualboundRoot()), maximize=m.getObjectiveSense() == "maximize")
        return state

    def _column_counts(self) -> dict[int, int]:
        """Nonzeros per column in the LP rows at the first decision (rows change only at the root)."""
        if self._nnz is None:
            counts: dict[int, int] = {}
            for row in self.model.getLPRowsData():
                for col in row.getCols():
                    key = col.getVar().getIndex()
                    counts[key] = counts.get(key, 0) + 1
            self._nnz = counts
        return self._nnz
