"""A built-in domain's search evaluation, whole: the seed program and every baseline, sandboxed.

    python3 benchmarks/evaluation_cost.py [--domain inventory] [--repeats 3] [--root DIR] [--option KEY=VALUE ...]

Prints the median and range of one evaluation's wall time (the evaluator's own clock: tuning,
the fresh-data measurement, the sandbox) on the domain's default options (or those `--option`
changes, e.g. the tests' tiny set) and fixed secrets,
after one warm-up evaluation, with the load average before and after. `--root DIR` times the
code of another checkout (the code before a change), so two runs side by side compare them.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domain", default="inventory", help="a built-in domain (default inventory)")
    parser.add_argument("--repeats", type=int, default=3, help="evaluations of each program (default 3)")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]),
                        help="the checkout whose code is timed (default this one)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a domain option, a number (repeatable), e.g. tune_batch=8")
    args = parser.parse_args()
    options = {key: float(value) if "." in value else int(value)
               for key, value in (item.split("=", 1) for item in args.option)}
    sys.path.insert(0, os.path.abspath(args.root))
    from evaluators.evaluator import Evaluator
    from evaluators.sandbox.config import SandboxConfig
    from evaluators.secrets import RunSecrets

    print(f"load average before: {os.getloadavg()[0]:.2f}; code: {Evaluator.__module__} from "
          f"{sys.modules[Evaluator.__module__].__file__}", flush=True)
    evaluator = Evaluator(args.domain, options, SandboxConfig(), secrets=RunSecrets.fixed(3))
    programs = {"seed": evaluator.domain.seed_program, **evaluator.domain.baselines()}
    evaluator.evaluate("warm-up", programs["seed"], "search")
    times = []
    for _ in range(args.repeats):
        for name, code in programs.items():
            start = time.monotonic()
            result = evaluator.evaluate(name, code, "search")
            times.append(time.monotonic() - start)
            if result.status.value != "OK":
                print(f"  {name}: {result.status.value} ({result.reason()})", flush=True)
    ms = sorted(t * 1000 for t in times)
    print(f"{args.domain} search evaluation{' ' + str(options) if options else ''}, {len(programs)} programs x "
          f"{args.repeats}: median "
          f"{statistics.median(ms):.0f} ms (range {ms[0]:.0f} to {ms[-1]:.0f}); load average after: "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
