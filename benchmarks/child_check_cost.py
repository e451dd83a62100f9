"""CPU a proposal's child costs in the LLM worker's check and in the driver's duplicate check.

For each program (each domain's seed, the largest baseline programs, and a 4 KB program as
evolved programs grow), a model's reply rewrites it with one new constant; the script times
the worker's turning the reply into a checked child (`workers.llm.worker._child`: parse,
contract checks, normal form) and the driver's duplicate check of that child (`Dedup.check`,
then `add` as proposed and again as evaluated), in CPU microseconds per proposal.

    python3 benchmarks/child_check_cost.py [--proposals 2000]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.dedup import Dedup  # noqa: E402
from evaluators.registry import get_domain  # noqa: E402
from workers.llm.prompts import PromptInput  # noqa: E402
from workers.llm.worker import _child  # noqa: E402


def programs() -> list[tuple[str, str, str]]:
    """(label, entry point, code)."""
    out = []
    for name, baseline in (("inventory", "myopic"), ("milp", "pscost"), ("control", "linear (CMA-ES)"),
                           ("trading", "random entries")):
        domain = get_domain(name)
        out.append((f"{name} seed", domain.entry_point, domain.seed_program))
        out.append((f"{name} {baseline!r}", domain.entry_point, domain.baselines()[baseline]))
    control = get_domain("control")
    helpers = "".join(f"\n\ndef helper_{i}(x, scale={i}.5):\n    y = x * scale - {i}\n    if y > {i}:\n"
                      f"        return y / (1 + abs(x))\n    return max(y, -{i}.0) + min(x, {i})\n" for i in range(20))
    out.append(("control, grown", control.entry_point, control.baselines()["linear (CMA-ES)"] + helpers))
    return out


def measure(entry: str, code: str, n: int) -> tuple[float, float]:
    prompt = PromptInput("d", "", "", entry, code, None, edit_format="rewrite")
    replies = [f"```python\n{code}\nEXTRA_{i} = {i}\n```\n" for i in range(n)]
    dedup, children = Dedup(), []
    start = time.thread_time()
    for reply in replies:
        checked = _child(reply, prompt)
        children.append((checked[0], checked[2] if len(checked) == 4 else None))  # (code, normal form)
        assert checked[-1] is None, checked[-1]
    worker = (time.thread_time() - start) / n * 1e6
    start = time.thread_time()
    for child, form in children:
        assert (dedup.check(child, form) if form is not None else dedup.check(child)) is None
        dedup.add(child)
        dedup.add(child)  # again as evaluated
    driver = (time.thread_time() - start) / n * 1e6
    return worker, driver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proposals", type=int, default=2000, help="children per program (default 2000)")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for label, entry, code in programs():
        measure(entry, code, 50)  # warm
        worker, driver = measure(entry, code, args.proposals)
        print(f"{label:32s} {len(code):5d} chars: worker's child check {worker:6.0f} µs, "
              f"driver's duplicate check {driver:5.0f} µs (CPU per proposal)", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
