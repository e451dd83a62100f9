"""Warm starts: which earlier runs' elites and skills a new run starts from.

Elites are chosen by search score only, so the held-out split stays unseen. The plan is
decided once, when the run starts, and logged in the run's archive (event
"warm-start-plan"), so a resumed run keeps it and the run records what it started from.
"""
from __future__ import annotations

import json

from store import library_records as records


class WarmStartError(Exception):
    """memory.warm_from names something the library cannot use: one line for the user."""


def plan_warm_start(con, config, fingerprint: str) -> dict:
    """{runs, elites, skills}: the source runs ('library' for the whole library), the elites to
    evaluate first (best search score first) and the ids of the skills to replay. Runs on the same
    data that an older library keyed by its path are given `fingerprint` first."""
    from controller.fingerprint import rekey_path_keyed
    from controller.memory import domain_name

    memory, domain = config.memory, domain_name(config)
    run_ids = _source_runs(con, memory.warm_from, domain) if memory.warm_from else None
    if run_ids is None:
        rekey_path_keyed(con, config.domain, fingerprint)
    elites = records.elites(con, fingerprint=fingerprint, run_ids=run_ids, limit=memory.warm_elites)
    skills = records.skills(con, domain, run_ids=run_ids)
    return {"runs": run_ids if run_ids is not None else "library", "fingerprint": fingerprint,
            "elites": [{k: e[k] for k in ("run_id", "program_id", "search_score", "code")} for e in elites],
            "skills": [s["skill_id"] for s in skills]}


def _source_runs(con, refs: list[str], domain: str) -> list[str]:
    from pathlib import Path

    found = records.find_runs(con, list(refs) + [str(Path(r).resolve()) for r in refs])
    run_ids = []
    for ref in refs:
        run = found.get(ref) or found.get(str(Path(ref).resolve()))
        if run is None:
            raise WarmStartError(f"memory.warm_from: the library knows no run {ref!r} (`atoll runs` lists them)")
        if run["domain"] != domain:
            raise WarmStartError(f"memory.warm_from: run {ref!r} searched domain {run['domain']!r}, not {domain!r}")
        run_ids.append(run["run_id"])
    return list(dict.fromkeys(run_ids))


def stored_plan(archive, run_id: str) -> dict | None:
    """The plan this run logged when it started, if any."""
    rows = archive.con.execute("SELECT data FROM events WHERE run_id = ? AND kind = 'warm-start-plan' "
                               "ORDER BY ts LIMIT 1", [run_id]).fetchall()
    return json.loads(rows[0][0]) if rows else None
