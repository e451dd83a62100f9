"""The library's commands: `atoll runs`, `atoll skills`, `atoll query --library`.

The library is the file ATOLL_LIBRARY names, else the one in the user's data
directory (a run's `memory.library` key overrides both for that run only).
"""
from __future__ import annotations

import json
from pathlib import Path

from controller.cli import UserError
from store.library import Library, LibraryError, default_path


def _library() -> Library:
    return Library(default_path())


def _read(work, write: bool = False):
    """`work(con)` over the library: opened read-only (never created) unless `write`."""
    library = _library()
    try:
        return library.transaction(work) if write else library.read(work)
    except LibraryError as exc:
        raise UserError(str(exc)) from None


def _warm_text(value) -> str:
    if not value:
        return ""
    plan = json.loads(value) if isinstance(value, str) else value
    source = plan["runs"] if isinstance(plan["runs"], str) else ", ".join(plan["runs"])
    return f"{source}: {len(plan['elites'])} elites, {len(plan['skills'])} skills"


def cmd_runs(args) -> int:
    from controller.read_commands import print_rows
    from store import library_records as records
    from store.library_query import holds_archive

    rows = _read(lambda con: records.runs(con, args.domain))
    cols = ["run_id", "status", "domain", "fingerprint", "evaluations", "best search score", "warm start from",
            "run_dir", "started"]
    table = [(r["run_id"], _shown_status(r), r["domain"], r["fingerprint"], r["evaluations"],
              None if r["best_search_score"] is None else f"{r['best_search_score']:.5g}",
              _warm_text(r["warm_start"]), r["run_dir"], str(r["started_at"])[:19]) for r in rows]
    gone = sum(not holds_archive(r["run_dir"]) for r in rows)
    note = (f"the library {default_path()} knows no runs yet" + ("" if default_path().exists() else
            " (there is no such file: a run creates it)") if not rows else
            f"{gone} of these {len(rows)} runs' directories no longer hold their archive.duckdb (moved or deleted); "
            "`atoll query --library` leaves them out" if gone else None)
    print_rows(cols, table, note, args.json)
    return 0


def _shown_status(run: dict) -> str:
    """The catalogued status, except that a `running` run no live driver holds (its driver killed
    before it could say how it ended) says so; a run directory that is not here is left as catalogued."""
    from controller.rundir import STOPPED, driver_holds

    if run["status"] == "running" and run["run_dir"] and driver_holds(Path(run["run_dir"])) is False:
        return STOPPED
    return run["status"]


def cmd_skills(args) -> int:
    from controller.read_commands import print_rows
    from store import library_records as records

    if args.retire:
        known = _read(lambda con: con.execute("SELECT count(*) FROM skills WHERE skill_id = ?",
                                              [args.retire]).fetchall()[0][0])
        if not known or not _read(lambda con: records.retire_skill(con, args.retire), write=True):
            raise UserError(f"the library has no skill {args.retire!r} (`atoll skills` lists them)")
        print(f"retired {args.retire}: kept in the library, never retrieved again")
        return 0
    rows = _read(lambda con: records.skills(con, args.domain, retired=args.all))
    cols = ["skill_id", "domain", "title", "uses", "successes", "efficacy", "search gain", "validation gain",
            "times learned", "learned in", "retired"]
    table = [(r["skill_id"], r["domain"], r["title"], r["uses"], r["successes"], f"{r['efficacy']:.3f}",
              f"{r['search_gain']:+.4g}", f"{r['validation_gain']:+.4g}", r["times_learned"], r["learned_in"],
              "" if r["retired_at"] is None else str(r["retired_at"])[:19]) for r in rows]
    print_rows(cols, table, None if rows else "no skills in the library yet" +
                (f" for domain {args.domain!r}" if args.domain else ""), args.json)
    return 0


def library_query(args) -> int:
    from controller.read_commands import print_rows
    from store.library_query import run_library_query
    from store.query import QueryError
    from store.readonly import each_read

    try:
        statements = each_read(args.sql)
        for i, sql in enumerate(statements):  # each statement's result in turn, as `atoll query DIR` prints them
            cols, rows, note = run_library_query(_library(), sql)
            print_rows(cols, rows, note if i == len(statements) - 1 else None, args.json)
    except (QueryError, LibraryError) as exc:
        raise UserError(str(exc)) from None
    return 0
