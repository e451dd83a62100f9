"""Learning skills during a run: a child that beat its parent is checked on the validation split.

A plain class (no Ray, no I/O): the run loop reports search results, asks for the
validation jobs to submit, and hands back their results. A check waits for the child's
and its parent's validation scores; when the child is ahead there too, the edit between
them becomes a skill record. Checks are rate-limited (one at a time, at most one per
`every` search evaluations) and the largest search gains go first, so validation costs
a small, bounded share of the evaluators. The held-out split plays no part.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from store.records import Candidate, EvalResult, Status
from workers.skill_edits import SkillEdit, extract_edit
from workers.skills import describe, skill_id

_QUEUE = 8  # checks waiting for their turn; the smallest gains drop out first


@dataclass(frozen=True)
class Check:
    """A child that beat its parent on the search split, waiting to be validated."""

    gain: float
    child: Candidate
    parent_id: str
    parent_code: str
    edit: SkillEdit


class SkillLearner:
    """Chooses validation checks and turns the ones that hold into skill records."""

    def __init__(self, domain: str, fingerprint: str, entry_point: str, every: int, min_gain: float,
                 validated: dict[str, float | None] | None = None):
        self.domain, self.fingerprint, self.entry_point = domain, fingerprint, entry_point
        self.every, self.min_gain = every, min_gain
        self.scores: dict[str, float | None] = dict(validated or {})  # program id -> validation score
        self.queue: list[Check] = []
        self.current: Check | None = None
        self.last_at: int | None = None
        self.submitted = 0

    def consider(self, child: Candidate, result: EvalResult, parent_id: str, parent_code: str,
                 parent_score: float | None) -> None:
        """Queue `child` for a check if it beat its parent on the search split by `min_gain`."""
        if result.status != Status.OK or parent_score is None or result.score is None:
            return
        gain = result.score - parent_score
        if gain <= self.min_gain or child.program_id in self.scores:
            return
        edit = extract_edit(parent_code, child.code, self.entry_point)
        if edit is None:
            return
        self.queue.append(Check(gain, child, parent_id, parent_code, edit))
        self.queue = sorted(self.queue, key=lambda c: -c.gain)[:_QUEUE]

    def jobs(self, done: int) -> list[Candidate]:
        """The programs to evaluate on the validation split now (none while a check runs)."""
        if self.current is not None or not self.queue:
            return []
        if self.last_at is not None and done - self.last_at < self.every:
            return []
        self.current, self.last_at = self.queue.pop(0), done
        check, jobs = self.current, []
        if check.parent_id not in self.scores:
            jobs.append(Candidate(check.parent_id, check.child.run_id, check.child.island, 0, (),
                                  check.parent_code, "validation", time.time()))
        jobs.append(check.child)
        self.submitted += len(jobs)
        return jobs

    def on_result(self, result: EvalResult) -> dict | None:
        """Record one validation result; the skill record when it completes a check that held."""
        self.scores[result.program_id] = result.score if result.status == Status.OK else None
        check = self.current
        if check is None or check.child.program_id not in self.scores or check.parent_id not in self.scores:
            return None
        self.current = None
        child, parent = self.scores[check.child.program_id], self.scores[check.parent_id]
        if child is None or parent is None or child <= parent:
            return None
        return self._skill(check, child - parent)

    def _skill(self, check: Check, validation_gain: float) -> dict:
        title, applies_when = describe(check.edit)
        return {"skill_id": skill_id(self.domain, check.edit), "domain": self.domain,
                "fingerprint": self.fingerprint, "title": title, "applies_when": applies_when,
                "edit": check.edit.to_record(), "search_gain": check.gain, "validation_gain": validation_gain,
                "parent_code": check.parent_code, "child_code": check.child.code,
                "run_id": check.child.run_id, "parent_id": check.parent_id,
                "child_id": check.child.program_id, "operator": check.child.mutator, "abstraction": ""}
