"""`atoll new-domain` and `atoll check`: start a domain of one's own, and check that it is sound."""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from rich.table import Table
from rich.text import Text

from controller.cli import UserError
from controller.config import load_config


def cmd_new_domain(args) -> int:
    from controller.read_commands import console
    from controller.scaffold import ScaffoldError, write_domain

    folder = Path(args.dir) if args.dir else Path(args.name)
    try:
        written = write_domain(args.name, folder)
    except ScaffoldError as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write into {folder}: {exc.strerror or exc}") from None
    config = next(path for path in written if path.suffix == ".toml")
    console.print(f"wrote {', '.join(str(path) for path in written)}", soft_wrap=True)
    needs = "" if importlib.util.find_spec("pytest") else "   (pytest is not installed here: pip install pytest)"
    console.print(f"check it:  atoll check {config}\nsearch:    atoll run {config}\n"
                  f"its tests: python -m pytest {folder}{needs}", soft_wrap=True)
    return 0


def cmd_check(args) -> int:
    from controller.read_commands import console
    from evaluators.check import Checker

    config, _ = load_config(args.config, args.set)
    checker = Checker(config.domain, config.evaluator.sandbox)
    console.print(f"atoll check {checker.domain.name}: scoring its programs and a few hostile ones "
                  "in the sandbox (no Ray)", soft_wrap=True)
    start = time.monotonic()
    checks = [*checker.run(), embedded_check(config, checker.domain)]
    table = Table("check", "result", "seen, or what to fix", title=f"domain {checker.domain.name}")
    for check in checks:
        result = Text("pass", style="green") if check.passed else Text("FAIL", style="red")
        table.add_row(check.name, result, check.detail)
    console.print(table)
    failed = sum(not check.passed for check in checks)
    console.print(f"{len(checks) - failed} of {len(checks)} checks passed in {time.monotonic() - start:.0f} s"
                  + ("" if not failed else f"; fix the {failed} that failed and run atoll check again"))
    return 1 if failed else 0


# Requests `atoll check` makes of the embedded mutator for the seed (each after its `max_attempts` tries)
SEED_REQUESTS = 20


def embedded_check(config, domain):
    """Whether the embedded mutator makes a child of the seed: a run that has no other source of
    programs otherwise stops at once (`stalled`, controller.outcomes). With an LLM configured the
    row passes and says what a run would do instead."""
    from evaluators.check import Check
    from store.records import MutationRequest
    from workers._base import MutationFailed
    from workers.embedded import EmbeddedMutator, no_child_remedy, operators_reach

    name = "the embedded mutator changes the seed"
    mutator = EmbeddedMutator.for_domain(config.mutator.embedded, domain)
    made, reason = 0, ""
    for seed in range(SEED_REQUESTS):
        try:
            mutator.propose(MutationRequest("check", 0, 1, "seed", domain.seed_program, seed=seed))
            made += 1
        except MutationFailed as exc:
            reason = str(exc)
    if made:
        return Check(name, True, f"{made} of {SEED_REQUESTS} requests made a child")
    why = f"no child in {SEED_REQUESTS} requests ({reason}): {operators_reach(domain.entry_point)}"
    if config.mutator.llm is not None:
        return Check(name, True, f"{why}; a run leaves the seed to the LLM ([mutator.llm])")
    return Check(name, False, f"{why}; {no_child_remedy(domain.entry_point)}")
