"""The search's evaluators on a cluster: one slot per actor, used once its actor is placed and ready.

An evaluator actor asks for one CPU and is spread over the nodes (`controller.actors`).
A new actor gets no work until it answers a probe with the node it landed on: an actor
that Ray cannot place yet (its node was lost and no other has a free CPU) holds no
evaluation hostage, and one that lands on a node that joins later starts working then.
Work with no ready evaluator to go to waits in a backlog, counted as in flight.

Every `cluster.scale_every_s` the driver reads the cluster's CPUs; with
`evaluator.actors = 0` (one per CPU) it starts an evaluator for each CPU that joined.
A lost node's actors are lost actors like any other: `controller.faults` decides
what becomes of their jobs and the slot gets a fresh actor, which Ray places where
there is room, now or when a node joins.

`EvaluatorPool` is mixed into `controller.loop.Search`; it keeps the slots, the loop
keeps the jobs.
"""
from __future__ import annotations

import time
from collections import Counter

import ray
from ray.exceptions import RayError

from controller import faults
from controller.actors import where
from controller.cli import UserError
from controller.submit import resume_command


def _probe(_evaluator) -> tuple[str, str]:
    """Run on the actor once its constructor returned: (node id, node IP)."""
    return where()


# The pending kind of an evaluation of each split (the loop's jobs in flight are counted by kind).
KIND = {"search": "eval", "heldout": "heldout", "validation": "validate"}
SPLIT = {kind: split for split, kind in KIND.items()}  # and the split of each such kind


class Pending(dict):
    """The loop's jobs in flight (ref -> (kind, payload, actor)), counted per kind as they come and go.

    The loop asks how many jobs of a kind are in flight several times per candidate; a count
    kept up to date answers in O(1) where a scan costs O(jobs) (benchmarks/cluster_scale.py).
    """

    def __init__(self):
        super().__init__()
        self.kinds: Counter = Counter()
        self.sent: dict = {}  # ref -> when it was sent (time.time()): was its actor already dead then?

    def __setitem__(self, ref, job) -> None:
        if ref in self:
            self.kinds[self[ref][0]] -= 1
        else:
            self.sent[ref] = time.time()
        super().__setitem__(ref, job)
        self.kinds[job[0]] += 1

    def __delitem__(self, ref) -> None:
        self.kinds[self[ref][0]] -= 1
        self.sent.pop(ref, None)
        super().__delitem__(ref)

    def pop(self, ref, *default):
        if ref in self:
            self.kinds[self[ref][0]] -= 1
            self.sent.pop(ref, None)
        return super().pop(ref, *default)

    def popitem(self):
        ref, job = super().popitem()
        self.kinds[job[0]] -= 1
        self.sent.pop(ref, None)
        return ref, job

    def clear(self) -> None:
        super().clear()
        self.kinds.clear()
        self.sent.clear()

    def count(self, kind: str | None = None) -> int:
        return len(self) if kind is None else self.kinds[kind]


class EvaluatorPool:
    """Evaluator slots (`evaluators`), the ready ones with their load (`load`) and node (`nodes`)."""

    def _start_evaluators(self, n: int) -> None:
        self.evaluators: list = []
        self.load: dict[int, int] = {}  # ready slot -> evaluations queued on it
        self.nodes: dict[int, tuple[str, str]] = {}  # ready slot -> (node id, node IP)
        self.arriving: dict = {}  # probe ref -> (slot, actor)
        self.backlog: list = []  # (candidate, split) waiting for a ready evaluator
        self.start_failures = 0
        self._next_scale = time.monotonic() + self.config.cluster.scale_every_s
        for _ in range(n):
            self._add_evaluator()

    def _add_evaluator(self, slot: int | None = None) -> None:
        """A new actor in `slot` (a new slot if None); it takes work once its probe answers."""
        actor = self._new_evaluator()
        if slot is None:
            slot = len(self.evaluators)
            self.evaluators.append(actor)
        else:
            self.evaluators[slot] = actor
        self.arriving[actor.__ray_call__.remote(_probe)] = (slot, actor)

    def _replace_evaluator(self, slot: int) -> None:
        faults.retire(self.evaluators[slot])
        self.load.pop(slot, None)
        self.nodes.pop(slot, None)
        self._add_evaluator(slot)

    def ready_evaluators(self) -> list:
        return [self.evaluators[slot] for slot in sorted(self.load)] or list(self.evaluators)

    def _backlogged(self, kind: str | None) -> int:
        return sum(1 for _, split in self.backlog if kind is None or kind == KIND[split])

    def _drain_backlog(self) -> None:
        while self.backlog and self.load:
            self._submit_eval(*self.backlog.pop(0))

    # --- the loop's wait ---------------------------------------------------------
    def _wait(self, timeout: float = 0.5) -> list:
        """The finished jobs among `pending`; meanwhile take in evaluators that became ready and scale."""
        self._maybe_scale()
        refs = [*self.pending, *self.arriving]
        if not refs:
            time.sleep(min(timeout, 0.05))
            return []
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:  # take every job that finished, not one per pass
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        arrived = [ref for ref in ready if ref in self.arriving]
        if arrived:
            self._arrived(arrived)
        return [ref for ref in ready if ref in self.pending]

    def _finished(self, searching: bool) -> bool:
        """Nothing runs, nothing waits, and no evaluator on its way could take more of the budget."""
        if self.pending or self.backlog:
            return False
        return not (searching and self.arriving and self._budget_left() > 0 and not self.seed_error)

    def _arrived(self, probes: list) -> None:
        for ref in probes:
            slot, actor = self.arriving.pop(ref)
            if self.evaluators[slot] is not actor:  # replaced meanwhile
                continue
            try:
                node = ray.get(ref)
            except RayError as exc:
                self._start_failed(slot, exc)
                continue
            self.nodes[slot], self.load[slot] = node, 0
            self.events.append(("evaluator-ready", {"slot": slot, "node_id": node[0], "node_ip": node[1]}))
        self._drain_backlog()

    def _start_failed(self, slot: int, exc: Exception) -> None:
        """An actor died before it was ready (its node was lost, or its constructor raised).

        Too many such deaths end the run in one line, with the last one's cause and where it was
        raised: most often a node that lacks what the domain needs (a package, a data file), which
        is the user's to fix, not a traceback of Atoll's."""
        self.start_failures += 1
        if self.start_failures > 3 + 2 * len(self.evaluators):
            raise UserError(f"evaluator actors keep dying before they are ready ({self.start_failures} so far; the "
                            f"last: {faults.task_error(exc)}): every node that runs evaluators needs what the domain "
                            f"needs (its packages, its files); once they have it, continue with: "
                            f"{resume_command(self.run_dir)}")
        self._replace_evaluator(slot)

    def _maybe_scale(self) -> None:
        """With one evaluator per CPU, start one for each CPU that joined the cluster."""
        now = time.monotonic()
        if now < self._next_scale:
            return
        self._next_scale = now + self.config.cluster.scale_every_s
        if self.config.evaluator.actors:
            return
        cpus = int(ray.cluster_resources().get("CPU", 0))
        for _ in range(min(cpus, 512) - len(self.evaluators)):
            self._add_evaluator()
