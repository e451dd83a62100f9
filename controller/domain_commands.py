"""`atoll new-domain` and `atoll check`: start a domain of one's own, and check that it is sound."""
from __future__ import annotations

import time
from pathlib import Path

from rich.table import Table

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
    console.print(f"check it:  atoll check {config}\nsearch:    atoll run {config}\n"
                  f"its tests: python -m pytest {folder}", soft_wrap=True)
    return 0


def cmd_check(args) -> int:
    from controller.read_commands import console
    from evaluators.check import Checker

    config, _ = load_config(args.config, args.set)
    checker = Checker(config.domain, config.evaluator.sandbox)
    console.print(f"[bold]atoll check[/] {checker.domain.name}: scoring its programs and a few hostile ones "
                  "in the sandbox (no Ray)", soft_wrap=True)
    start = time.monotonic()
    checks = checker.run()
    table = Table("check", "result", "seen, or what to fix", title=f"domain {checker.domain.name}")
    for check in checks:
        table.add_row(check.name, "[green]pass[/]" if check.passed else "[red]FAIL[/]", check.detail)
    console.print(table)
    failed = sum(not check.passed for check in checks)
    console.print(f"{len(checks) - failed} of {len(checks)} checks passed in {time.monotonic() - start:.0f} s"
                  + ("" if not failed else f"; fix the {failed} that failed and run atoll check again"))
    return 1 if failed else 0
