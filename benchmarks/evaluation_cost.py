"""A built-in domain's search evaluation, whole: the seed program and every baseline, sandboxed.

    python3 benchmarks/evaluation_cost.py [--domain inventory | --domain-file FILE] [--repeats 3] [--root DIR]
                                          [--option KEY=VALUE ...]

Prints the median and range of one evaluation's wall time (the evaluator's own clock: tuning,
the fresh-data measurement, the sandbox) on the domain's default options (or those `--option`
changes, e.g. the tests' tiny set) and fixed secrets, or of a user's domain file (`--domain-file`,
e.g. the one `atoll new-domain pricing` writes),
after one warm-up evaluation, with the load average before and after. `--root DIR` times the
code of another checkout (the code before a change), so two runs side by side compare them.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path


def _number_or_text(value: str):
    """An option's value: an int, else a float, else the text itself (e.g. search_size=fast)."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domain", default="inventory", help="a built-in domain (default inventory)")
    parser.add_argument("--domain-file", help="a user's domain file instead (e.g. from `atoll new-domain`)")
    parser.add_argument("--repeats", type=int, default=3, help="evaluations of each program (default 3)")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1]),
                        help="the checkout whose code is timed (default this one)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a domain option, a number or a word (repeatable), e.g. tune_batch=8")
    args = parser.parse_args()
    options = {key: _number_or_text(value) for key, value in (item.split("=", 1) for item in args.option)}
    sys.path.insert(0, os.path.abspath(args.root))
    from evaluators.evaluator import Evaluator
    from evaluators.registry import DomainConfig
    from evaluators.sandbox.config import SandboxConfig
    from evaluators.secrets import RunSecrets

    print(f"load average before: {os.getloadavg()[0]:.2f}; code: {Evaluator.__module__} from "
          f"{sys.modules[Evaluator.__module__].__file__}", flush=True)
    domain = args.domain
    if args.domain_file:
        path = Path(args.domain_file).resolve()
        domain = DomainConfig(path=str(path), source=path.read_text())
    evaluator = Evaluator(domain, options, SandboxConfig(), secrets=RunSecrets.fixed(3))
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
    print(f"{evaluator.domain.name} search evaluation{' ' + str(options) if options else ''}, "
          f"{len(programs)} programs x {args.repeats}: median "
          f"{statistics.median(ms):.0f} ms (range {ms[0]:.0f} to {ms[-1]:.0f}); load average after: "
          f"{os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
