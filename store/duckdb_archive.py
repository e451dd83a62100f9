"""The run archive: one DuckDB file per run directory, written by the driver only.

Every write is one transaction over a whole batch, inserted through Arrow tables
(never row by row), so a crash leaves either the whole batch or none of it. The
schema is a sequence of versioned SQL files in `store/schema/`; opening an
archive for writing applies the missing ones and records them in
`schema_version`.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import duckdb
import pyarrow as pa

from store.records import Candidate, EvalResult

SCHEMA_DIR = Path(__file__).with_name("schema")


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every schema file, in order."""
    found = []
    for path in sorted(SCHEMA_DIR.glob("[0-9][0-9][0-9]_*.sql")):
        found.append((int(path.name[:3]), path.name, path.read_text()))
    return found


def _json(value) -> str:
    return json.dumps(value, default=_jsonable, allow_nan=False)


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "value"):
        return value.value
    return str(value)


def _finite(values) -> list[float | None]:
    return [float(v) if v is not None and math.isfinite(float(v)) else None for v in values]


def _clean(obj):
    """Replace non-finite floats (not valid JSON) with None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _clean(obj.tolist())
    return obj


_FLOATS = pa.list_(pa.float64())


class DuckDBArchive:
    """A run directory's archive. Open read-write in the driver only.

    What callers may rely on:
    - Each write method is one transaction: the whole batch lands, or none of it.
    - A program is stored once: recording a stored program id again keeps the first
      row (and its `seq`). An evaluation is kept per (program, split), and a later
      one for the same key replaces it (INSERT OR REPLACE): the latest measurement wins.
    - What the reads return (dicts, tuples, bytes) is a copy, detached from the file.
    - One connection, no lock of its own: use an archive from one thread at a time.
    """

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        self.con = duckdb.connect(str(self.path), read_only=read_only)
        if not read_only:
            self.migrate()

    def __enter__(self) -> "DuckDBArchive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None

    # --- schema ---------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Apply the schema files not yet recorded; returns the versions applied."""
        self.con.execute("CREATE TABLE IF NOT EXISTS schema_version "
                         "(version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
        done = {v for (v,) in self.con.execute("SELECT version FROM schema_version").fetchall()}
        applied = []
        for version, name, sql in migrations():
            if version in done:
                continue
            self.con.execute("BEGIN")
            try:
                self.con.execute(sql)
                self.con.execute("INSERT INTO schema_version VALUES (?, ?, now())", [version, name])
                self.con.execute("COMMIT")
            except Exception:
                self.con.execute("ROLLBACK")
                raise
            applied.append(version)
        return applied

    def schema_versions(self) -> list[int]:
        return [v for (v,) in self.con.execute("SELECT version FROM schema_version ORDER BY version").fetchall()]

    # --- runs -----------------------------------------------------------------
    def create_run(self, run_id: str, config: dict, toml_text: str = "") -> None:
        name = (config.get("run") or {}).get("name")
        self.con.execute("INSERT INTO runs (run_id, name, status, started_at, ended_at, config, toml) "
                         "VALUES (?, ?, 'created', now(), NULL, ?, ?)",
                         [run_id, name, _json(config), toml_text])

    def record_protections(self, run_id: str, held: list[str]) -> None:
        """Store the sandbox protections in force; a resumed run keeps those that held in every segment."""
        self.con.execute("UPDATE runs SET protections = CASE WHEN protections IS NULL THEN ?::VARCHAR[] "
                         "ELSE list_filter(?::VARCHAR[], lambda p: list_contains(protections, p)) END "
                         "WHERE run_id = ?", [list(held), list(held), run_id])

    def set_run_status(self, run_id: str, status: str, ended: bool = False) -> None:
        self.con.execute("UPDATE runs SET status = ?, ended_at = CASE WHEN ? THEN now() ELSE NULL END "
                         "WHERE run_id = ?", [status, ended, run_id])

    def get_run(self, run_id: str) -> dict | None:
        row = self.con.execute("SELECT run_id, name, status, started_at, ended_at, config, toml FROM runs "
                               "WHERE run_id = ?", [run_id]).fetchall()
        row = row[0] if row else None
        if row is None:
            return None
        keys = ("run_id", "name", "status", "started_at", "ended_at", "config", "toml")
        run = dict(zip(keys, row))
        run["config"] = json.loads(run["config"])
        return run

    def save_secrets(self, run_id: str, record: dict) -> None:
        """The run's secrets (`RunSecrets.to_record()`), written once when the run is created."""
        self.con.execute("INSERT INTO run_secrets VALUES (?, ?, ?, ?, ?, now())",
                         [run_id, record["search"], record["validation"], record["heldout"],
                          bool(record["replayable"])])

    def load_secrets(self, run_id: str) -> dict | None:
        """The run's secrets as stored (`RunSecrets.from_record` takes it), or None for a run without."""
        row = self.con.execute("SELECT search, validation, heldout, replayable FROM run_secrets WHERE run_id = ?",
                               [run_id]).fetchall()
        return dict(zip(("search", "validation", "heldout", "replayable"), row[0])) if row else None

    def latest_run_id(self) -> str | None:
        row = self.con.execute("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1").fetchall()
        return row[0][0] if row else None

    # --- writes (one transaction per batch) -----------------------------------------
    def record(self, pairs: list[tuple[Candidate, EvalResult]]) -> None:
        """Programs (new ones), their lineage edges and evaluations, in one transaction."""
        if not pairs:
            return
        self._transaction(lambda: self._insert_pairs(pairs))

    def record_evaluations(self, results: list[EvalResult], run_id: str) -> None:
        """Evaluations of programs already stored (e.g. held-out scores), in one transaction."""
        if results:
            self._transaction(lambda: self._insert_evaluations(results, run_id))

    def log_events(self, run_id: str, events: list[tuple[str, dict]]) -> None:
        if not events:
            return
        now = time.time()
        table = pa.table({"run_id": [run_id] * len(events), "ts": [now] * len(events),
                          "kind": [kind for kind, _ in events],
                          "data": [_json(_clean(data)) for _, data in events]})
        self._transaction(lambda: self._insert("events", table))

    def save_snapshot(self, run_id: str, data: bytes) -> None:
        def write():
            self.con.execute("DELETE FROM snapshots WHERE run_id = ?", [run_id])
            self.con.execute("INSERT INTO snapshots VALUES (?, ?, ?)", [run_id, time.time(), data])
        self._transaction(write)

    def load_snapshot(self, run_id: str) -> bytes | None:
        row = self.con.execute("SELECT data FROM snapshots WHERE run_id = ? ORDER BY saved_at DESC LIMIT 1",
                               [run_id]).fetchall()
        return bytes(row[0][0]) if row else None

    def _transaction(self, work) -> None:
        self.con.execute("BEGIN")
        try:
            work()
            self.con.execute("COMMIT")
        except BaseException:
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error:  # a COMMIT that failed (e.g. no space left) already ended the transaction
                pass
            raise

    def _insert(self, table_name: str, table: pa.Table, verb: str = "INSERT") -> None:
        self.con.register("_batch", table)
        try:
            self.con.execute(f"{verb} INTO {table_name} BY NAME SELECT * FROM _batch")
        finally:
            self.con.unregister("_batch")

    def _insert_pairs(self, pairs: list[tuple[Candidate, EvalResult]]) -> None:
        known = self._existing_ids([c.program_id for c, _ in pairs])
        fresh, seen = [], set(known)
        for candidate, _ in pairs:
            if candidate.program_id not in seen:
                seen.add(candidate.program_id)
                fresh.append(candidate)
        if fresh:
            start = self.con.execute("SELECT coalesce(max(seq), 0) FROM programs").fetchall()[0][0] + 1
            self._insert("programs", pa.table({
                "program_id": [c.program_id for c in fresh], "run_id": [c.run_id for c in fresh],
                "island": pa.array([c.island for c in fresh], pa.int32()),
                "generation": pa.array([c.generation for c in fresh], pa.int32()),
                "parent_ids": pa.array([list(c.parent_ids) for c in fresh], pa.list_(pa.string())),
                "code": [c.code for c in fresh], "code_hash": [c.code_hash for c in fresh],
                "mutator": [c.mutator for c in fresh], "created_at": [float(c.created_at) for c in fresh],
                "seq": pa.array(range(start, start + len(fresh)), pa.int64())}))
            edges = [(c.program_id, p, c.run_id) for c in fresh for p in dict.fromkeys(c.parent_ids)]
            if edges:
                self._insert("lineage", pa.table({"child_id": [e[0] for e in edges],
                                                  "parent_id": [e[1] for e in edges],
                                                  "run_id": [e[2] for e in edges]}))
        by_run: dict[str, list[EvalResult]] = {}
        for candidate, result in pairs:
            by_run.setdefault(candidate.run_id, []).append(result)
        for run_id, results in by_run.items():
            self._insert_evaluations(results, run_id)

    def _existing_ids(self, ids: list[str]) -> set[str]:
        rows = self.con.execute("SELECT program_id FROM programs WHERE program_id IN (SELECT unnest(?))",
                                [ids]).fetchall()
        return {r[0] for r in rows}

    def _insert_evaluations(self, results: list[EvalResult], run_id: str) -> None:
        now = time.time()
        score = [None if r.score is None or not math.isfinite(r.score) else float(r.score) for r in results]
        self._insert("evaluations", pa.table({
            "program_id": [r.program_id for r in results], "run_id": [run_id] * len(results),
            "split": [r.split for r in results], "status": [r.status.value for r in results],
            "score": pa.array(score, pa.float64()),
            "metrics": [_json(_clean(r.metrics)) for r in results],
            "instance_scores": pa.array([_finite(r.instance_scores) for r in results], _FLOATS),
            "descriptors": pa.array([_finite(r.descriptors) for r in results], _FLOATS),
            "error": pa.array([r.error for r in results], pa.string()),
            "duration_s": pa.array([float(r.duration_s) for r in results], pa.float64()),
            "created_at": [now] * len(results)}), verb="INSERT OR REPLACE")

    # --- reads ------------------------------------------------------------------
    def count_evaluations(self, run_id: str, split: str = "search") -> int:
        return self.con.execute("SELECT count(*) FROM evaluations e JOIN programs p USING (program_id) "
                                "WHERE e.run_id = ? AND e.split = ? AND p.mutator NOT LIKE 'baseline:%'",
                                [run_id, split]).fetchall()[0][0]

    def known_hashes(self, run_id: str) -> set[str]:
        """Hashes of every program text of the run: as stored, and as proposed before tuning
        rewrote its PARAMS (kept in the evaluation's metrics as `proposed_hash`)."""
        rows = self.con.execute(
            "SELECT code_hash FROM programs WHERE run_id = ? UNION "
            "SELECT json_extract_string(metrics, '$.proposed_hash') FROM evaluations "
            "WHERE run_id = ? AND json_extract_string(metrics, '$.proposed_hash') IS NOT NULL",
            [run_id, run_id]).fetchall()
        return {h for (h,) in rows}

    def programs_with_scores(self, run_id: str, split: str = "search") -> list[dict]:
        """Programs evaluated on `split`, in commit order (baselines excluded)."""
        rows = self.con.execute(
            "SELECT p.program_id, p.island, p.generation, p.code, p.mutator, e.status, e.score, "
            "e.instance_scores, e.descriptors FROM programs p JOIN evaluations e "
            "ON e.program_id = p.program_id AND e.split = ? "
            "WHERE p.run_id = ? AND p.mutator NOT LIKE 'baseline:%' ORDER BY p.seq", [split, run_id]).fetchall()
        keys = ("program_id", "island", "generation", "code", "mutator", "status", "score",
                "instance_scores", "descriptors")
        out = []
        for row in rows:
            item = dict(zip(keys, row))
            item["instance_scores"] = tuple(item["instance_scores"] or ())
            item["descriptors"] = tuple(item["descriptors"] or ())
            out.append(item)
        return out

    def best_program(self, run_id: str, split: str = "search") -> dict | None:
        row = self.con.execute(
            "SELECT p.program_id, p.code, e.score, p.island, p.generation FROM programs p JOIN evaluations e "
            "ON e.program_id = p.program_id AND e.split = ? WHERE p.run_id = ? AND e.status = 'OK' "
            "AND p.mutator NOT LIKE 'baseline:%' ORDER BY e.score DESC, length(p.code), p.seq LIMIT 1",
            [split, run_id]).fetchall()
        return dict(zip(("program_id", "code", "score", "island", "generation"), row[0])) if row else None

    def evaluation(self, program_id: str, split: str) -> dict | None:
        row = self.con.execute(
            "SELECT program_id, status, score, metrics, instance_scores, descriptors, error, duration_s "
            "FROM evaluations WHERE program_id = ? AND split = ?", [program_id, split]).fetchall()
        if not row:
            return None
        row = row[0]
        keys = ("program_id", "status", "score", "metrics", "instance_scores", "descriptors", "error", "duration_s")
        item = dict(zip(keys, row))
        item["metrics"] = json.loads(item["metrics"]) if item["metrics"] else {}
        item["instance_scores"] = tuple(item["instance_scores"] or ())
        item["descriptors"] = tuple(item["descriptors"] or ())
        return item

    def operator_stats(self, run_id: str) -> dict[str, tuple[int, int]]:
        rows = self.con.execute("SELECT mutator, attempts, improvements FROM mutator_success WHERE run_id = ?",
                                [run_id]).fetchall()
        return {m: (int(a), int(i)) for m, a, i in rows}

    # --- live readers ---------------------------------------------------------------
    def publish_snapshot(self, dest: str | Path) -> float:
        """Atomically replace `dest` with a consistent copy of the archive; returns seconds taken.

        The driver is the only writer and is single-threaded, so after a
        checkpoint the file is complete and nothing writes while it is copied.
        The copy runs in a child process: DuckDB's lock is a POSIX record lock,
        which this process would drop the moment it closed any descriptor of
        the file, letting a second writer in.
        """
        start = time.perf_counter()
        dest = Path(dest)
        self.con.execute("CHECKPOINT")
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        try:
            subprocess.run(["cp", "--", str(self.path), str(tmp)], check=True, stdin=subprocess.DEVNULL,
                           capture_output=True)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return time.perf_counter() - start
