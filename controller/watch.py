"""`atoll watch RUN_DIR`: a live view of a run's status and events.

On a terminal it is a rich table that refreshes with the latest events under it;
into a file or a pipe it prints a status line every `every` seconds and one line
per event. It ends when the search ends (the event stream closes) and on Ctrl-C,
which stops only the watching. A run that is not live, a live one whose control plane
cannot be reached from here, or a refused token, is one line and exit 2 before anything
is shown, and a refusal of the event stream later is too: "the run ended" is said only
when the driver ended it or went away.
"""
from __future__ import annotations

import json
import queue
import threading
import time

from rich.console import Group
from rich.live import Live
from rich.table import Table

from controller.cli import UserError
from controller.control_client import NotLive
from controller.terminal import visible

_END = object()
SHOWN_EVENTS = 12


class Watch:
    def __init__(self, client, console, every_s: float = 5.0):
        self.client, self.console, self.every_s = client, console, every_s
        self.events: queue.Queue = queue.Queue()
        self.recent: list[str] = []
        self.status = None
        self.ended = "the driver went away"

    def run(self) -> int:
        self.status = self.client.status()  # not live, or the token refused: one line, exit 2 (UserError)
        threading.Thread(target=self._follow, name="atoll-watch-events", daemon=True).start()
        try:
            if self.console.is_terminal:
                with Live(console=self.console, refresh_per_second=4) as live:
                    self._loop(lambda: live.update(self._view()))
            else:
                self._loop(lambda: print(visible(status_line(self.status)), flush=True) if self.status else None)
        except KeyboardInterrupt:
            print("stopped watching; the run goes on", flush=True)
            return 0
        print(f"the run ended: {self.ended}", flush=True)
        return 0

    def _follow(self) -> None:
        try:
            for event in self.client.events():
                self.events.put(event)
        except NotLive:
            pass  # the driver went away
        except UserError as exc:  # refused: said as such by the loop, not as the run's end
            self.events.put(exc)
        self.events.put(_END)

    def _loop(self, show) -> None:
        """Status every `every_s`, events as they come, until the stream ends."""
        next_status = time.monotonic() + self.every_s if self.status is not None else 0.0
        show()
        while True:
            if time.monotonic() >= next_status:
                self._refresh()
                show()
                next_status = time.monotonic() + self.every_s
            try:
                event = self.events.get(timeout=max(0.05, next_status - time.monotonic()))
            except queue.Empty:
                continue
            if event is _END:
                return
            if isinstance(event, UserError):
                raise event
            self._on_event(event)
            if self.console.is_terminal:
                show()

    def _refresh(self) -> None:
        try:
            self.status = self.client.status()
        except UserError:
            pass  # the run is ending, or its driver is too busy to answer now: its stream says which

    def _on_event(self, event) -> None:
        line = event_line(event)
        if event.kind == "ended":
            self.ended = json.loads(event.detail_json).get("status", "ended")
        self.recent = (self.recent + [line])[-SHOWN_EVENTS:]
        if not self.console.is_terminal:
            print(visible(line), flush=True)

    def _view(self):
        table = Table(title=f"atoll watch: {self.client.run_dir}", show_header=False)
        if self.status is not None:
            for name, value in status_rows(self.status):
                table.add_row(name, value)
        events = Table("latest events", show_header=True)
        for line in self.recent:
            events.add_row(line)
        return Group(table, events)


def _budget(b) -> str:
    """Counts and seconds as whole numbers, money as it is."""
    form = ".6g" if b.name.endswith("cost") else ".0f"
    return format(b.used, form) + (f" / {format(b.limit, form)}" if b.HasField("limit") else "")


def status_rows(s) -> list[tuple[str, str]]:
    rows = [("state", "paused" if s.paused else "running"), ("run", s.run_id)]
    rows += [(b.name, _budget(b)) for b in s.budgets]
    rows += [("evaluations/s", f"{s.evals_per_s:.2f}"), ("proposals/s", f"{s.proposals_per_s:.2f}"),
             ("in flight", str(s.in_flight)), ("best", f"{s.best:.5g}" if s.HasField("best") else "-")]
    rows += [(f"island {i.island} best", f"{i.score:.5g}" if i.HasField("score") else "-") for i in s.islands]
    rows.append(("failures", ", ".join(f"{f.kind} {f.count}" for f in s.failures) or "none"))
    rows.append(("sandbox", ", ".join(s.protections) or "-"))
    return rows


def status_line(s) -> str:
    """The status as one line for a log: its state first (a paused run's line said nothing of the pause, only
    that nothing moved), then the budgets, rates, best and failures; not the run, islands or sandbox."""
    shown = {"run", "sandbox"} | {f"island {i.island} best" for i in s.islands}
    return time.strftime("%H:%M:%S ") + "  ".join(f"{k} {v}" for k, v in status_rows(s) if k not in shown)


def event_line(event) -> str:
    return f"{time.strftime('%H:%M:%S', time.localtime(event.time))} {event.kind} {event.detail_json}"
