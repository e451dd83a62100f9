"""What runs write to and read from the library: functions over one open connection.

Each takes the connection `Library.transaction` hands its work, so a caller groups
several of them into one short transaction. Writes are idempotent (keyed by run and
program), so a run may send the same rows again after a busy library or a resume, and
two runs writing at once never overwrite each other's rows. Reads return plain dicts.
"""
from __future__ import annotations

import json

from store.arrow import pa
from store.columns import strings

_KEYS = {"skill_uses": "run_id, program_id", "prompt_variant_uses": "run_id, program_id"}  # their primary keys


def _json(value) -> str:
    return json.dumps(value, default=str)


def _dicts(cursor) -> list[dict]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row)) for row in cursor.fetchall()]


# --- the catalog of runs ---------------------------------------------------------------------

def upsert_run(con, run: dict) -> None:
    """Add the run, or update its status, evaluations and best score (its start and its
    warm start are kept from the first write)."""
    con.execute(
        "INSERT INTO runs VALUES ($run_id, $run_dir, $domain, $fingerprint, $config, $status, $evaluations, "
        "$best, $warm_start, now(), now()) ON CONFLICT (run_id) DO UPDATE SET status = excluded.status, "
        "evaluations = excluded.evaluations, best_search_score = excluded.best_search_score, "
        "run_dir = excluded.run_dir, warm_start = coalesce(runs.warm_start, excluded.warm_start), "
        "updated_at = now()",
        {"run_id": run["run_id"], "run_dir": run["run_dir"], "domain": run["domain"],
         "fingerprint": run["fingerprint"], "config": _json(run["config"]), "status": run["status"],
         "evaluations": int(run.get("evaluations", 0)), "best": run.get("best_search_score"),
         "warm_start": _json(run["warm_start"]) if run.get("warm_start") else None})


def run_dir_of(con, run_id: str) -> str | None:
    """The directory the catalog knows the run at (None for a run it does not know)."""
    row = con.execute("SELECT run_dir FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return row[0] if row else None


def runs(con, domain: str | None = None) -> list[dict]:
    return _dicts(con.execute(
        "SELECT run_id, run_dir, domain, fingerprint, status, evaluations, best_search_score, warm_start, "
        "started_at, updated_at FROM runs WHERE $domain IS NULL OR domain = $domain ORDER BY started_at",
        {"domain": domain}))


def find_runs(con, refs: list[str]) -> dict[str, dict]:
    """ref -> run, for refs that are run ids or run directories (absolute or as given)."""
    found = {}
    for ref in refs:
        rows = _dicts(con.execute("SELECT run_id, run_dir, domain, fingerprint FROM runs "
                                  "WHERE run_id = $ref OR run_dir = $ref ORDER BY started_at DESC", {"ref": ref}))
        if rows:
            found[ref] = rows[0]
    return found


def runs_holding(con, domain: str, text: str, other_than: str) -> list[dict]:
    """The runs of `domain` whose stored config holds `text` (a data option's sha256) and whose
    fingerprint is not `other_than`, each with its config (controller.fingerprint.rekey_path_keyed)."""
    rows = _dicts(con.execute(
        "SELECT run_id, fingerprint, config FROM runs WHERE domain = $domain AND fingerprint <> $key "
        "AND contains(CAST(config AS VARCHAR), $text)", {"domain": domain, "key": other_than, "text": text}))
    for row in rows:
        row["config"] = json.loads(row["config"])
    return rows


def rekey_run(con, run_id: str, fingerprint: str) -> None:
    """The run's catalog row, its elites and the skills it learned first, under `fingerprint`."""
    for table in ("runs", "elites", "skills"):
        con.execute(f"UPDATE {table} SET fingerprint = ? WHERE run_id = ?", [fingerprint, run_id])


# --- elites ----------------------------------------------------------------------------------

def replace_elites(con, run_id: str, elites: list[dict]) -> None:
    """The run's elites (its best programs by search score), replacing any it sent before."""
    con.execute("DELETE FROM elites WHERE run_id = ?", [run_id])
    for rank, e in enumerate(elites, 1):
        con.execute("INSERT INTO elites VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [run_id, e["program_id"], e["domain"], e["fingerprint"], rank, e["search_score"],
                     e["code"], e["code_hash"]])


def elites(con, *, fingerprint: str | None = None, run_ids: list[str] | None = None, limit: int = 4) -> list[dict]:
    """The best elites (distinct programs, by search score) of the given runs, or of every
    run with this fingerprint."""
    return _dicts(con.execute(
        "SELECT run_id, program_id, search_score, code, code_hash FROM elites "
        "WHERE ($runs IS NULL AND fingerprint = $fp) OR list_contains($runs, run_id) "
        "QUALIFY row_number() OVER (PARTITION BY code_hash ORDER BY search_score DESC) = 1 "
        "ORDER BY search_score DESC, length(code), run_id, program_id LIMIT $limit",
        {"fp": fingerprint, "runs": run_ids, "limit": limit}))


# --- skills ----------------------------------------------------------------------------------

def add_skills(con, learned: list[dict]) -> None:
    """Skills learned by a run: a new edit becomes a skill; every sighting is kept."""
    for s in learned:
        con.execute(
            "INSERT OR IGNORE INTO skills VALUES ($skill_id, $domain, $fingerprint, $title, $applies_when, $edit, "
            "$search_gain, $validation_gain, $parent_code, $child_code, $abstraction, $run_id, now(), NULL)",
            {**{k: s[k] for k in ("skill_id", "domain", "fingerprint", "title", "applies_when", "search_gain",
                                  "validation_gain", "parent_code", "child_code", "run_id")},
             "edit": _json(s["edit"]), "abstraction": s.get("abstraction") or None})
        con.execute("INSERT OR IGNORE INTO skill_sightings VALUES (?, ?, ?, ?, ?, ?, now())",
                    [s["skill_id"], s["run_id"], s["parent_id"], s["child_id"], s["search_gain"],
                     s["validation_gain"]])


def add_skill_uses(con, uses: list[dict]) -> None:
    _insert_new(con, "skill_uses", {
        "run_id": strings([u["run_id"] for u in uses]),
        "program_id": strings([u["program_id"] for u in uses]),
        "skill_id": strings([u["skill_id"] for u in uses]),
        "parent_id": strings([u["parent_id"] for u in uses]),
        "status": strings([u["status"] for u in uses]),
        "success": pa.array([bool(u["success"]) for u in uses], pa.bool_()),
        "gain": pa.array([u.get("gain") for u in uses], pa.float64())})


def skills(con, domain: str | None = None, *, run_ids: list[str] | None = None,
           retired: bool = False) -> list[dict]:
    """Skills with their efficacy counts; `run_ids` keeps those learned in any of these runs."""
    rows = _dicts(con.execute(
        "SELECT e.*, s.edit, s.parent_code, s.child_code, s.abstraction, s.fingerprint "
        "FROM skill_efficacy e JOIN skills s USING (skill_id) "
        "WHERE ($domain IS NULL OR e.domain = $domain) AND ($retired OR e.retired_at IS NULL) "
        "AND ($runs IS NULL OR EXISTS (SELECT 1 FROM skill_sightings k WHERE k.skill_id = e.skill_id "
        "AND list_contains($runs, k.run_id))) ORDER BY e.efficacy DESC, e.validation_gain DESC, e.skill_id",
        {"domain": domain, "runs": run_ids, "retired": retired}))
    for row in rows:
        row["edit"] = json.loads(row["edit"])
    return rows


def set_abstraction(con, skill_id: str, text: str) -> None:
    """An LLM's analysis, strategy and abstraction for a skill (workers.skills.abstract_skill)."""
    con.execute("UPDATE skills SET abstraction = ? WHERE skill_id = ?", [text, skill_id])


def retire_skill(con, skill_id: str) -> bool:
    """Mark a skill retired (kept, never retrieved again); False if there is no such skill."""
    found = con.execute("SELECT count(*) FROM skills WHERE skill_id = ?", [skill_id]).fetchall()[0][0]
    con.execute("UPDATE skills SET retired_at = coalesce(retired_at, now()) WHERE skill_id = ?", [skill_id])
    return bool(found)


# --- prompt variants -------------------------------------------------------------------------

def add_variant(con, variant: dict) -> None:
    con.execute("INSERT OR IGNORE INTO prompt_variants VALUES (?, ?, ?, ?, ?, now(), NULL)",
                [variant["variant_id"], variant["domain"], variant["text"], variant.get("parent_id"),
                 variant["origin"]])


def add_variant_uses(con, uses: list[dict]) -> None:
    _insert_new(con, "prompt_variant_uses", {
        "run_id": strings([u["run_id"] for u in uses]),
        "program_id": strings([u["program_id"] for u in uses]),
        "variant_id": strings([u["variant_id"] for u in uses]),
        "success": pa.array([bool(u["success"]) for u in uses], pa.bool_())})


def _insert_new(con, table: str, columns: dict) -> None:
    """Every row whose key `table` does not hold yet, in one statement (created now): a row per
    statement costs milliseconds in DuckDB, and a run sends thousands. The first of repeats wins."""
    batch = pa.table(columns)
    if not batch.num_rows:
        return
    names = ", ".join(columns)
    con.register("_new_rows", batch)
    try:
        con.execute(f"INSERT OR IGNORE INTO {table} ({names}, created_at) SELECT {names}, now() FROM "
                    f"(SELECT *, row_number() OVER () AS _at FROM _new_rows) QUALIFY row_number() OVER "
                    f"(PARTITION BY {_KEYS[table]} ORDER BY _at) = 1")
    finally:
        con.unregister("_new_rows")


def variants(con, domain: str, retired: bool = False) -> list[dict]:
    return _dicts(con.execute(
        "SELECT variant_id, domain, text, parent_id, origin, uses, successes, success_rate, retired_at "
        "FROM prompt_variant_success WHERE domain = $domain AND ($retired OR retired_at IS NULL) "
        "ORDER BY created_at, variant_id", {"domain": domain, "retired": retired}))


def retire_variant(con, variant_id: str) -> None:
    con.execute("UPDATE prompt_variants SET retired_at = coalesce(retired_at, now()) WHERE variant_id = ?",
                [variant_id])
