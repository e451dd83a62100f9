"""Read-only SQL across runs: the library, and every archive it knows, attached read-only.

`atoll query --library "SQL"` sees the library's tables (`runs`, `elites`, `skills`,
`skill_efficacy`, `skill_uses`, `skill_sightings`, `prompt_variants`,
`prompt_variant_success`) and views over every known run's archive: `all_programs`,
`all_evaluations`, `all_lineage`, `all_events` (each with `run_dir`) and `best_per_run`.
A live run's archive is locked by the process holding it, so that process is asked for
the tables' rows (`store/live.py`, as committed at that moment) and they are loaded here
(with a note); a run whose archive is gone is skipped (with a note).

The same rules as `atoll query` (store/query.py): only reading statements are run, every
database is attached read-only, and once the views exist the connection can reach no
other file and its settings are locked.
"""
from __future__ import annotations

from pathlib import Path

import duckdb
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from store import live
from store.duckdb_archive import migrations as archive_migrations
from store.library import Library, is_lock_error
from store.library import migrations as library_migrations
from store.query import ARCHIVE
from store.readonly import QueryError, explained, first_line, reads

LIBRARY_VIEWS = ("runs", "elites", "skills", "skill_efficacy", "skill_uses", "skill_sightings",
                 "prompt_variants", "prompt_variant_success")
ARCHIVE_TABLES = {"all_programs": "programs", "all_evaluations": "evaluations", "all_lineage": "lineage",
                  "all_events": "events"}
_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
_BEST = """
CREATE TEMP VIEW best_per_run AS
SELECT p.run_id, p.run_dir, p.program_id, p.mutator, s.score AS search_score, h.score AS heldout_score,
       (SELECT count(*) FROM all_evaluations c JOIN all_programs q USING (program_id)
        WHERE c.run_id = p.run_id AND c.split = 'search' AND q.mutator NOT LIKE 'baseline:%') AS evaluations
FROM all_programs p
JOIN all_evaluations s ON s.program_id = p.program_id AND s.split = 'search'
LEFT JOIN all_evaluations h ON h.program_id = p.program_id AND h.split = 'heldout'
LEFT JOIN (SELECT DISTINCT program_id FROM all_evaluations WHERE split = 'validation' AND status <> 'OK') f
       ON f.program_id = p.program_id
WHERE s.status = 'OK' AND p.mutator NOT LIKE 'baseline:%'
QUALIFY row_number() OVER (PARTITION BY p.run_id
                           ORDER BY f.program_id IS NOT NULL, s.score DESC, length(p.code), p.seq) = 1
"""
# best_per_run: the program `atoll best` and the report crown (controller/crowning.py): the best search score
# whose validation did not fail (one whose validation failed only where every program's did)


def _retrying(seconds: float) -> Retrying:
    return Retrying(retry=retry_if_exception(is_lock_error), reraise=True, stop=stop_after_delay(seconds),
                    wait=wait_random_exponential(multiplier=0.05, max=1.0))


def connect_library(library: Library, busy_s: float = 30.0) -> tuple[duckdb.DuckDBPyConnection, list[str]]:
    """An in-memory connection with the library and every known archive attached read-only,
    the cross-run views made, and then locked down; returns it and the notes."""
    there = library.path.exists()  # a missing library is read as empty, never created
    if there:
        library.read(lambda con: None)  # one clear error if damaged or newer
    con = duckdb.connect(":memory:", config=_CONFIG)
    try:
        if there:
            for attempt in _retrying(busy_s):
                with attempt:
                    con.execute("ATTACH ? AS library (READ_ONLY)", [str(library.path)])
        else:
            con.execute("ATTACH ':memory:' AS library")
            _tables(con, "library", library_migrations)
        con.execute("CREATE SCHEMA blank")  # empty copies of the archive's tables: the views have every column
        _tables(con, "memory.blank", archive_migrations)  # with no run at all
        for name in LIBRARY_VIEWS:
            con.execute(f"CREATE TEMP VIEW {name} AS SELECT * FROM library.{name}")
        run_dirs = [d for (d,) in con.execute("SELECT DISTINCT run_dir FROM library.runs ORDER BY 1").fetchall()]
        notes = _attach_archives(con, run_dirs)
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except duckdb.Error as exc:
        con.close()
        raise QueryError(f"cannot read the library {library.path}: {first_line(exc)}") from None
    return con, notes


def _attach_archives(con, run_dirs: list[str]) -> list[str]:
    """Attach each run's archive (or load a live run's tables) and make the all_* views."""
    parts: dict[str, list[str]] = {view: [f"SELECT NULL::VARCHAR AS run_dir, * FROM blank.{table}"]
                                   for view, table in ARCHIVE_TABLES.items()}
    notes, gone = [], []
    for i, run_dir in enumerate(run_dirs):
        if not holds_archive(run_dir):  # a run directory deleted or moved since
            gone.append(run_dir)
            continue
        alias, note = f"run_{i}", None
        attached, note = _attach_one(con, alias, Path(run_dir))
        if note:
            notes.append(note)
        if attached:
            quoted = run_dir.replace("'", "''")
            for view, table in ARCHIVE_TABLES.items():
                parts[view].append(f"SELECT '{quoted}' AS run_dir, * FROM {alias}.{table}")
    for view, selects in parts.items():
        con.execute(f"CREATE TEMP VIEW {view} AS " + " UNION ALL BY NAME ".join(selects))
    con.execute(_BEST)
    if gone:  # one note, however many: a library kept for months names hundreds
        shown = ", ".join(gone[:3]) + (f" and {len(gone) - 3} more" if len(gone) > 3 else "")
        notes.insert(0, f"skipped {len(gone)} run(s) whose {ARCHIVE} is no longer there: {shown}")
    return notes


def holds_archive(run_dir: str) -> bool:
    """Whether the run directory the library names still holds its archive."""
    try:
        return (Path(run_dir) / ARCHIVE).is_file()
    except OSError:  # a folder above it this user may not search
        return False


def _attach_one(con, alias: str, run_dir: Path) -> tuple[bool, str | None]:
    archive = run_dir / ARCHIVE
    try:
        con.execute(f"ATTACH ? AS {alias} (READ_ONLY)", [str(archive)])
        return True, None
    except duckdb.Error as exc:
        if not is_lock_error(exc):
            return False, f"skipped {run_dir}: {first_line(exc)}"
    try:
        _load_live(con, alias, run_dir)
    except (live.NotServed, QueryError, OSError) as exc:
        return False, f"skipped {run_dir}: a process holds it and did not answer ({first_line(exc)})"
    return True, f"{run_dir}: live run, its tables as the process holding it answered"


def _load_live(con, alias: str, run_dir: Path) -> None:
    """A live run's tables, asked of the process holding its archive, as tables of schema `alias`."""
    con.execute(f"CREATE SCHEMA {alias}")
    for table in ARCHIVE_TABLES.values():
        _, rows, _ = live.ask_arrow(run_dir, f"SELECT * FROM {table}")
        con.register("live_rows", rows)
        try:
            con.execute(f"CREATE TABLE {alias}.{table} AS SELECT * FROM live_rows")
        finally:
            con.unregister("live_rows")


def _tables(con, where: str, migrations) -> None:
    """The empty tables `migrations` make, made in `where` (a database or schema), then back to memory.main."""
    con.execute(f"USE {where}")
    for _, _, sql in migrations():
        con.execute(sql)
    con.execute("USE memory.main")


def run_library_query(library: Library, sql: str) -> tuple[list[str], list[tuple], str | None]:
    """Run read-only `sql` across runs; returns the last statement's columns and rows, and a note."""
    statements = reads(sql)
    con, notes = connect_library(library)
    try:
        for statement in statements:
            cursor = con.execute(statement)
        if cursor.description is None:
            return [], [], "; ".join(notes) or None
        return [d[0] for d in cursor.description], cursor.fetchall(), "; ".join(notes) or None
    except duckdb.Error as exc:
        raise QueryError(explained(exc)) from None
    finally:
        con.close()
