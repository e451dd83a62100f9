"""How many of a run's programs declare PARAMS that their entry point never reads.

Every declared parameter is tuned (optuna's trials on the search split), so a parameter the
policy does not read takes a share of each evaluation's tuning budget for nothing. Reads each
run directory's archive (read-only; a live run is read through its driver, as `atoll query`
does) and prints, by source (the embedded mutator's operators, each LLM, the seed), the
evaluated programs, how many declare an unread parameter, and the unread share of all declared
parameters. An entry is unread as `workers.embedded.without_unread_params` finds it: the entry
point reads its params only as `params["name"]`, and never reads that name.

    python3 benchmarks/unread_params.py runs/inventory-1 runs/inventory-2
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.read_commands import query_run
from evaluators.params import ProgramFormatError, read_params
from workers.embedded import without_unread_params


def unread(code: str, entry_point: str) -> tuple[int, int]:
    """(declared, unread) parameters of one program."""
    try:
        declared = read_params(code)
    except (ProgramFormatError, SyntaxError, ValueError):
        return 0, 0
    return len(declared), len(declared) - len(read_params(without_unread_params(code, entry_point)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--entry-point", default="policy", help="the domain's entry point (control: act)")
    args = parser.parse_args()
    for run_dir in args.run_dirs:
        _, rows, _ = query_run(run_dir, (
            "SELECT split_part(p.mutator, ':', 1) AS source, p.code FROM programs p JOIN evaluations e "
            "ON e.program_id = p.program_id AND e.split = 'search' WHERE p.mutator NOT LIKE 'baseline:%'"))
        by = defaultdict(lambda: [0, 0, 0, 0])  # programs, with an unread one, declared, unread
        for source, code in rows:
            declared, dead = unread(code, args.entry_point)
            figures = by[source]
            figures[0] += 1
            figures[1] += dead > 0
            figures[2] += declared
            figures[3] += dead
        print(f"{run_dir}:")
        for source, (programs, with_dead, declared, dead) in sorted(by.items()):
            print(f"  {source:<10} {programs:>6,} programs, {with_dead:>6,} ({with_dead / programs:.0%}) declare an "
                  f"unread parameter; {dead:,} of {declared:,} declared parameters unread "
                  f"({dead / declared if declared else 0:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
