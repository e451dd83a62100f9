"""Live progress of a search on the terminal (rich), or periodic lines in a log."""
from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from controller.terminal import SafeConsole

# Proposals dropped as duplicates in a row, with no evaluation finishing between them, before
# the run says that its mutators may have run out of new programs (once per such stretch).
STALL = 1000


class Progress:
    """Shows evaluations/s, best score per island, failure rate, elapsed and budget left."""

    def __init__(self, search, max_evals: int, max_wall_s: float, console: Console | None = None):
        self.search, self.max_evals, self.max_wall_s = search, max_evals, max_wall_s
        self.console = console or SafeConsole(stderr=True)
        self.live = Live(console=self.console, refresh_per_second=2) if self.console.is_terminal else None
        self._first = search.done
        self._last_line = 0.0
        self._since = (None, 0, False)  # (evaluations, duplicates then, said): for `_stalled`

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        self.say_notices()
        if self.live:
            self.live.__exit__(*exc)

    def say_notices(self) -> None:
        """What the run's parts asked to say on stderr (a stalled embedded mutator, a model whose calls
        keep failing), in order."""
        memory = getattr(self.search, "memory", None)
        for notices in (getattr(self.search, "notices", None), getattr(memory, "notices", None)):
            while notices:
                self.console.print(notices.pop(0), highlight=False, markup=False, soft_wrap=True)

    def figures(self, elapsed: float) -> dict:
        s = self.search
        finished = s.done + len(s.results) - self._first
        bests = s.islands.island_bests()
        return {"evals": s.done + len(s.results), "rate": finished / max(elapsed, 1e-9),
                "failure_rate": s.failures / max(finished, 1), "best": s.best_score,
                "raced": getattr(s, "raced", 0),
                "duplicates": sum(s.dedup.saved.values()),
                "unmade": s.unmade.total if hasattr(s, "unmade") else 0,
                "bests": bests, "elapsed": elapsed,
                "left_s": max(0.0, self.max_wall_s - elapsed), "in_flight": s.in_flight()}

    def update(self, elapsed: float) -> None:
        self.say_notices()
        now = time.monotonic()  # the loop calls this every pass: figures at most four times a second
        if now - getattr(self, "_last_update", 0.0) < 0.25:
            return
        self._last_update = now
        f = self.figures(elapsed)
        self._stalled(f)
        if self.live:
            self.live.update(self._table(f))
        elif time.monotonic() - self._last_line >= 10:
            self._last_line = time.monotonic()
            best = "-" if f["best"] is None else f"{f['best']:.4f}"
            unmade = f"  no child {f['unmade']}" if f["unmade"] else ""
            print(f"[atoll] {f['evals']}/{self.max_evals} evals  {f['rate']:.2f}/s  best {best}  "
                  f"in flight {f['in_flight']}  failures {f['failure_rate']:.0%}  raced {f['raced']}  "
                  f"duplicates {f['duplicates']}{unmade}  "
                  f"elapsed {f['elapsed']:.0f}s  left {f['left_s']:.0f}s", file=sys.stderr, flush=True)

    def _stalled(self, f: dict) -> None:
        """Say once, on stderr, when STALL proposals in a row were duplicates and nothing finished meanwhile."""
        evals, duplicates, said = self._since
        if f["evals"] != evals:
            self._since = (f["evals"], f["duplicates"], False)
        elif not said and f["duplicates"] - duplicates >= STALL:
            self._since = (evals, duplicates, True)
            self.search.events.append(("mutators-stalled", {"duplicates_in_a_row": f["duplicates"] - duplicates,
                                                            "evaluations": evals}))  # archived, and to `atoll watch`
            self.console.print(
                f"atoll: the last {f['duplicates'] - duplicates} proposals were all programs already tried, and no "
                "evaluation finished meanwhile: the mutators may have run out of new programs. `atoll stop` ends the "
                "run with everything kept; more embedded operators (mutator.embedded.operators) or an LLM widen a "
                "next run's search.",
                highlight=False, soft_wrap=True)

    def _table(self, f: dict) -> Table:
        table = Table(title=f"atoll: {f['evals']}/{self.max_evals} evaluations", show_header=False)
        table.add_row("evaluations/s", f"{f['rate']:.2f}")
        table.add_row("failure rate", f"{f['failure_rate']:.0%}")
        table.add_row("raced (stopped early)", str(f["raced"]))
        table.add_row("duplicates dropped", str(f["duplicates"]))  # climbing while evaluations stall:
        table.add_row("in flight", str(f["in_flight"]))                 # the mutators' space is spent
        if f["unmade"]:  # the embedded mutator's requests that came back empty-handed
            table.add_row("requests with no child", str(f["unmade"]))
        table.add_row("elapsed / left", f"{f['elapsed']:.0f} s / {f['left_s']:.0f} s")
        for i, b in enumerate(f["bests"]):
            table.add_row(f"island {i} best", "-" if b is None else f"{b:.4f}")
        return table
