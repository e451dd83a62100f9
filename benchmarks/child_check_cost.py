"""CPU a proposal's child costs in the LLM worker's check and in the driver's duplicate check,
and what the embedded mutator adds to each child it makes.

For each program (each domain's seed, the largest baseline programs, and a 4 KB program as
evolved programs grow), a model's reply rewrites it with one new constant; the script times
the worker's turning the reply into a checked child (`workers.llm.worker._child`: parse,
contract checks, normal form) and the driver's duplicate check of that child (`Dedup.check`,
then `add` as proposed and again as evaluated), in CPU microseconds per proposal. For the same
programs it times the embedded mutator's last steps on a child one of its operators made
(`perturb_const`, or `wrap_clip` where that finds nothing): dropping PARAMS entries the policy no
longer reads and writing the child in the parent's text (`workers.layout.keep_layout`).

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
from workers.ast_ops import OPERATORS, OpContext  # noqa: E402
from workers.embedded import without_unread_params  # noqa: E402
from workers.layout import keep_layout  # noqa: E402
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


def embedded_steps(entry: str, code: str, n: int) -> float:
    """CPU µs a child of the embedded mutator spends in its last two steps."""
    import numpy as np

    ctx = OpContext(entry, np.random.default_rng(0))
    children = []
    for i in range(n):
        child = OPERATORS["perturb_const"](code, ctx) or OPERATORS["wrap_clip"](code, ctx)
        assert child is not None, "no operator changed the program"
        children.append(child)
    start = time.thread_time()
    for child in children:
        keep_layout(code, without_unread_params(child, entry))
    return (time.thread_time() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proposals", type=int, default=2000, help="children per program (default 2000)")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for label, entry, code in programs():
        measure(entry, code, 50)  # warm
        embedded_steps(entry, code, 10)
        worker, driver = measure(entry, code, args.proposals)
        embedded = embedded_steps(entry, code, max(50, args.proposals // 10))
        print(f"{label:32s} {len(code):5d} chars: worker's child check {worker:6.0f} µs, "
              f"driver's duplicate check {driver:5.0f} µs, the embedded mutator's layout and unread PARAMS "
              f"{embedded:6.0f} µs (CPU per proposal)", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
