"""Which program the report crowns "the evolved best": the best by search score whose result on the
validation split did not fail.

The search ranks programs by search score alone, and a program can score well there and still
fail on data of the same kind met otherwise: the inventory domain's validation split measures
from a disturbed start (a high stock), and a policy that runs away there is INVALID
(`Inventory._check_stable`). So before the held-out table the report evaluates the candidates on
the validation split (the run's own data, from its validation secret), best search score first,
as many at a time as it has evaluators, until one ends OK; each result is stored, so a later
report and `atoll best` (the same rule, `PASSED_OVER`) read it back. After MAX_CHECKS failures
the next program is crowned unchecked, and the report says so. The held-out split plays no part.
"""
from __future__ import annotations

from store.records import Status

MAX_CHECKS = 24  # validation failures before the next program is crowned unchecked
# SQL: a program whose validation result did not end OK is never the evolved best (`atoll best` too);
# `atoll report --again` checks once more those that ended otherwise than INVALID (a timeout on a busy machine)
PASSED_OVER = ("EXISTS (SELECT 1 FROM evaluations v WHERE v.program_id = p.program_id AND v.split = 'validation' "
               "AND v.status <> 'OK')")
PASSED_OVER_AGAIN = PASSED_OVER.replace("<> 'OK'", "= 'INVALID'")
# SQL over `programs p JOIN evaluations s` (s: the search result), shared with `atoll best` so both rank alike:
# the programs that can be crowned, and their order (ties: the shorter code, then the earlier)
SEARCH_JOIN = "programs p JOIN evaluations s ON s.program_id = p.program_id AND s.split = 'search'"
SEARCH_OK = "s.status = 'OK' AND p.mutator NOT LIKE 'baseline:%'"
BEST_FIRST = "ORDER BY s.score DESC, length(p.code), p.seq"


def crowned(archive, run_id: str, validate, width, console=None, again: bool = False) -> dict | None:
    """The evolved best ({program_id, code, score, status}), or None when no program scored OK on the
    search split. `validate({program_id: code})` scores up to `width()` programs at once on the
    validation split (called only when one needs a check: it may start the evaluators) and returns
    {program_id: EvalResult}, each stored as it arrives; None (an archive that may not be written):
    the stored results alone decide. `console` (None: silent) hears what was passed over and why.
    With `again`, a stored validation result that ended TIMEOUT or FAILED is checked again."""
    say = console.print if console is not None else lambda *args, **kwargs: None
    rows = _ranked(archive, run_id, 2 * MAX_CHECKS + 1, again and validate is not None)
    status = {row["program_id"]: row["status"] if row["status"] == "OK" else None for row in rows}
    failed = 0
    for i, row in enumerate(rows):
        if status[row["program_id"]] is None and failed < MAX_CHECKS and validate is not None:
            batch = [r for r in rows[i:] if status[r["program_id"]] is None][:min(width(), MAX_CHECKS)]
            for pid, result in validate({r["program_id"]: r["code"] for r in batch}).items():
                status[pid] = result.status.value
                if result.status != Status.OK:
                    failed += 1
                    say(f"[atoll] validation: program {pid} is not crowned: {result.status.value}: "
                                  f"{result.reason()[:300]}", soft_wrap=True)
        if status[row["program_id"]] in ("OK", None):
            _say(say, row, status[row["program_id"]], failed, validate is None)
            return row
    return None  # every ranked program failed: more than MAX_CHECKS had failed before this report


def _ranked(archive, run_id: str, limit: int, again: bool = False) -> list[dict]:
    """The programs that scored OK on the search split, best first (ties: the shorter code, then the
    earlier, as `DuckDBArchive.best_program`), but those whose validation failed (with `again`: was
    INVALID); each with its validation status (None: not checked)."""
    rows = archive.con.execute(
        f"SELECT p.program_id, p.code, s.score, v.status FROM {SEARCH_JOIN} LEFT JOIN evaluations v "
        f"ON v.program_id = p.program_id AND v.split = 'validation' WHERE p.run_id = ? AND {SEARCH_OK} "
        f"AND NOT {PASSED_OVER_AGAIN if again else PASSED_OVER} {BEST_FIRST} LIMIT ?", [run_id, limit]).fetchall()
    return [dict(zip(("program_id", "code", "score", "status"), row)) for row in rows]


def _say(say, best: dict, status: str | None, failed: int, read_only: bool) -> None:
    """One line when the evolved best is not the best search score, or was not checked."""
    if status is None and read_only:
        say(f"[atoll] validation: the evolved best, program {best['program_id']}, has no validation result "
            "and the archive may not be written here, so it is crowned unchecked", soft_wrap=True)
    elif status is None:
        say(f"[atoll] validation: the {failed} programs with the best search scores failed on the "
                      f"validation split; the evolved best, program {best['program_id']}, is crowned unchecked",
                      soft_wrap=True)
    elif failed:
        say(f"[atoll] validation: the evolved best is program {best['program_id']} (search score "
                      f"{best['score']:.5g}), the best whose validation result ended OK", soft_wrap=True)
