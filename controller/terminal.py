"""Text from outside Atoll's trust, made safe to print on a terminal.

A program an LLM wrote, the error a candidate raised and the body an endpoint sent are data, and
a terminal obeys the control sequences in what it is sent: ESC and the C1 controls move the
cursor, erase lines, set the window's title or the clipboard. A program printed by `atoll best`
could so show other lines than the ones stored. Every command therefore prints such text with its
control characters written out (`\\x1b`); newlines and tabs stay. JSON output needs nothing more
(JSON escapes every control character), and a file written with `atoll best --out` keeps the
program exactly as stored.
"""
from __future__ import annotations

import re

from rich.console import Console

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """`text` with every control character but newline and tab written out as `\\xNN`."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class SafeConsole(Console):
    """A rich Console that prints every string it is given (table cells too) as `visible` makes it;
    the styles Atoll adds itself are rich's own and are not touched."""

    def render_str(self, text: str, **options):
        return super().render_str(visible(text), **options)
