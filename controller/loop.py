"""The run loop: one event loop in the driver, one `ray.wait` over all work.

The driver is the archive's only writer. It keeps a bounded number of mutation
requests and evaluations in flight, routes each result back to its island, and
commits finished results in batches, so a crash loses at most the uncommitted
second of work, never a committed evaluation. No search logic lives here: the
islands decide parents, the mutator proposes, the evaluator scores.
"""
from __future__ import annotations

import os
import socket
import time
from collections import defaultdict

import ray
from ray.exceptions import RayActorError, RayTaskError

from controller import faults
from controller.actors import evaluator_count, new_evaluator, new_mutator
from controller.backup import Away, Backups
from controller.cluster import KIND, SPLIT, EvaluatorPool, Pending
from controller.dedup import Dedup
from controller.helm import Helm
from controller.memory import RunMemory
from controller.outcomes import Outcomes, Unmade, new_id
from controller.progress import Progress
from controller.proposals import Proposals
from controller.recovery import LostActors
from controller.resume import islands_snapshot, load_islands
from evaluators.racing import RaceSpec
from evaluators.registry import get_domain
from store import signals
from store.records import Candidate, EvalResult, MutationRequest, Status


class Search(EvaluatorPool, Outcomes, LostActors):
    """Drives one run until its budget is spent or it is interrupted."""

    def __init__(self, config, archive, run_id: str, run_dir, hide: tuple[str, ...] = (), *, secrets,
                 memory: RunMemory | None = None):
        self.config, self.archive, self.run_id, self.run_dir = config, archive, run_id, run_dir
        self.secrets = secrets  # the run's, from its archive: every evaluator gets the same
        self.domain = get_domain(config.domain, secrets=secrets)
        self.memory = memory or RunMemory(config, archive, run_id, run_dir, self.domain.entry_point)
        self.pending = Pending()  # ref -> (kind, payload, actor index)
        self.results: list = []
        self.heldout: list = []
        self.events: list = []
        self.stats = defaultdict(lambda: [0, 0])
        self.stats.update({k: list(v) for k, v in archive.operator_stats(run_id).items()})
        self.known = archive.known_hashes(run_id)  # compact: 8 bytes a program
        self.done = archive.count_evaluations(run_id, "search")
        self.failures = 0
        # search evaluations stopped early by racing, the run's (as `atoll status` counts them, beside
        # the run's evaluations in the progress line), this segment's added as they come
        self.raced = archive.con.execute("SELECT count(*) FROM programs WHERE run_id = ? AND search_status = ? "
                                         "AND mutator NOT LIKE 'baseline:%'", [run_id, Status.RACED.value]).fetchone()[0]
        self.unmade = Unmade()  # the embedded mutator's requests that made no child (controller.outcomes)
        self.parent_scores: dict[str, float | None] = {}  # in-flight candidate -> its parent's score
        self.hide = hide
        self.deaths = faults.Deaths(config.controller.actor_death_retries)
        self.disk_full = False
        # the islands hold their members' code; nothing else keeps a program's code or score
        self.islands = load_islands(archive, run_id, config, self.done).islands
        self.seed_error = stored_seed_error(archive, run_id)
        self.dedup = Dedup(self.known, archive.form_hashes(run_id), self.domain.tunes_params())
        self.proposals = Proposals(config, archive, run_id, self.domain, self.dedup)
        self.notices = self.proposals.notices  # what the run says on stderr, in order (controller.progress)
        if self.islands.dropped:  # a run saved with more niches than islands.max_niches now allows
            self.notices.append(
                f"atoll: islands.max_niches = {config.islands.max_niches}: the resumed islands keep their best "
                f"{config.islands.max_niches} niches each ({self.islands.dropped} dropped); to keep more, "
                "resume with --set islands.max_niches=N")
        best = self.islands.best()
        self.best_score = best.score if best else None
        self.helm = Helm(archive, run_id)  # pause, resume, stop, budgets, status: the control plane's commands
        self._snapshot_done: int | None = None  # search results committed at the last snapshot (None: none yet)

    # --- actors -------------------------------------------------------------
    def _start_actors(self) -> None:
        c = self.config
        self._start_evaluators(evaluator_count(c))  # controller.cluster: slots, readiness, nodes
        self.mutators: list = []  # started at first use (`_send_mutation`)
        self._next_mutator = 0
        self.proposals.start()

    def _new_evaluator(self):
        return new_evaluator(self.config, self.hide, secrets=self.secrets)

    def _new_mutator(self):
        return new_mutator(self.config)

    def _submit_eval(self, candidate: Candidate, split: str = "search") -> None:
        if not self.load:  # no evaluator is ready yet: it waits for one (controller.cluster)
            self.backlog.append((candidate, split))
            return
        i = min(self.load, key=self.load.get)
        self.load[i] += 1
        race = self._race_spec(candidate) if split == "search" else None
        ref = self.evaluators[i].evaluate.remote(candidate.program_id, candidate.code, split, race)
        self.pending[ref] = (KIND[split], candidate, i)

    def _race_spec(self, candidate: Candidate) -> RaceSpec | None:
        """What a child races against (`evaluator.racing`): its parent's per-instance search scores
        while the parent is on the island, else the parent's score; None for the seed or when off.
        Trusted side only: the spec goes to the evaluator, never into the candidate's process."""
        config = self.config.evaluator.racing
        if not config.enabled or not candidate.parent_ids:
            return None
        parent_id = candidate.parent_ids[0]
        island = self.islands.islands[candidate.island]
        member = island.member(parent_id)
        threshold = member.score if member is not None else self._parent_score(candidate)
        scores = tuple(member.instance_scores) if member is not None else ()
        return RaceSpec(config, parent_id, scores, threshold) if scores or threshold is not None else None

    def _submit_mutation(self) -> bool:
        """One request to a source with room (embedded, or an LLM by the island's weights); False if none has."""
        embedded_room = (not self.unmade.stalled
                         and self.in_flight("eval") + self.in_flight("mutate") < self._capacity())
        evals_full = self.in_flight("eval") >= self._capacity()
        if not self.proposals.any_room(embedded_room, evals_full):
            return False
        for _ in range(len(self.islands.islands)):
            island = self.islands.pick_island()
            source = self.proposals.choose(island, embedded_room, evals_full)
            if source is not None:
                break
        else:
            return False
        parent, inspirations = self.islands.next_parent(island)
        request = MutationRequest(
            run_id=self.run_id, island=island, generation=self.islands.islands[island].generation + 1,
            parent_id=parent.program_id, parent_code=parent.code,
            inspirations=tuple((m.program_id, m.code) for m in inspirations),
            operator_weights=tuple(self._operator_weights()), seed=int(self.islands.rng.integers(2**31)),
            parent_score=parent.score, skills=self.memory.skills_for(parent.code))
        if source != "embedded":
            shown = {m.program_id: m.score for m in inspirations}
            variant = self.memory.variant()  # the prompt's instruction, from the library's population
            ref, job = self.proposals.submit(source, request, shown, {}, variant.text if variant else "")
            self.parent_scores[job.child_id] = request.parent_score
            self.memory.on_proposal(job.child_id, request, variant=variant.variant_id if variant else "")
            self.pending[ref] = ("llm", job, None)
            return True
        self._send_mutation(request)
        return True

    def _send_mutation(self, request: MutationRequest) -> None:
        if len(self.mutators) < self.config.mutator.workers:  # started at first use: a run whose islands
            self.mutators.append(self._new_mutator())  # never ask the embedded mutator starts none
        i = self._next_mutator % len(self.mutators)
        self._next_mutator += 1
        self.pending[self.mutators[i].propose.remote(request)] = ("mutate", request, i)

    def _operator_weights(self):
        prior = self.config.mutator.embedded.success_prior
        for name, (attempts, wins) in self.stats.items():
            if name.startswith("embedded:"):
                yield name.split(":", 1)[1], (wins + prior) / (attempts + 2 * prior)

    # --- the loop -----------------------------------------------------------
    def in_flight(self, kind: str | None = None) -> int:
        return self.pending.count(kind) + self._backlogged(kind)

    def _capacity(self) -> int:
        return len(self.load) * self.config.controller.in_flight_per_actor

    def _budget_left(self) -> int:
        busy = self.in_flight("eval") + self.in_flight("mutate") + self.in_flight("llm") + len(self.results)
        return self.config.run.max_evals - self.done - busy

    def _fill(self, searching: bool) -> None:
        if not searching or self.helm.paused:
            return
        if self.done == 0 and not self.pending and not self.results and not self.backlog:
            self._submit_eval(Candidate(new_id(), self.run_id, 0, 0, (), self.domain.seed_program, "seed", time.time()))
        for candidate in self.memory.warm_candidates(self.dedup.tried, self._budget_left()):
            self.dedup.add(candidate.code)
            self._submit_eval(candidate)
        if self.islands.best() is None:
            return
        if self._budget_left() > 0:
            for candidate in self.memory.validation_jobs(self.done):
                self._submit_eval(candidate, "validation")
        while self._budget_left() > 0 and self._submit_mutation():
            pass

    def run(self) -> str:
        """Search until the budget is spent; returns the run's final status.

        A full disk ends it with the error (what was committed before stands, nothing more is written).
        """
        if self.seed_error:
            return "seed-failed"
        self._start_actors()
        start = time.monotonic()
        self.helm.begin(start)
        # each session of the run in the archive: with "stopping" (what stopped it), a session that has
        # none before the next "started" ended without a word (kill -9, a lost machine)
        self.events.append(("started", {"pid": os.getpid(), "host": socket.gethostname(),
                                        "search_evaluations": self.done}))
        progress = self.progress = Progress(self, self.config.run.max_evals, self.config.run.max_wall_s)
        cadence = Cadence(self.config.controller.commit_every_s, self.config.controller.snapshot_every_s,
                          time.monotonic())
        away = None
        if self.config.controller.backup_dir:
            away = Away(self.config.controller.backup_dir, self.run_id, self.archive.get_run(self.run_id)["started_at"],
                        (socket.gethostname(), os.getpid()), time.time())
        first, = self.archive.con.execute("SELECT min(ts) FROM events WHERE run_id = ? AND kind = 'started'",
                                          [self.run_id]).fetchone()  # the run's first session (None: this one)
        backups = Backups(self.config.controller.backup_every_s, self.archive, self.run_dir, self.notices,
                          time.monotonic(), away, since=first)
        drain_until = None
        status = "completed"
        try:
            with signals.ctrl_c_as_such(), progress:
                while True:
                    now = time.monotonic()
                    self.helm.tick(self, now)  # control-plane commands; a stop raises KeyboardInterrupt
                    searching = self.helm.searched_s(now) < self.config.run.max_wall_s
                    if searching and drain_until is not None:  # `atoll set run.max_wall_s` gave more time
                        drain_until = None  # (else in-flight work was dropped every tick)
                    if not searching and drain_until is None:
                        # out of wall time: submit nothing more, let what runs finish and commit
                        drain_until = now + self.config.evaluator.sandbox.wall_s + 5
                        # said on stderr, and archived for `atoll watch` and queries (jobs waiting for
                        # an evaluator still starting count: they run once it is up)
                        in_flight, within = self.in_flight(), round(drain_until - now)
                        if in_flight:
                            self.events.append(("wall-time-reached", {"in_flight": in_flight,
                                                                      "finish_within_s": within}))
                            self.notices.append(
                                f"atoll: run.max_wall_s ({self.config.run.max_wall_s:g} s) is spent: nothing new is "
                                f"started; the {in_flight} job(s) in flight finish within {within} s and are "
                                "committed (Ctrl-C stops now, keeping what finished).")
                    self._fill(searching)
                    waiting = self.helm.paused or (searching and self.proposals.resting())
                    if self._finished(searching) and not (waiting and self._budget_left() > 0):
                        break  # a paused run (or one whose models rest after failing) stays alive in _wait
                    for ref in self._wait():  # also takes in evaluators that became ready (controller.cluster)
                        if ref in self.pending:  # a lost actor's other jobs left with it
                            self._handle(ref, *self.pending[ref])
                    if drain_until is not None and time.monotonic() > drain_until:
                        self._end_drain()
                    due = cadence.due(time.monotonic())
                    if due:
                        self.events += backups.copied()  # copies in controller.backup_dir that ended
                    if due == "publish":
                        self.publish()
                        if backups.due(time.monotonic()):  # right after a commit: the copy holds it
                            self.events.append(backups.make(self.done))
                    elif due == "commit":
                        self.commit()
                    progress.update(self.helm.searched_s(time.monotonic()))
            if drain_until is not None and self._budget_left() > 0:
                status = "wall-time"  # stopped short of run.max_evals by the wall time, whatever was in flight then
            if searching and not self.seed_error:  # budget spent: now and then a prompt variant for later runs
                self.events += self.memory.rewrite_variant(self.proposals.ask_text, self.proposals.first_model())
        except KeyboardInterrupt:
            signals.stopping()  # a second Ctrl-C must not break off the last commit
            status = "interrupted"
            if not self.helm.stopping:  # `atoll stop` archived its own
                by = signals.STOPPED_BY[0] if signals.STOPPED_BY else "Ctrl-C (SIGINT)"
                self.events.append(("stopping", {"by": by, "in_flight": self.in_flight()}))
            self._cancel_all()
        except Exception as exc:
            self.disk_full = faults.disk_full(exc, self.run_dir)
            self._cancel_all()
            raise
        finally:
            self.events += backups.close()
            progress.say_notices()  # what the copy's end said
            if not self.disk_full:
                self.publish()
        if self.seed_error:
            return "seed-failed"
        status = self.proposals.final_status(status, self._budget_left())
        # nothing left to ask: the embedded mutator stalled (controller.outcomes) and no LLM took over
        return "stalled" if status == "completed" and self.unmade.stalled and self._budget_left() > 0 else status

    def _end_drain(self) -> None:
        """The wait after `run.max_wall_s` is over: drop the jobs still running and say so (a job that outlasted
        it was dropped without a word, after a line that said the jobs in flight would be committed)."""
        dropped = self.in_flight()
        self._cancel_all()
        left = self._budget_left()
        if dropped:
            self.events.append(("wall-time-dropped", {"in_flight": dropped, "evaluations_left": left}))
            rest = f"; atoll resume {self.run_dir} evaluates the {left} evaluation(s) left" if left > 0 else ""
            self.notices.append(f"atoll: the {dropped} job(s) still running when the wait after run.max_wall_s "
                                f"ended were dropped, uncommitted{rest}.")

    def _cancel_all(self) -> None:
        """Drop in-flight work; it was never committed, so a resume redoes it."""
        for ref in list(self.pending):
            try:
                ray.cancel(ref)  # actor tasks cannot be force-cancelled; a queued one is dropped
            except Exception:  # noqa: BLE001  cancelling is best effort, the results are discarded
                pass
        self.pending.clear()
        self.backlog.clear()

    # --- results ------------------------------------------------------------
    def _handle(self, ref, kind: str, payload, actor: int | None) -> None:
        if kind in ("llm", "mutate"):
            self.helm.proposals += 1
        if kind == "llm":
            del self.pending[ref]
            return self._on_llm(ref, payload)
        try:
            value = self._value(ref, kind, payload)
        except RayActorError as exc:
            self._actor_lost(kind, actor, exc)
            return
        del self.pending[ref]
        if kind != "mutate":
            self.load[actor] -= 1
        self._deliver(kind, payload, value)

    def _value(self, ref, kind: str, payload):
        """The job's result; our own code raising becomes a FAILED result (None for a mutation)."""
        try:
            return ray.get(ref)
        except RayTaskError as exc:
            self.events.append(("internal-error", {"kind": kind, "error": str(exc)[-2000:]}))
            if kind == "mutate":
                return None
            return EvalResult(payload.program_id, SPLIT[kind], Status.FAILED,
                              error=f"internal evaluator error: {faults.task_error(exc)}")

    def _deliver(self, kind: str, payload, value) -> None:
        if value is not None:
            getattr(self, f"_on_{kind}")(payload, value)

    # --- persistence --------------------------------------------------------
    def commit(self, snapshot=None) -> None:
        """One transaction: programs, lineage, evaluations, held-out and validation scores, events,
        the finished LLM calls (and `snapshot`, see `publish`); then the library (what was learned
        and used since its last flush)."""
        # held-out scores are of programs committed earlier or in this same batch
        with signals.held():  # a Ctrl-C now would commit the batch and keep it as uncommitted too
            self.archive.write(self.run_id, pairs=self.results, evaluations=self.heldout, events=self.events,
                               snapshot=snapshot, also=self.proposals.calls_to_write())
            self.proposals.written()
            self.helm.on_commit(self)  # to the control plane's watchers, once committed
            self.done += sum(1 for _, r in self.results if r.split == "search")
            self.results, self.heldout, self.events = [], [], []
            self.memory.flush(self.done, self.best_score)

    def publish(self) -> None:
        """Commit with a snapshot of the islands in the same transaction, so a resume replays only what follows.

        Only the search's results change what a resume needs of the islands, so with none committed
        since the last snapshot (evaluations that take minutes, a paused run) the snapshot is not
        written again: a week of a slow search rewrote the same islands every few seconds.
        """
        if self.done == self._snapshot_done and not any(r.split == "search" for _, r in self.results):
            return self.commit()
        self.commit(snapshot=lambda last_seq: islands_snapshot(self.islands, last_seq))
        self._snapshot_done = self.done  # commit() counted this batch's search results into it


class Cadence:
    """When the loop commits, and which of its commits carry the islands' snapshot.

    A commit is due `commit_every` seconds after the last one; the first due once `snapshot_every`
    seconds have passed since the last snapshot carries it. One transaction a commit: a snapshot
    made in a transaction of its own between two commits cost a third more transactions (each a
    handful of DuckDB statements of about a millisecond, whatever they write).
    """

    def __init__(self, commit_every: float, snapshot_every: float, now: float):
        self.commit_every, self.snapshot_every = commit_every, snapshot_every
        self.last_commit = self.last_snapshot = now

    def due(self, now: float) -> str | None:
        """"publish" (a commit with the snapshot), "commit", or None; what is returned is taken as done."""
        if now - self.last_commit < self.commit_every:
            return None
        self.last_commit = now
        if now - self.last_snapshot < self.snapshot_every:
            return "commit"
        self.last_snapshot = now
        return "publish"


def stored_seed_error(archive, run_id: str) -> str:
    """Why the run's committed seed program failed ('' if it did not, or is not committed yet)."""
    row = archive.con.execute(
        "SELECT e.status, e.error FROM programs p JOIN evaluations e ON e.program_id = p.program_id "
        "AND e.split = 'search' WHERE p.run_id = ? AND p.mutator = 'seed' LIMIT 1", [run_id]).fetchall()
    if row and row[0][0] != Status.OK.value:
        return f"{row[0][0]}: {row[0][1]}"
    return ""
