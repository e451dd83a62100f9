"""A run's memory: what it takes from the library and what it gives back.

The run loop calls these hooks; everything here runs in the driver, which is also the
run archive's only writer. What the run takes and gives is logged as events in its own
archive first ("warm-start-plan", "warm-start", "skill-use", "skill-learned"; views in
store/schema/007_memory.sql), then sent to the library in short transactions at commit
points. Library writes are idempotent, so a busy library only delays them, and `finish`
re-sends the run's whole contribution from its archive (after a crash, on resume).

Selection never sees the held-out split: elites are chosen by search score, skills by
the validation split.
"""
from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import numpy as np

from controller.backup import LibraryAway
from controller.fingerprint import fingerprint
from controller.rundir import ARCHIVE
from controller.skill_learning import SkillLearner
from controller.variant_memory import VariantMemory
from controller.warm_start import plan_warm_start, stored_plan
from store import library_records as records
from store.library import Library, LibraryBusy, LibraryError, default_path
from store.records import Candidate, EvalResult, Status
from workers.prompt_variants import PromptVariant
from workers.skill_edits import SkillEdit
from workers.skills import Skill, rank_skills

WARM = "warm-start"  # Candidate.mutator of an elite a warm start evaluates first (controller.resume.STARTS)
_FLUSH_PATIENCE_S = 2.0  # longest a flush during the search waits for a busy library
_BACKUP_RETRY_S = 300.0  # a library backup that failed during the run is tried again after this


def domain_name(config) -> str:
    """The domain's name in the library: its registered name, or the name a file domain's class gives
    itself; `file:NAME` for a file domain that takes a registered domain's name (`atoll new-domain
    inventory`), whose skills and prompt variants must not mix with the registered domain's."""
    from evaluators.registry import domain_names, get_domain_class

    name = get_domain_class(config.domain).name
    from_file = bool(config.domain.path or config.domain.source)
    return f"file:{name}" if from_file and name in domain_names() else name


def open_library(config) -> Library | None:
    """The run's library, created or checked now (LibraryError: one line for the user); None if off."""
    if not config.memory.enabled:
        return None
    library = Library(default_path(config.memory.library), config.memory.busy_timeout_s)
    library.ensure()
    return library


def check_memory(config) -> None:
    """Fail early, before a run directory is made: the library must be readable and
    `memory.warm_from` must name runs it knows (LibraryError, WarmStartError)."""
    library = open_library(config)
    if library is not None and config.memory.warm_start:
        fp = fingerprint(config.domain)
        library.transaction(lambda con: plan_warm_start(con, config, fp))


def skill_from_row(row: dict) -> Skill:
    return Skill(row["skill_id"], row["domain"], row["title"], row["applies_when"],
                 SkillEdit.from_record(row["edit"]), row["search_gain"], row["validation_gain"],
                 int(row.get("uses") or 0), int(row.get("successes") or 0), row.get("parent_code", ""),
                 row.get("child_code", ""), row.get("abstraction") or "")


def retrieve_skills(library: Library, domain: str, parent_code: str, k: int = 3, entry_point: str = "policy",
                    run_ids: list[str] | None = None) -> list[Skill]:
    """The library's `k` best skills for `parent_code` (retired ones never), best first; for callers
    outside a run. Inside a run, `MutationRequest.skills` already carries them, ranked the same way."""
    rows = library.transaction(lambda con: records.skills(con, domain, run_ids=run_ids))
    return rank_skills([skill_from_row(r) for r in rows], parent_code, entry_point, k)


class RunMemory:
    """The hooks the run loop calls; with the library off, every hook does nothing."""

    def __init__(self, config, archive, run_id: str, run_dir, entry_point: str = "policy", status: str = "running"):
        self.config, self.memory, self.archive, self.run_id = config, config.memory, archive, run_id
        self.run_dir = str(Path(run_dir).resolve())
        self.entry_point = entry_point
        self.domain, self.fingerprint = domain_name(config), fingerprint(config.domain)
        self.library = open_library(config)
        self.skills: dict[str, Skill] = {}
        self.warm: list[dict] = []  # elites of the warm start not yet submitted
        self.warm_source: dict[str, dict] = {}  # program id -> the elite it re-evaluates
        self.skill_of: dict[str, tuple[str, str]] = {}  # child program id -> (skill id, parent id)
        self.parent_code: dict[str, str] = {}  # in-flight child id -> its parent's code (skill learning)
        self.variant_of: dict[str, str] = {}  # in-flight LLM child id -> the prompt variant it was asked with
        self.pending = {"skills": [], "uses": []}
        self.last_flush, self.flush_error, self.unwritable = 0.0, "", False
        self.notices: list[str] = []  # lines for stderr during the run (controller.progress)
        self.backup_failed, self.backup_retry_at = False, 0.0
        # the library's backups also copied off this machine (controller.backup_dir), as the run's are
        self.away = (LibraryAway(config.controller.backup_dir, self.library.path)
                     if self.library is not None and config.controller.backup_dir else None)
        self.known_at: str | None = None  # where the library knew this run before this driver's first write
        self.learner = SkillLearner(self.domain, self.fingerprint, entry_point, self.memory.validate_every,
                                    self.memory.min_gain, self._validated())
        self.plan = self._plan()
        self.variants = self._variants()
        self.rng = np.random.default_rng([config.run.seed, 16])
        best = archive.best_program(run_id, "search")
        self.flush(archive.count_evaluations(run_id, "search"), best and best["score"], status, force=True)
        self._copy_away()  # a backup made before backup_dir was set, or whose copy a lost driver left unmade
        self._say_if_copied()

    def _say_if_copied(self) -> None:
        """One line when the library knew this run in another directory that still holds a run's
        archive: one directory is a copy of the other (copied to go on elsewhere, or to branch)."""
        other = self.known_at
        if not other or other == self.run_dir or not (Path(other) / ARCHIVE).is_file():
            return
        print(f"atoll: the library knew run {self.run_id} at {other}, which still holds a run's archive (a copy of "
              f"this one, or this of it); it now follows {self.run_dir}. Both copies write to the library as run "
              f"{self.run_id} (its elites are those of the copy that wrote last); to keep a branch apart, start "
              f"it as a run of its own, warm-started from this one: atoll run CONFIG --set memory.warm_start=true "
              f"--set 'memory.warm_from=[\"{self.run_dir}\"]'", file=sys.stderr, flush=True)

    @property
    def active(self) -> bool:
        return self.library is not None

    def _plan(self) -> dict | None:
        if not self.active or not self.memory.warm_start:
            return None
        plan = stored_plan(self.archive, self.run_id)
        if plan is None:
            plan = self.library.transaction(lambda con: plan_warm_start(con, self.config, self.fingerprint))
            self.archive.log_events(self.run_id, [("warm-start-plan", plan)])
        self.warm = list(plan["elites"])
        rows = self.library.transaction(lambda con: records.skills(con, self.domain))
        self.skills = {r["skill_id"]: skill_from_row(r) for r in rows if r["skill_id"] in set(plan["skills"])}
        return plan

    def _variants(self) -> VariantMemory | None:
        """The domain's prompt variants (for runs with LLM sources); the task's own wording is the first."""
        if not self.active or self.config.mutator.llm is None:
            return None
        from workers.llm.prompts import DEFAULT_INSTRUCTION

        return VariantMemory(self.library, self.domain, self.run_id, defaults=[DEFAULT_INSTRUCTION])

    def _validated(self) -> dict[str, float | None]:
        rows = self.archive.con.execute("SELECT program_id, status, score FROM evaluations "
                                        "WHERE run_id = ? AND split = 'validation'", [self.run_id]).fetchall()
        return {pid: (score if status == Status.OK.value else None) for pid, status, score in rows}

    # --- the run loop's hooks ----------------------------------------------------------------
    def warm_candidates(self, tried: Callable[[str], bool], budget: int) -> list[Candidate]:
        """Elites of the warm start not yet tried in this run (at most `budget` of them)."""
        out = []
        while self.warm and len(out) < budget:
            elite = self.warm.pop(0)
            if not tried(elite["code"]):
                out.append(Candidate(uuid.uuid4().hex[:12], self.run_id, 0, 0, (), elite["code"], WARM, time.time()))
                self.warm_source[out[-1].program_id] = elite
        return out

    def skills_for(self, parent_code: str) -> tuple:
        """The skills sent with a mutation request for this parent, best first."""
        if not self.skills:
            return ()
        return tuple(rank_skills(self.skills.values(), parent_code, self.entry_point, self.memory.skills_per_request))

    def variant(self) -> PromptVariant | None:
        """The prompt variant for the next LLM request (Thompson sampling), or None without the library."""
        return self.variants.choose(self.rng) if self.variants is not None else None

    def rewrite_variant(self, ask: Callable[[str], str], model: str = "llm") -> list[tuple[str, dict]]:
        """With chance `memory.variant_rewrite_chance`, a new prompt variant from `ask` (prompt text to
        reply text, one LLM call) joins the library's population; its event, if one did."""
        if self.variants is None:
            return []
        try:
            made = self.variants.maybe_rewrite(ask, self.rng, self.memory.variant_rewrite_chance, model)
        except LibraryError as exc:
            return [("prompt-variant-rewrite-failed", {"error": str(exc)})]
        return [("prompt-variant-rewritten", {"variant_id": made.variant_id, "parent_id": made.parent_id,
                                              "text": made.text})] if made else []

    def on_proposal(self, program_id: str, request, skill_id: str = "", variant: str = "") -> None:
        """A child asked for with `request` (a MutationRequest) is on its way to be evaluated; it
        replays `skill_id`, or an LLM was asked for it with prompt `variant`, if any. Its parent's code
        is kept until its result, for skill learning (the run keeps no code outside its islands)."""
        if not self.active:
            return
        if skill_id:
            self.skill_of[program_id] = (skill_id, request.parent_id)
        if variant:
            self.variant_of[program_id] = variant
        if self.memory.learn_skills:
            self.parent_code[program_id] = request.parent_code

    def forget(self, program_id: str) -> None:
        """A proposal that will never be evaluated (an LLM call that gave no child)."""
        self.skill_of.pop(program_id, None)
        self.parent_code.pop(program_id, None)
        self.variant_of.pop(program_id, None)

    def on_search_result(self, candidate: Candidate, result: EvalResult, parent_code: str | None,
                         parent_score: float | None) -> list[tuple[str, dict]]:
        """Events for this result: a warm start's elite, a skill's use; queues a skill check.
        `parent_code` None: the code kept by `on_proposal`."""
        if not self.active:
            return []
        kept = self.parent_code.pop(candidate.program_id, None)
        parent_code = kept if parent_code is None else parent_code
        if candidate.mutator == WARM:
            return [self._warm_event(candidate, result)]
        events = []
        skill_id, parent_id = self.skill_of.pop(candidate.program_id, ("", ""))
        if skill_id:
            events.append(("skill-use", self._use(candidate, result, skill_id, parent_id, parent_score)))
        variant = self.variant_of.pop(candidate.program_id, "")
        if variant:
            events.append(("prompt-variant-use", self._variant_use(candidate, result, variant, parent_score)))
        if self.memory.learn_skills and parent_code is not None and candidate.parent_ids:
            self.learner.consider(candidate, result, candidate.parent_ids[0], parent_code, parent_score)
        return events

    def validation_jobs(self, done: int) -> list[Candidate]:
        return self.learner.jobs(done) if self.active and self.memory.learn_skills else []

    def on_validation(self, result: EvalResult) -> list[tuple[str, dict]]:
        skill = self.learner.on_result(result)
        if skill is None:
            return []
        self.pending["skills"].append(skill)
        if self.memory.warm_start and skill["skill_id"] not in self.skills:
            self.skills[skill["skill_id"]] = skill_from_row(skill)
        return [("skill-learned", skill)]

    def _warm_event(self, candidate: Candidate, result: EvalResult) -> tuple[str, dict]:
        elite = self.warm_source.pop(candidate.program_id, {})
        return ("warm-start", {"program_id": candidate.program_id, "source_run": elite.get("run_id"),
                               "source_program_id": elite.get("program_id"),
                               "source_search_score": elite.get("search_score"),
                               "status": result.status.value, "search_score": result.score})

    def _use(self, candidate, result, skill_id, parent_id, parent_score) -> dict:
        ok = result.status == Status.OK and result.score is not None
        success = _beat(result, parent_score)
        use = {"run_id": self.run_id, "program_id": candidate.program_id, "skill_id": skill_id,
               "parent_id": parent_id, "status": result.status.value, "success": success,
               "gain": result.score - parent_score if ok and parent_score is not None else None}
        if skill_id in self.skills:
            self.skills[skill_id] = self.skills[skill_id].counted(success)
        self.pending["uses"].append(use)
        return use

    def _variant_use(self, candidate, result, variant_id, parent_score) -> dict:
        success = _beat(result, parent_score)
        self.variants.record(candidate.program_id, variant_id, success)
        return {"run_id": self.run_id, "program_id": candidate.program_id, "variant_id": variant_id,
                "success": success}

    # --- writing to the library --------------------------------------------------------------
    def catalog_row(self, status: str, done: int, best: float | None) -> dict:
        return {"run_id": self.run_id, "run_dir": self.run_dir, "domain": self.domain,
                "fingerprint": self.fingerprint, "config": self.config.model_dump(mode="json"),
                "status": status, "evaluations": done, "best_search_score": best,
                "warm_start": _summary(self.plan) if self.plan else None}

    def flush(self, done: int, best: float | None, status: str = "running", force: bool = False) -> None:
        """Send the catalog row and what was learned and used since the last flush (at most every
        `flush_every_s` unless forced); a busy or broken library keeps them for the next one."""
        if not self.active or (not force and time.monotonic() - self.last_flush < self.memory.flush_every_s):
            return
        self.last_flush = time.monotonic()
        skills, uses, row = list(self.pending["skills"]), list(self.pending["uses"]), self.catalog_row(status, done, best)
        variant_uses = list(self.variants.pending) if self.variants is not None else []

        def write(con):
            if self.known_at is None:  # this driver's first write: where the library knew the run until now
                self.known_at = records.run_dir_of(con, self.run_id) or ""
            records.upsert_run(con, row)
            records.add_skills(con, skills)
            records.add_skill_uses(con, uses)
            records.add_variant_uses(con, variant_uses)
        try:  # the search waits meanwhile: a busy library is tried again at a later commit point
            self.library.transaction(write, None if force else min(self.memory.busy_timeout_s, _FLUSH_PATIENCE_S))
        except LibraryError as exc:
            self._write_failed(exc)
            return
        if self.unwritable:
            self.notices.append(f"atoll: the library is written again ({self.library.path})")
        self.flush_error, self.unwritable = "", False
        del self.pending["skills"][:len(skills)], self.pending["uses"][:len(uses)]
        if self.variants is not None:
            del self.variants.pending[:len(variant_uses)]
        self._back_up_when_due()

    def _write_failed(self, exc: LibraryError) -> None:
        """A write during the run that failed: kept for the next one. A library that cannot be written
        (a full disk, a damaged file, no permission) is said once, as it happens, not first at the run's
        end; a busy one (another run writing) is not: it is the library's ordinary state."""
        self.flush_error = str(exc)
        if isinstance(exc, LibraryBusy) or self.unwritable:
            return
        self.unwritable = True
        self.notices.append(f"atoll: the library cannot be written ({exc}); the run goes on, its archive keeps "
                            "everything, and what it learned is sent at a later write")

    def _back_up_when_due(self) -> None:
        """Copy the library to its backup once that is `memory.backup_every_s` old, at a write during the
        run: a run that goes on for weeks keeps the library's backup fresh, not only runs that end. A busy
        library is tried at a later write; a failure is said once (until a backup is made again) and tried
        again a few minutes later, and the run goes on."""
        every = self.memory.backup_every_s
        if not every or time.monotonic() < self.backup_retry_at:
            return
        try:
            made = self.library.back_up(every, _FLUSH_PATIENCE_S)
        except LibraryBusy:
            return
        except (LibraryError, OSError) as exc:
            self.backup_retry_at = time.monotonic() + min(every, _BACKUP_RETRY_S)
            if not self.backup_failed:
                self.notices.append(f"atoll: the library's backup was not made ({self._backup_failure(exc)}); "
                                    "the run goes on, and its backup is tried again in a few minutes")
            self.backup_failed = True
            return
        if made and self.backup_failed:
            self.notices.append(f"atoll: the library's backup is made again ({self.library.backup_path})")
            self.backup_failed = False
        if made:
            self._copy_away()
        elif self.away is not None:
            self.away.finished(self.notices)  # what a copy that ended said

    def _copy_away(self) -> None:
        """Begin copying the library's backup to controller.backup_dir, in a thread of its own (a copy
        there at least as new is left as it is)."""
        if self.away is not None and self.library.backup_path.is_file():
            self.away.begin(self.library.backup_path, self.memory.backup_every_s, 0, self.notices)

    def _backup_failure(self, exc: Exception) -> str:
        if isinstance(exc, OSError):
            return f"{self.library.backup_path}: {exc.strerror or exc}"
        return str(exc)

    def finish(self, status: str, done: int, best: float | None) -> str:
        """The run's whole contribution, re-sent from its archive: catalog, elites, skills, uses.
        Returns one line for the user."""
        if not self.active:
            return ""
        elites, learned, uses = self._contribution()
        variant_uses = self._events("prompt-variant-use")
        row = self.catalog_row(status, done, best)

        def write(con):
            records.upsert_run(con, row)
            records.replace_elites(con, self.run_id, elites)
            records.add_skills(con, learned)
            records.add_skill_uses(con, uses)
            records.add_variant_uses(con, variant_uses)
        try:
            self.library.transaction(write)
        except LibraryError as exc:
            return (f"library not updated ({exc}); the run's archive keeps everything, and "
                    f"`atoll resume {self.run_dir}` sends it again")
        line = (f"library {self.library.path}: {len(elites)} elites kept, {len(learned)} skills learned, "
                f"{len(uses)} skill uses")
        try:  # at most every memory.backup_every_s, whichever run ends or writes (store.library: back_up)
            if self.memory.backup_every_s:
                self.library.back_up(self.memory.backup_every_s)
        except (LibraryError, OSError) as exc:
            line += f"; its backup was not made ({self._backup_failure(exc)})"
        return line + self._away_at_end()

    def _away_at_end(self) -> str:
        """At the run's end: the library's backup copied off this machine, waited for a little; what the
        finish line adds."""
        if self.away is None:
            return ""
        self._copy_away()
        copied = self.away.close([])  # (a failure is said in the finish line)
        data = copied[-1][1] if copied else {}
        if "away" in data:
            return f"; its backup copied to {data['away']}"
        if "away_error" in data:
            return f"; its backup's copy in controller.backup_dir failed ({data['away_error']})"
        return ""

    def _contribution(self) -> tuple[list[dict], list[dict], list[dict]]:
        con = self.archive.con
        rows = con.execute(
            "SELECT p.program_id, e.score, p.code, p.code_hash FROM programs p JOIN evaluations e "
            "ON e.program_id = p.program_id AND e.split = 'search' WHERE p.run_id = ? AND e.status = 'OK' "
            "AND p.mutator NOT LIKE 'baseline:%' QUALIFY row_number() OVER (PARTITION BY p.code_hash "
            "ORDER BY e.score DESC, p.seq) = 1 ORDER BY e.score DESC, length(p.code), p.seq LIMIT ?",
            [self.run_id, self.memory.elites_per_run]).fetchall()
        elites = [{"program_id": pid, "search_score": score, "code": code, "code_hash": h,
                   "domain": self.domain, "fingerprint": self.fingerprint} for pid, score, code, h in rows]
        return elites, self._events("skill-learned"), self._events("skill-use")

    def _events(self, kind: str) -> list[dict]:
        """The data of this run's events of `kind`, oldest first."""
        return [json.loads(d) for (d,) in self.archive.con.execute(
            "SELECT data FROM events WHERE run_id = ? AND kind = ? ORDER BY ts", [self.run_id, kind]).fetchall()]


def _beat(result: EvalResult, parent_score: float | None) -> bool:
    """OK, and above the parent's search score (any OK score when the parent's is unknown)."""
    ok = result.status == Status.OK and result.score is not None
    return ok and (parent_score is None or result.score > parent_score)


def _summary(plan: dict) -> dict:
    """What a warm start took, for the catalog (the elites' code stays in the run's archive)."""
    return {"runs": plan["runs"], "skills": plan["skills"],
            "elites": [{k: e[k] for k in ("run_id", "program_id", "search_score")} for e in plan["elites"]]}


def library_note(archive, run_id: str) -> str:
    """One line for the held-out table: what the library's choices for this run were selected on."""
    con = archive.con
    validations = con.execute("SELECT count(*) FROM evaluations WHERE run_id = ? AND split = 'validation'",
                              [run_id]).fetchall()[0][0]
    kinds = dict(con.execute("SELECT kind, count(*) FROM events WHERE run_id = ? AND kind IN "
                             "('skill-learned', 'skill-use', 'warm-start') GROUP BY kind", [run_id]).fetchall())
    plan = stored_plan(archive, run_id)
    parts = []
    if plan:
        source = plan["runs"] if isinstance(plan["runs"], str) else ", ".join(plan["runs"])
        parts.append(f"warm-started from {source} ({len(plan['elites'])} elites chosen by search score, "
                     f"{len(plan['skills'])} skills), replayed skills {kinds.get('skill-use', 0)} times")
    parts.append(f"skills are kept only if their gain holds on the validation split ({validations} validation "
                 f"evaluations, {kinds.get('skill-learned', 0)} skills learned)")
    return "Library memory: " + "; ".join(parts) + ". The held-out split took part in no library choice."
