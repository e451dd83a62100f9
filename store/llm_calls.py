"""The archive's LLM accounting: call rows, prompt parts stored once, and the reads that
budgets, the model bandit and failure memory rebuild from on a resume.

Functions over a `DuckDBArchive` (the driver's, read-write); each write is one transaction.
"""
from __future__ import annotations

import time

from store.arrow import pa
from store.columns import strings

CALL_COLUMNS = ("call_id", "run_id", "program_id", "model", "completion", "tokens_in", "tokens_out",
                "latency_s", "created_at", "island", "parent_id", "kind", "status", "error", "cost", "gpu_s",
                "attempts", "prompt_parts", "completion_truncated", "tokens_estimated", "reasoning")
_TYPES = {"tokens_in": pa.int32(), "tokens_out": pa.int32(), "island": pa.int32(), "attempts": pa.int32(),
          "latency_s": pa.float64(), "created_at": pa.float64(), "cost": pa.float64(), "gpu_s": pa.float64(),
          "prompt_parts": pa.list_(pa.string()), "completion_truncated": pa.bool_(),
          "tokens_estimated": pa.bool_()}


def record_calls(archive, rows: list[dict], parts: dict[str, str]) -> None:
    """Call rows (dicts keyed by CALL_COLUMNS) and the prompt parts not stored yet, in one transaction."""
    if rows:
        archive._transaction(lambda: insert_calls(archive, rows, parts))


def insert_calls(archive, rows: list[dict], parts: dict[str, str]) -> None:
    """What `record_calls` writes, inside the caller's transaction (e.g. the driver's commit)."""
    if parts:
        known = {r[0] for r in archive.con.execute(
            "SELECT part_id FROM llm_prompt_parts WHERE part_id IN (SELECT unnest(?))", [list(parts)]).fetchall()}
        fresh = {k: v for k, v in parts.items() if k not in known}
        if fresh:
            archive._insert("llm_prompt_parts", pa.table({"part_id": strings(list(fresh)),
                                                          "text": strings(list(fresh.values()))}))
    columns = {c: pa.array([r.get(c) for r in rows], _TYPES.get(c, pa.string())) for c in CALL_COLUMNS}
    archive._insert("llm_calls", pa.table(columns))


def usage(archive, run_id: str) -> dict[str, dict]:
    """Per model: calls, tokens, cost, GPU-seconds, edit calls and improvements so far in the run.

    An improvement is an edit call whose child evaluated OK above its parent's search score.
    """
    rows = archive.con.execute(
        "SELECT c.model, count(*), coalesce(sum(c.tokens_in + c.tokens_out), 0), coalesce(sum(c.cost), 0), "
        "coalesce(sum(c.gpu_s), 0), count(*) FILTER (WHERE c.kind = 'edit'), "
        "count(*) FILTER (WHERE c.kind = 'edit' AND e.status = 'OK' AND (pe.score IS NULL OR e.score > pe.score)) "
        "FROM llm_calls c "
        "LEFT JOIN evaluations e ON e.program_id = c.program_id AND e.split = 'search' "
        "LEFT JOIN evaluations pe ON pe.program_id = c.parent_id AND pe.split = 'search' AND pe.status = 'OK' "
        "WHERE c.run_id = ? GROUP BY c.model", [run_id]).fetchall()
    keys = ("calls", "tokens", "cost", "gpu_s", "edits", "improvements")
    return {model: dict(zip(keys, (int(a), int(b), float(c), float(d), int(e), int(f))))
            for model, a, b, c, d, e, f in rows}


def recent_failures(archive, run_id: str, per_parent: int) -> dict[str, list[tuple[str, str]]]:
    """Parent id -> its children's failed search evaluations (status, reason), oldest first, the
    last `per_parent` of each: what the next prompt on that parent lists."""
    rows = archive.con.execute(
        "SELECT l.parent_id, e.status, e.error FROM lineage l "
        "JOIN evaluations e ON e.program_id = l.child_id AND e.split = 'search' "
        "JOIN programs p ON p.program_id = l.child_id "
        "WHERE l.run_id = ? AND e.status <> 'OK' ORDER BY p.seq", [run_id]).fetchall()
    found: dict[str, list] = {}
    for parent, status, error in rows:
        found.setdefault(parent, []).append((status, error or ""))
    return {parent: items[-per_parent:] for parent, items in found.items()}


def now() -> float:
    return time.time()
