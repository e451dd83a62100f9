"""`atoll progress`: is the search still improving, and where?

Read from the archive as `store.query` serves it (the live driver while a run holds it, else the
file, or an archive file given itself), so it works during a run, after it and on a backup's
copy. A search evaluation's number is its place in commit order (`programs.seq`) among the run's
search evaluations, whatever their status; "best" is the best OK search score up to it. Racing's
partial rows (RACED) never count as a best.
"""
from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path

from controller.cli import UserError
from controller.read_commands import console, json_line, print_rows, query_run

SPARK = "▁▂▃▄▅▆▇█"
WIDTH = 60  # characters of the best-so-far line
SHOWN = 20  # improvements listed, the latest

# Every search evaluation of the run in commit order, numbered, with the best OK score up to it and
# whether it improved the run's best (`improved`) and its island's (`island_improved`).
_ORDERED = """
WITH s AS (
  SELECT row_number() OVER (ORDER BY p.seq) AS n, p.program_id, p.island, p.mutator, p.created_at,
         e.score, e.status = 'OK' AS ok
  FROM programs p JOIN evaluations e ON e.program_id = p.program_id AND e.split = 'search'
  WHERE p.run_id = '{run}' AND p.mutator NOT LIKE 'baseline:%'
), b AS (
  SELECT *, max(CASE WHEN ok THEN score END) OVER (ORDER BY n ROWS UNBOUNDED PRECEDING) AS best,
         max(CASE WHEN ok THEN score END) OVER (ORDER BY n ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS before,
         max(CASE WHEN ok THEN score END) OVER (PARTITION BY island ORDER BY n
                                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS island_before
  FROM s
)
SELECT *, ok AND (before IS NULL OR score > before) AS improved,
       ok AND (island_before IS NULL OR score > island_before) AS island_improved
FROM b
"""


def cmd_progress(args) -> int:
    run_dir = Path(args.run_dir)
    _, runs, _ = query_run(run_dir, "SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1")
    if not runs:
        raise UserError(f"{run_dir} holds no run yet")
    run_id = runs[0][0]
    ordered, (total, best, scored, last_n, last_at, seed), note = _head(run_dir, run_id)
    if not total:
        raise UserError(f"{run_dir}: run {run_id} has no search evaluation yet")
    if args.json:
        return _as_json(run_dir, ordered)
    console.print(f"run {run_id}: {total:,} search evaluations, {scored:,} of them OK; "
                  + ("no OK score yet" if best is None else f"best {best:.6g}"
                     + ("" if seed is None else f" (the seed: {seed:.6g})")), soft_wrap=True)
    if best is None:
        return 0
    width = min(WIDTH, total)
    _, buckets, _ = query_run(run_dir, (
        f"WITH o AS ({ordered}) SELECT floor((n - 1) * {width} / {total})::INT AS b, max(best) FROM o GROUP BY b"))
    console.print(f"best so far, evaluations 1 to {total:,}: {spark(dict(buckets), width)}", soft_wrap=True)
    console.print(f"last improvement: {_last(total, last_n, last_at)}", soft_wrap=True)
    cols, rows, _ = query_run(run_dir, (
        f"WITH o AS ({ordered}) SELECT n AS evaluation, created_at AS made, "
        "score, score - before AS gain, island, mutator AS source, program_id FROM o WHERE improved ORDER BY n"))
    shown = rows[-SHOWN:]
    more = f" (the latest {len(shown)} of {len(rows):,})" if len(rows) > len(shown) else ""
    console.print(f"improvements of the run's best{more}:")
    from controller.backup import stamp

    print_rows(cols, [(n, stamp(made), f"{score:.6g}", "" if gain is None else f"+{gain:.4g}", *rest)
                      for n, made, score, gain, *rest in shown], None)
    print(f"how one was made, step by step: atoll lineage {shlex.quote(str(run_dir))} PROGRAM_ID --diff",
          file=sys.stderr)
    cols, rows, _ = query_run(run_dir, (
        f"WITH o AS ({ordered}) SELECT island, count(*) AS evaluations, max(score) FILTER (WHERE ok) AS best, "
        "max(n) FILTER (WHERE island_improved) AS last_improvement "
        "FROM o GROUP BY island ORDER BY island"))
    console.print("islands (last improvement: the run's evaluation number of the island's latest best):")
    print_rows(cols + ["evaluations_since"],
               [(island, evals, "" if top is None else f"{top:.6g}", last, "" if last is None else total - last)
                for island, evals, top, last in rows], note)
    return 0


def _head(run_dir: Path, run_id: str) -> tuple[str, tuple, str | None]:
    """The run's ordered evaluations (SQL), and (evaluations, best, OK ones, the evaluation of the last
    improvement, when its program was made, the seed's score), and the read's note."""
    ordered = _ORDERED.format(run=run_id.replace("'", "''"))
    _, head, note = query_run(run_dir, (
        f"WITH o AS ({ordered}) SELECT count(*), max(best), count(*) FILTER (WHERE ok), "
        "max(n) FILTER (WHERE improved), max(created_at) FILTER (WHERE improved), "
        "any_value(score) FILTER (WHERE mutator = 'seed') FROM o"))
    return ordered, head[0], note


def _last(total: int, last_n: int, last_at: float) -> str:
    from controller.backup import stamp

    return f"evaluation {last_n:,} of {total:,} ({total - last_n:,} evaluations since; made {stamp(last_at)})"


def last_improvement(run_dir: Path, run_id: str) -> str:
    """`atoll status`'s line on the last improvement of the run's best ('' before any OK score)."""
    _, (total, best, _, last_n, last_at, _), _ = _head(run_dir, run_id)
    if best is None:
        return ""
    return f"last improvement of the best: {_last(total, last_n, last_at)}; over the run: atoll progress {run_dir}"


def spark(buckets: dict[int, float | None], width: int) -> str:
    """The best-so-far as one line of block characters, a bucket of evaluations each, scaled from the
    lowest best to the highest; a bucket before any OK score is a space."""
    values = [v for v in buckets.values() if v is not None and math.isfinite(v)]
    if not values:
        return ""
    low, high = min(values), max(values)
    line = []
    for b in range(width):
        v = buckets.get(b)
        if v is None or not math.isfinite(v):
            line.append(" ")
        else:
            line.append(SPARK[-1] if high == low else SPARK[min(len(SPARK) - 1, int((v - low) / (high - low) * len(SPARK)))])
    return "".join(line)


def _as_json(run_dir: Path, ordered: str) -> int:
    """Every improvement of the run's best as a JSON line: for a plot or a script."""
    cols, rows, _ = query_run(run_dir, (
        f"WITH o AS ({ordered}) SELECT n AS evaluation, created_at AS made, score, island, mutator AS source, "
        "program_id FROM o WHERE improved ORDER BY n"))
    for row in rows:
        print(json_line(dict(zip(cols, row))))
    return 0
