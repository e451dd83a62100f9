"""What the search does with each finished job: a proposal to check and evaluate, a score
for its island, a held-out or validation result to store.

A mixin of `controller.loop.Search`: the loop hands every finished job to `_on_<kind>`;
nothing here waits on Ray or writes to the archive (results are committed in batches by
the loop).
"""
from __future__ import annotations

import dataclasses
import time
import uuid

from controller.memory import WARM
from controller.resume import STARTS
from evaluators.params import write_params
from islands.population import Member
from store.records import Candidate, EvalResult, MutationRequest, Status
from workers.embedded import no_child_remedy, operators_reach


def new_id() -> str:
    return uuid.uuid4().hex[:12]


# Embedded-mutator requests in a row that came back with no child (each after `max_attempts`
# tries) before the run stops asking it. Its operators are random, so a parent they can change
# rarely fails this often: at a 5% success rate, 200 failures in a row come once in 30,000.
UNMADE_STALL = 200
ALREADY_TRIED = "each child it made was a program already tried"  # a duplicate, as an unmade request's reason


@dataclasses.dataclass
class Unmade:
    """The embedded mutator's requests that made no child: in a row and in all (this segment)."""

    in_a_row: int = 0  # or whose child was a duplicate: those too ask again with nothing new
    total: int = 0
    reason: str = ""
    stalled: bool = False  # asked no more until an island gains a member (its parents change)
    said: bool = False  # the console heard it once this segment


class Outcomes:
    """Mixed into `controller.loop.Search`: its islands, dedup, proposals, memory and buffers."""

    def _on_mutate(self, request: MutationRequest, proposal) -> None:
        if isinstance(proposal, str):
            self.events.append(("mutation-failed", {"island": request.island, "reason": proposal}))
            self._unmade(proposal)
            return
        candidate = Candidate(new_id(), self.run_id, request.island, request.generation, (request.parent_id,),
                              proposal.code, proposal.operator, time.time())
        why = self.dedup.check(proposal.code, proposal.form or None)  # the form its worker computed, if any
        if why:
            self.events.append(("duplicate", {"island": request.island, "operator": proposal.operator, "by": why}))
            self._unmade(ALREADY_TRIED, made=True)
            return
        self.unmade.in_a_row = 0
        self.dedup.add(proposal.code)
        self.parent_scores[candidate.program_id] = request.parent_score
        self.memory.on_proposal(candidate.program_id, request, getattr(proposal, "skill_id", ""))
        self._submit_eval(candidate)

    def _unmade(self, reason: str, made: bool = False) -> None:
        """Count a request that made no child, or (`made`) only one already tried; after UNMADE_STALL
        in a row, stop asking and say why (`Unmade.total` counts those without a child).

        Without this a program the operators cannot change (no number, comparison or arithmetic
        in its entry point) sent hundreds of requests a second, each archived, and the run sat
        at the same count until its wall time ran out; so did a parent whose few possible children
        were all tried (no literal or PARAMS to nudge), each request then a duplicate."""
        u = self.unmade
        u.in_a_row, u.total, u.reason = u.in_a_row + 1, u.total + (not made), reason
        if u.in_a_row < UNMADE_STALL or u.stalled:
            return
        u.stalled = True
        self.events.append(("embedded-stalled", {"requests_in_a_row": u.in_a_row, "reason": reason}))
        if u.said:
            return
        u.said = True
        entry = self.domain.entry_point
        if reason == ALREADY_TRIED:  # it changed them, into programs the run had already
            found = ("every child it made of these programs was one already tried: their changes are spent "
                     "(more operators, mutator.embedded.operators, or an LLM, [mutator.llm], widen them)")
        else:
            found = f"{operators_reach(entry)}, and found none to change in these programs"
        self.notices.append(
            f"atoll: the embedded mutator made no new child from the last {u.in_a_row} requests "
            f"({reason.removeprefix('mutation failed: ')}): {found}. A run with no other source of programs "
            f"ends here, everything kept; {no_child_remedy(entry)}, then `atoll resume {self.run_dir}`.")

    def _on_eval(self, candidate: Candidate, result: EvalResult) -> None:
        if result.status == Status.OK and result.tuned_params:
            proposed = candidate.code_hash  # kept, so a resume still knows this text was tried
            candidate = dataclasses.replace(candidate, code=write_params(candidate.code, result.tuned_params))
            result = dataclasses.replace(result, metrics={**result.metrics, "proposed_hash": proposed})
        form = self.dedup.add(candidate.code)
        if form is not None and result.split == "search":
            result = dataclasses.replace(result, metrics={**result.metrics, "form_hash": form})
        self.proposals.on_evaluated(candidate, result, self._parent_score(candidate))
        self.results.append((candidate, result))
        self.events += self.memory.on_search_result(candidate, result, None, self._parent_score(candidate))
        self._count_operator(candidate, result)
        if candidate.mutator in STARTS:
            self._on_seed(candidate, result)
            return
        if result.status == Status.OK:
            self._add_member(candidate.island, candidate, result)
        elif result.status == Status.RACED:  # a partial evaluation: never a member, never a best
            self.raced += 1
        else:
            self.failures += 1
        for event in self.islands.on_generation(candidate.island):
            self.events.append(("islands", {"island": candidate.island, "what": event}))

    def _on_llm(self, ref, job) -> None:
        """An LLM job's outcome: a candidate to evaluate, an INVALID one (never evaluated), or nothing."""
        actions = self.proposals.on_outcome(ref, job)
        if not actions:  # no child: forget what was kept for it
            self.parent_scores.pop(job.child_id, None)
            self.memory.forget(job.child_id)
        for action in actions:
            if action[0] == "eval":
                self._submit_eval(action[1])
            else:
                self._on_eval(action[1], action[2])
        self.events.extend(self.proposals.events)
        self.proposals.events.clear()

    def _parent_score(self, candidate: Candidate) -> float | None:
        """The score its parent had when the child was proposed (None for the seed or an unknown parent)."""
        return self.parent_scores.get(candidate.program_id)

    def _on_seed(self, candidate: Candidate, result: EvalResult) -> None:
        """The seed, or a warm start's elite, joins every island (a failed elite is only recorded)."""
        if result.status != Status.OK and candidate.mutator == WARM:
            return
        if result.status != Status.OK:
            self.events.append(("seed-failed", {"status": result.status.value, "error": result.error}))
            self.seed_error = f"{result.status.value}: {result.error}"
            return
        for island in range(self.config.islands.count):
            self._add_member(island, candidate, result)

    def _add_member(self, island: int, candidate: Candidate, result: EvalResult) -> None:
        member = Member(candidate.program_id, result.score, candidate.code, candidate.generation,
                        tuple(result.instance_scores), tuple(result.descriptors))
        self.islands.add_result(island, member)
        if self.unmade.stalled:  # new parents: the embedded mutator may find something to change in them
            self.unmade.in_a_row, self.unmade.stalled = 0, False
        if self.best_score is None or result.score > self.best_score:
            self.best_score = result.score
            self.events.append(("new-best", {"program_id": candidate.program_id, "score": result.score}))
            if self.config.controller.heldout_on_new_best:
                self._submit_eval(candidate, "heldout")

    def _count_operator(self, candidate: Candidate, result: EvalResult) -> None:
        if candidate.mutator in STARTS:
            return
        stat = self.stats[candidate.mutator]
        stat[0] += 1
        parent = self.parent_scores.pop(candidate.program_id, None)
        stat[1] += int(result.status == Status.OK and (parent is None or result.score > parent))

    def _on_heldout(self, candidate: Candidate, result: EvalResult) -> None:
        self.heldout.append(result)

    def _on_validate(self, candidate: Candidate, result: EvalResult) -> None:
        """A validation result: stored like a held-out one, and it may complete a skill check."""
        self.heldout.append(result)
        self.events += self.memory.on_validation(result)
