"""The run loop: one event loop in the driver, one `ray.wait` over all work.

The driver is the archive's only writer. It keeps a bounded number of mutation
requests and evaluations in flight, routes each result back to its island, and
commits finished results in batches, so a crash loses at most the uncommitted
second of work, never a committed evaluation. No search logic lives here: the
islands decide parents, the mutator proposes, the evaluator scores.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from collections import defaultdict

import ray
from ray.exceptions import RayActorError, RayTaskError

from controller.actors import MutatorActor, evaluator_count, new_evaluator
from controller.progress import Progress
from controller.resume import islands_snapshot, load_islands
from evaluators.params import write_params
from evaluators.registry import get_domain
from islands.population import Member
from store.records import Candidate, EvalResult, MutationRequest, Status


def new_id() -> str:
    return uuid.uuid4().hex[:12]


class Search:
    """Drives one run until its budget is spent or it is interrupted."""

    def __init__(self, config, archive, run_id: str, run_dir, hide: tuple[str, ...] = ()):
        self.config, self.archive, self.run_id, self.run_dir = config, archive, run_id, run_dir
        self.domain = get_domain(config.domain.name, **config.domain.options)
        self.pending: dict = {}
        self.results: list = []
        self.heldout: list = []
        self.events: list = []
        self.stats = defaultdict(lambda: [0, 0])
        self.stats.update({k: list(v) for k, v in archive.operator_stats(run_id).items()})
        self.known = archive.known_hashes(run_id)  # compact: 8 bytes a program
        self.done = archive.count_evaluations(run_id, "search")
        self.failures = 0
        self.parent_scores: dict[str, float | None] = {}  # in-flight candidate -> its parent's score
        self.hide = hide
        # the islands hold their members' code; nothing else keeps a program's code or score
        self.islands = load_islands(archive, run_id, config, self.done).islands
        best = self.islands.best()
        self.best_score = best.score if best else None

    # --- actors -------------------------------------------------------------
    def _start_actors(self) -> None:
        c = self.config
        n = evaluator_count(c)
        self.evaluators = [self._new_evaluator() for _ in range(n)]
        self.load = {i: 0 for i in range(n)}
        self.mutators = [MutatorActor.remote(c.domain.name, c.domain.options, c.mutator.embedded)
                         for _ in range(c.mutator.workers)]
        self._next_mutator = 0

    def _new_evaluator(self):
        return new_evaluator(self.config, self.hide)

    def _submit_eval(self, candidate: Candidate, split: str = "search") -> None:
        i = min(self.load, key=self.load.get)
        self.load[i] += 1
        ref = self.evaluators[i].evaluate.remote(candidate.program_id, candidate.code, split)
        self.pending[ref] = ("eval" if split == "search" else "heldout", candidate, i)

    def _submit_mutation(self) -> None:
        island = self.islands.pick_island()
        parent, inspirations = self.islands.next_parent(island)
        request = MutationRequest(
            run_id=self.run_id, island=island, generation=self.islands.islands[island].generation + 1,
            parent_id=parent.program_id, parent_code=parent.code,
            inspirations=tuple((m.program_id, m.code) for m in inspirations),
            operator_weights=tuple(self._operator_weights()), seed=int(self.islands.rng.integers(2**31)),
            parent_score=parent.score)
        actor = self.mutators[self._next_mutator % len(self.mutators)]
        self._next_mutator += 1
        self.pending[actor.propose.remote(request)] = ("mutate", request, None)

    def _operator_weights(self):
        prior = self.config.mutator.embedded.success_prior
        for name, (attempts, wins) in self.stats.items():
            if name.startswith("embedded:"):
                yield name.split(":", 1)[1], (wins + prior) / (attempts + 2 * prior)

    # --- the loop -----------------------------------------------------------
    def in_flight(self, kind: str | None = None) -> int:
        return sum(1 for k, *_ in self.pending.values() if kind is None or k == kind)

    def _capacity(self) -> int:
        return len(self.evaluators) * self.config.controller.in_flight_per_actor

    def _budget_left(self) -> int:
        busy = self.in_flight("eval") + self.in_flight("mutate") + len(self.results)
        return self.config.run.max_evals - self.done - busy

    def _fill(self, searching: bool) -> None:
        if not searching:
            return
        if self.done == 0 and not self.pending and not self.results:
            self._submit_eval(Candidate(new_id(), self.run_id, 0, 0, (), self.domain.seed_program, "seed", time.time()))
            return
        if self.islands.best() is None:
            return
        while self._budget_left() > 0 and self.in_flight("eval") + self.in_flight("mutate") < self._capacity():
            self._submit_mutation()

    def run(self) -> str:
        """Search until the budget is spent; returns the run's final status."""
        self._start_actors()
        start = time.monotonic()
        progress = Progress(self, self.config.run.max_evals, self.config.run.max_wall_s)
        last_commit = last_publish = time.monotonic()
        drain_until = None
        status = "completed"
        try:
            with progress:
                while True:
                    now = time.monotonic()
                    searching = now - start < self.config.run.max_wall_s
                    if not searching and drain_until is None:
                        # out of wall time: submit nothing more, let what runs finish and commit
                        drain_until = now + self.config.evaluator.sandbox.wall_s + 5
                        status = "wall-time" if self._budget_left() > 0 else status
                    self._fill(searching)
                    if not self.pending:
                        break
                    ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=0.5)
                    for ref in ready:
                        self._handle(ref, *self.pending.pop(ref))
                    if drain_until is not None and time.monotonic() > drain_until:
                        self._cancel_all()
                    now = time.monotonic()
                    if now - last_commit >= self.config.controller.commit_every_s:
                        self.commit()
                        last_commit = now
                    if now - last_publish >= self.config.controller.snapshot_every_s:
                        self.publish()
                        last_publish = now
                    progress.update(time.monotonic() - start)
        except KeyboardInterrupt:
            status = "interrupted"
            self._cancel_all()
        finally:
            self.publish()
        return "seed-failed" if self.seed_error else status

    seed_error = ""

    def _cancel_all(self) -> None:
        """Drop in-flight work; it was never committed, so a resume redoes it."""
        for ref in list(self.pending):
            try:
                ray.cancel(ref)  # actor tasks cannot be force-cancelled; a queued one is dropped
            except Exception:  # noqa: BLE001  cancelling is best effort, the results are discarded
                pass
        self.pending.clear()

    # --- results ------------------------------------------------------------
    def _handle(self, ref, kind: str, payload, actor: int | None) -> None:
        if actor is not None:
            self.load[actor] -= 1
        try:
            value = ray.get(ref)
        except RayActorError:
            self.events.append(("actor-lost", {"actor": actor, "program_id": payload.program_id}))
            self.evaluators[actor] = self._new_evaluator()
            self._submit_eval(payload, "search" if kind == "eval" else "heldout")
            return
        except RayTaskError as exc:
            self.events.append(("internal-error", {"kind": kind, "error": str(exc)[-2000:]}))
            if kind == "mutate":
                return
            value = EvalResult(payload.program_id, "search" if kind == "eval" else "heldout",
                               Status.FAILED, error=f"internal evaluator error: {str(exc)[-500:]}")
        getattr(self, f"_on_{kind}")(payload, value)

    def _on_mutate(self, request: MutationRequest, proposal) -> None:
        if isinstance(proposal, str):
            self.events.append(("mutation-failed", {"island": request.island, "reason": proposal}))
            return
        candidate = Candidate(new_id(), self.run_id, request.island, request.generation, (request.parent_id,),
                              proposal.code, proposal.operator, time.time())
        if candidate.code_hash in self.known:  # hashed once: the archive's write reuses it
            self.events.append(("duplicate", {"island": request.island, "operator": proposal.operator}))
            return
        self.known.add(candidate.code_hash)
        self.parent_scores[candidate.program_id] = request.parent_score
        self._submit_eval(candidate)

    def _on_eval(self, candidate: Candidate, result: EvalResult) -> None:
        if result.status == Status.OK and result.tuned_params:
            proposed = candidate.code_hash  # kept, so a resume still knows this text was tried
            candidate = dataclasses.replace(candidate, code=write_params(candidate.code, result.tuned_params))
            result = dataclasses.replace(result, metrics={**result.metrics, "proposed_hash": proposed})
            self.known.add(candidate.code_hash)
        self.results.append((candidate, result))
        self._count_operator(candidate, result)
        if candidate.mutator == "seed":
            self._on_seed(candidate, result)
            return
        if result.status == Status.OK:
            self._add_member(candidate.island, candidate, result)
        else:
            self.failures += 1
        for event in self.islands.on_generation(candidate.island):
            self.events.append(("islands", {"island": candidate.island, "what": event}))

    def _on_seed(self, candidate: Candidate, result: EvalResult) -> None:
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
        if self.best_score is None or result.score > self.best_score:
            self.best_score = result.score
            self.events.append(("new-best", {"program_id": candidate.program_id, "score": result.score}))
            if self.config.controller.heldout_on_new_best:
                self._submit_eval(candidate, "heldout")

    def _count_operator(self, candidate: Candidate, result: EvalResult) -> None:
        if candidate.mutator == "seed":
            return
        stat = self.stats[candidate.mutator]
        stat[0] += 1
        parent = self.parent_scores.pop(candidate.program_id, None)
        stat[1] += int(result.status == Status.OK and (parent is None or result.score > parent))

    def _on_heldout(self, candidate: Candidate, result: EvalResult) -> None:
        self.heldout.append(result)

    # --- persistence --------------------------------------------------------
    def commit(self) -> None:
        """One transaction: programs, lineage, evaluations, held-out scores, events."""
        # held-out scores are of programs committed earlier or in this same batch
        self.archive.write(self.run_id, pairs=self.results, evaluations=self.heldout, events=self.events)
        self.done += sum(1 for _, r in self.results if r.split == "search")
        self.results, self.heldout, self.events = [], [], []

    def publish(self) -> None:
        """Commit, then snapshot the islands, so a resume replays only what follows."""
        self.commit()
        self.archive.save_snapshot(self.run_id, islands_snapshot(self.islands, self.archive.last_seq()))
