"""Surviving lost actors and a full disk: the one place that decides what becomes of the work.

Lost actors. Ray runs one caller's tasks on an actor one at a time, in the order
they were submitted, so when an actor dies, the oldest of its unfinished jobs is
the one it was running. Only that job is charged with the death; the jobs queued
behind it never started and are requeued as they were, and jobs that finished
before the death keep their results. Nor is a job sent once Ray had the actor as dead
(one that died idle, as with its node) charged: it never ran there. A job charged more than `retries` times is
given up: an evaluation is stored FAILED with the reason, a mutation request is
dropped. The search loop and the held-out report both decide through `Deaths`.

Ray's own task retries cannot tell the running job from the queued ones (every
task in flight on a dead actor spends a retry), so evaluators are not restarted by
Ray and the driver replaces them. Mutators are pure functions of their request:
Ray restarts them and retries their requests itself (`controller.actors`), and the
driver steps in only when Ray gives up (`ray.kill`, or a request that keeps
killing its mutator).

A full disk. A commit that finds no space stops the run: nothing more can be
written, and what was committed before stays readable (DuckDB replays its
write-ahead log on the next open).

A second Ctrl-C: `store.signals.stopping`.
"""
from __future__ import annotations

import errno
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.exceptions import RayActorError, RayError

_FULL = ("No space left on device", "Disk quota exceeded")
_SETTLE_S = 10.0


class Deaths:
    """How many actor deaths each job was charged with, and whether it may run again."""

    def __init__(self, retries: int):
        self.retries = retries
        self._count: Counter = Counter()

    def charge(self, key) -> bool:
        """Charge `key`'s job with one death of its actor; True while it may run again."""
        self._count[key] += 1
        return self._count[key] <= self.retries

    def reason(self, key, job: str = "evaluation", actor: str = "evaluator") -> str:
        """Why `key`'s job was given up, e.g. 'its evaluation killed the evaluator process twice'."""
        n = self._count[key]
        return f"its {job} killed the {actor} process {({1: 'once', 2: 'twice'}).get(n, f'{n} times')}"


@dataclass
class Triage:
    """What becomes of a dead actor's jobs (each named by its ref)."""

    finished: list = field(default_factory=list)  # finished before the death: their results stand
    running: object = None  # the job it was running, charged with the death
    retry: list = field(default_factory=list)  # to run again on a fresh actor, oldest first
    given_up: object = None  # the running job, charged too often: give it up with `reason`
    reason: str = ""

    def event(self, role: str, actor: int, keys: dict, error: Exception) -> dict:
        """The archive event that records the loss."""
        return {"role": role, "actor": actor, "running": keys.get(self.running), "given_up": self.given_up is not None,
                "requeued": [keys[ref] for ref in self.retry], "error": str(error)[-500:]}


def triage(keys: dict, deaths: Deaths, job: str = "evaluation", actor: str = "evaluator",
           unstarted: set = frozenset()) -> Triage:
    """Sort a dead actor's jobs (ref -> the job's key, in submission order) and charge the running one:
    the oldest unfinished job, among those not `unstarted` (sent once the actor was dead, see
    `sent_after_death`); when every unfinished job is such, none is charged."""
    out = Triage()
    lost = []
    for ref in keys:
        (out.finished if _finished(ref) else lost).append(ref)
    started = [ref for ref in lost if ref not in unstarted]
    if not started:
        out.retry = lost
        return out
    out.running = started[0]
    out.retry = [ref for ref in lost if ref is not out.running]
    if deaths.charge(keys[out.running]):
        out.retry.insert(0, out.running)
    else:
        out.given_up, out.reason = out.running, deaths.reason(keys[out.running], job, actor)
    return out


# A job counts as sent after its actor's death only this long after the death Ray recorded: the
# record is in the head's clock, the sending in the driver's (the same clock for a Ray job's driver).
CLOCKS_S = 2.0


def sent_after_death(actor, sent: dict) -> set:
    """The refs among `sent` (ref -> when the driver sent it) sent after Ray's GCS had `actor` as dead.

    They never ran on it: an actor that died idle (its node was lost between two jobs) is found
    dead only by the next job sent to it, the oldest unfinished, which would be charged with a
    death it did not cause (and with `controller.actor_death_retries` spent, stored FAILED).
    None where Ray cannot say when the actor died.
    """
    died = death_time(actor)
    if died is None:
        return set()
    return {ref for ref, at in sent.items() if at is not None and at > died + CLOCKS_S}


def death_time(actor) -> float | None:
    """When Ray's GCS recorded `actor`'s death (seconds since the epoch); None if not dead or unknown."""
    try:
        info = ray._private.state.actors(actor._actor_id.hex())
    except Exception:  # noqa: BLE001  Ray's private table: without it, every job is charged as before
        return None
    end = info.get("EndTime") if isinstance(info, dict) and info.get("State") == "DEAD" else None
    return end / 1000 if end else None


def _finished(ref) -> bool:
    # Every job of a dead actor resolves soon: with its result (its reply may still be on the way
    # when the death is seen) or with the actor's death. Waiting for it tells the two apart.
    if not ray.wait([ref], timeout=_SETTLE_S)[0]:
        return False
    try:
        ray.get(ref)
    except RayActorError:
        return False
    except RayError:  # our own code raised: the job finished, with that error as its result
        return True
    return True


def retire(actor) -> None:
    """Make sure a replaced actor is gone: it may only look dead (cut off, restarting)."""
    try:
        ray.kill(actor, no_restart=True)
    except (ValueError, RayError):  # already gone
        pass


def disk_full(exc: BaseException, run_dir: Path) -> bool:
    """Whether `exc` says that the disk holding `run_dir` is full (DuckDB, the OS, or a failed copy)."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if any(text in str(exc) for text in _FULL):
        return True
    if isinstance(exc, subprocess.CalledProcessError):  # the snapshot's copy: its message may be translated
        return any(text in str(exc.stderr) for text in _FULL) or _no_room_for_a_copy(run_dir)
    return False


def _no_room_for_a_copy(run_dir: Path) -> bool:
    try:
        return shutil.disk_usage(run_dir).free < (run_dir / "archive.duckdb").stat().st_size
    except OSError:
        return False


def disk_full_message(run_dir: Path) -> str:
    """The one line a run stopped by a full disk ends with."""
    return (f"the disk holding {run_dir} is full (no space left on device): the run stopped. Everything committed "
            f"before is kept and readable (atoll status, atoll query). Free some space, then continue with: "
            f"atoll resume {run_dir}")


def task_error(exc: BaseException) -> str:
    """What an actor's own code raised, in one line: the exception and where, from a RayTaskError.

    Ray's text of it is its whole remote traceback; the exception is its last line and the
    frame that raised it the last `File ..., line N, in name` above. The last 500 characters of
    it, as stored before, began anywhere in a line of source.
    """
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    frames = [m for m in (_FRAME.match(line) for line in lines) if m]
    where = f" ({Path(frames[-1]['file']).name}, line {frames[-1]['line']}, in {frames[-1]['name']})" if frames else ""
    return lines[-1].strip()[-400:] + where


_FRAME = re.compile(r'\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>\S+)')
