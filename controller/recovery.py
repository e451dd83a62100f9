"""The search loop's side of a lost actor: which of its jobs stand, run again or are given up.

What becomes of each job is decided in `controller.faults` (the oldest unfinished job was
running and is charged with the death; the ones queued behind it are requeued as they were);
this mixin of `controller.loop.Search` carries the decision out: it delivers the finished
results, replaces the actor, resends the rest and records the loss as an event.
"""
from __future__ import annotations

from ray.exceptions import RayActorError

from controller import faults
from controller.cluster import SPLIT
from store.records import EvalResult, Status


class LostActors:
    """Mixed into `controller.loop.Search`: its `pending` jobs, actors and result handlers."""

    def _actor_lost(self, kind: str, actor: int, exc: RayActorError) -> None:
        """Keep what the dead actor finished, charge the job it was running, requeue the rest, replace it.

        A job sent once Ray had the actor as dead (an evaluator of a lost node that sat idle) never
        ran there: it is requeued uncharged, as the jobs queued behind the running one are."""
        mutating = kind == "mutate"
        jobs = {ref: job[:2] for ref, job in self.pending.items() if job[2] == actor and (job[0] == "mutate") == mutating}
        dead = (self.mutators if mutating else self.evaluators)[actor]
        unstarted = faults.sent_after_death(dead, {ref: self.pending.sent.get(ref) for ref in jobs})
        for ref in jobs:
            del self.pending[ref]
        self._replace(mutating, actor)
        keys = {ref: _job_id(*job) for ref, job in jobs.items()}
        fate = faults.triage(keys, self.deaths, *(("mutation request", "mutator") if mutating else ()),
                             unstarted=unstarted)
        for ref in fate.finished:
            self._deliver(*jobs[ref], self._value(ref, *jobs[ref]))
        self.events.append(("actor-lost", fate.event("mutator" if mutating else "evaluator", actor, keys, exc)))
        for ref in fate.retry:
            self._resend(*jobs[ref])
        if fate.given_up is not None:
            self._give_up(*jobs[fate.given_up], fate.reason)

    def _replace(self, mutating: bool, actor: int) -> None:
        if not mutating:
            return self._replace_evaluator(actor)  # controller.cluster: it works once placed and ready
        faults.retire(self.mutators[actor])
        self.mutators[actor] = self._new_mutator()

    def _resend(self, kind: str, payload) -> None:
        if kind == "mutate":
            self._send_mutation(payload)
        else:
            self._submit_eval(payload, SPLIT[kind])

    def _give_up(self, kind: str, payload, reason: str) -> None:
        if kind == "mutate":
            self.events.append(("mutation-failed", {"island": payload.island, "reason": reason}))
        else:
            self._deliver(kind, payload, EvalResult(payload.program_id, SPLIT[kind], Status.FAILED, error=reason))


def _job_id(kind: str, payload) -> str:
    """A job's identity across requeues: the program and split it evaluates, or the mutation request."""
    if kind == "mutate":
        return f"mutate:island {payload.island}:seed {payload.seed}"
    return f"{SPLIT[kind]}:{payload.program_id}"
