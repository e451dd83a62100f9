"""The archive's write path: batches of programs and evaluations into Arrow tables.

The writer keeps what a batch needs to know about every stored program in memory,
about 24 bytes a program (its id's hash, commit number and OK search score), plus
each island's best score and the next commit number, so a batch runs no query over
the stored rows: its cost does not grow with the archive. What it learns from a batch
is applied only once the batch's transaction has committed.

The common case is a batch of new programs with their evaluations. Recording a stored
program again (its first row is kept) or an evaluation of a stored program (it
replaces the one of the same split) takes a slower path that looks the rows up.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from store.hash_index import HashIndex, id_hash
from store.records import Candidate, EvalResult, Status

FOLD_EVERY = 10_000  # programs between folds of mutator_success's tail into its totals
_FLOATS = pa.list_(pa.float64())
_NAN = float("nan")


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "value"):
        return value.value
    return str(value)


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


_ENCODER = json.JSONEncoder(default=_jsonable, allow_nan=False)


def to_json(value) -> str:
    """JSON text; non-finite floats become null (they are not JSON), in a second pass only when present."""
    try:
        return _ENCODER.encode(value)
    except (ValueError, TypeError):
        return _ENCODER.encode(_clean(value))


def _finite(value) -> float | None:
    return float(value) if value is not None and math.isfinite(float(value)) else None


def _finite_lists(values: list) -> pa.Array:
    """Lists of floats as an Arrow column, non-finite values as nulls (vectorised)."""
    array = pa.array(values, _FLOATS)
    finite = pc.is_finite(array.values)
    if pc.all(finite).as_py() is False:
        array = pa.ListArray.from_arrays(array.offsets, pc.if_else(finite, array.values, None))
    return array


@dataclass
class _Batch:
    """A batch sorted out: new programs and where each evaluation goes."""

    fresh: dict[str, Candidate]  # program id -> candidate, first one wins
    evaluations: dict[tuple[str, str], tuple[EvalResult, str]]  # (program id, split) -> (result, run id)
    stored: dict[str, int] = field(default_factory=dict)  # stored program id -> its seq
    hashes: dict[str, int] = field(default_factory=dict)  # program id -> id_hash, for every id of the batch


class Writer:
    """Builds and inserts one batch inside the caller's transaction; see the module docstring."""

    def __init__(self, con):
        self.con = con
        keys, seqs, scores = self._column_arrays(
            "SELECT id_hash, seq, coalesce(CASE WHEN search_status = 'OK' THEN search_score END, 'NaN'::DOUBLE) "
            "FROM programs")
        self.index = HashIndex(keys, seqs, scores)
        self.island_best = self._island_bests()
        self.next_seq = con.execute("SELECT coalesce(max(seq), 0) + 1 FROM programs").fetchone()[0]
        self.folded = con.execute("SELECT coalesce(max(seq), 0) FROM mutator_counts_seq").fetchone()[0]

    def _column_arrays(self, sql: str) -> list[np.ndarray]:
        arrays = self.con.execute(sql).fetchnumpy()
        return [np.asarray(a) for a in arrays.values()]

    def _island_bests(self) -> dict[tuple[str, int], float]:
        rows = self.con.execute("SELECT run_id, island, max(best_so_far) FROM programs "
                                "WHERE best_so_far IS NOT NULL GROUP BY run_id, island").fetchall()
        return {(run, island): best for run, island, best in rows}

    # --- the batch ----------------------------------------------------------------
    def write(self, pairs: list[tuple[Candidate, EvalResult]], evaluations: list[tuple[EvalResult, str]]):
        """Insert the batch; returns a function to call once its transaction has committed."""
        batch = self._sort_out(pairs, evaluations)
        after = []
        if batch.fresh:
            after.append(self._insert_programs(batch))
        if batch.evaluations:
            after.append(self._insert_evaluations(batch))
        after.append(self._maybe_fold(self.next_seq - 1 + len(batch.fresh)))
        return lambda: [apply() for apply in after if apply]

    def _sort_out(self, pairs, evaluations) -> _Batch:
        candidates: dict[str, Candidate] = {}
        for candidate, _ in pairs:
            candidates.setdefault(candidate.program_id, candidate)
        items = [(r, c.run_id) for c, r in pairs] + list(evaluations)
        by_key = {(r.program_id, r.split): (r, run) for r, run in items}
        hashes = {pid: id_hash(pid) for pid in [*candidates, *(pid for pid, _ in by_key)]}
        stored = self._stored(hashes)
        unknown = [pid for pid, _ in by_key if pid not in stored and pid not in candidates]
        if unknown:
            raise ValueError(f"evaluations of programs that are not in the archive: {', '.join(unknown[:5])}")
        fresh = {pid: c for pid, c in candidates.items() if pid not in stored}
        return _Batch(fresh, by_key, stored, hashes)

    def _stored(self, hashes: dict[str, int]) -> dict[str, int]:
        """The ids among `hashes` that are stored, with their seq (a hash hit is checked in the table)."""
        hits = [pid for pid, found in zip(hashes, self.index.get_many(list(hashes.values()))) if found]
        if not hits:
            return {}
        rows = self.con.execute("SELECT program_id, seq FROM programs WHERE id_hash IN (SELECT unnest(?)) "
                                "AND program_id IN (SELECT unnest(?))", [[hashes[p] for p in hits], hits]).fetchall()
        return dict(rows)

    # --- new programs ---------------------------------------------------------------
    def _insert_programs(self, batch: _Batch):
        fresh = list(batch.fresh.values())
        seqs = {c.program_id: self.next_seq + i for i, c in enumerate(fresh)}
        search = [batch.evaluations.get((c.program_id, "search"), (None, None))[0] for c in fresh]
        scores = [_finite(r.score) if r is not None and r.status == Status.OK else None for r in search]
        parents = self._parents(fresh, seqs, scores, batch.hashes)
        bests, island_best = self._running_bests(fresh, scores)
        hashes = [batch.hashes[c.program_id] for c in fresh]
        self._insert("programs", pa.table({
            "program_id": [c.program_id for c in fresh], "run_id": [c.run_id for c in fresh],
            "island": pa.array([c.island for c in fresh], pa.int32()),
            "generation": pa.array([c.generation for c in fresh], pa.int32()),
            "parent_ids": pa.array([list(c.parent_ids) for c in fresh], pa.list_(pa.string())),
            "code": [c.code for c in fresh], "code_hash": [c.code_hash for c in fresh],
            "mutator": [c.mutator for c in fresh], "created_at": [float(c.created_at) for c in fresh],
            "seq": pa.array(seqs.values(), pa.int64()), "id_hash": pa.array(hashes, pa.uint64()),
            "proposed_hash": pa.array([r.metrics.get("proposed_hash") if r is not None else None for r in search],
                                      pa.string()),
            "search_status": pa.array([_status(r) if r is not None else None for r in search], pa.string()),
            "search_score": pa.array([_finite(r.score) if r is not None else None for r in search], pa.float64()),
            "parent_score": pa.array([best for best, _ in parents], pa.float64()),
            "best_so_far": pa.array(bests, pa.float64())}))
        edges = [(c.program_id, p, c.run_id, seqs[c.program_id], seq)
                 for c, (_, links) in zip(fresh, parents) for p, seq in links]
        if edges:
            self._insert("lineage", pa.table({
                "child_id": [e[0] for e in edges], "parent_id": [e[1] for e in edges], "run_id": [e[2] for e in edges],
                "child_seq": pa.array([e[3] for e in edges], pa.int64()),
                "parent_seq": pa.array([e[4] for e in edges], pa.int64())}))
        known = {h: (s, _NAN if score is None else score) for h, s, score in zip(hashes, seqs.values(), scores)}

        def apply():
            self.index.add_new(known)
            self.island_best.update(island_best)
            self.next_seq += len(fresh)
        return apply

    def _parents(self, fresh: list[Candidate], seqs: dict[str, int], scores: list[float | None],
                 hashes: dict[str, int]):
        """Per new program: (best OK search score of its parents, [(parent id, parent seq or None)])."""
        ids = list(dict.fromkeys(p for c in fresh for p in c.parent_ids))
        known = dict(zip(ids, self.index.get_many([hashes.get(p) or id_hash(p) for p in ids])))
        local = dict(zip(seqs, scores))
        out = []
        for c in fresh:
            links, best = [], None
            for p in dict.fromkeys(c.parent_ids):
                if p in local and seqs[p] < seqs[c.program_id]:
                    seq, score = seqs[p], local[p]
                elif known.get(p) is not None:
                    seq, score = known[p]
                    score = None if math.isnan(score) else score
                else:
                    seq, score = None, None
                links.append((p, seq))
                best = score if best is None or (score is not None and score > best) else best
            out.append((best, links))
        return out

    def _running_bests(self, fresh: list[Candidate], scores: list[float | None]):
        island_best, bests = {}, []
        for c, score in zip(fresh, scores):
            key = (c.run_id, c.island)
            if score is None or c.island < 0:
                bests.append(None)
                continue
            best = island_best.get(key, self.island_best.get(key))
            island_best[key] = score if best is None or score > best else best
            bests.append(island_best[key])
        return bests, island_best

    # --- evaluations ----------------------------------------------------------------
    def _insert_evaluations(self, batch: _Batch):
        items = list(batch.evaluations.values())
        stored = [(r, run) for r, run in items if r.program_id in batch.stored]
        for split in {r.split for r, _ in stored}:
            self.con.execute("DELETE FROM evaluations WHERE split = ? AND program_id IN (SELECT unnest(?))",
                             [split, [r.program_id for r, _ in stored if r.split == split]])
        now = time.time()
        self._insert("evaluations", pa.table({
            "program_id": [r.program_id for r, _ in items], "run_id": [run for _, run in items],
            "split": [r.split for r, _ in items], "status": [_status(r) for r, _ in items],
            "score": pa.array([_finite(r.score) for r, _ in items], pa.float64()),
            "metrics": [to_json(r.metrics) for r, _ in items],
            "instance_scores": _finite_lists([r.instance_scores for r, _ in items]),
            "descriptors": _finite_lists([r.descriptors for r, _ in items]),
            "error": pa.array([r.error for r, _ in items], pa.string()),
            "duration_s": pa.array([float(r.duration_s) for r, _ in items], pa.float64()),
            "node_id": pa.array([r.node_id for r, _ in items], pa.string()),
            "node_ip": pa.array([r.node_ip for r, _ in items], pa.string()),
            "created_at": [now] * len(items)}))
        researched = [r for r, _ in stored if r.split == "search"]
        return self._update_search(researched) if researched else None

    def _update_search(self, results: list[EvalResult]):
        """Stored programs got a new search evaluation: their row, island bests and totals follow."""
        table = pa.table({"program_id": [r.program_id for r in results],
                          "search_status": [_status(r) for r in results],
                          "search_score": pa.array([_finite(r.score) for r in results], pa.float64()),
                          "proposed_hash": pa.array([r.metrics.get("proposed_hash") for r in results], pa.string())})
        self.con.register("_search", table)
        try:
            rows = self.con.execute(
                "UPDATE programs SET search_status = s.search_status, search_score = s.search_score, "
                "proposed_hash = coalesce(s.proposed_hash, programs.proposed_hash) FROM _search s "
                "WHERE programs.program_id = s.program_id "
                "RETURNING programs.run_id, programs.island, programs.id_hash, programs.seq, "
                "CASE WHEN programs.search_status = 'OK' THEN programs.search_score END").fetchall()
        finally:
            with contextlib.suppress(duckdb.TransactionException):
                self.con.unregister("_search")
        for run_id, island in {(run, island) for run, island, *_ in rows}:
            self._recompute_bests(run_id, island)
        folded = self._fold(refold=True)

        def apply():
            for _, _, h, seq, score in rows:
                self.index.put(h, seq, _NAN if score is None else score)
            self.island_best = self._island_bests()
            self.folded = folded
        return apply

    def _recompute_bests(self, run_id: str, island: int) -> None:
        self.con.execute(
            "UPDATE programs SET best_so_far = w.best FROM (SELECT seq, CASE WHEN search_status = 'OK' AND island >= 0 "
            "AND search_score IS NOT NULL THEN max(search_score) FILTER (WHERE search_status = 'OK') OVER "
            "(ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) END AS best "
            "FROM programs WHERE run_id = ? AND island = ?) w "
            "WHERE programs.seq = w.seq AND programs.best_so_far IS DISTINCT FROM w.best", [run_id, island])

    # --- mutator_success totals -------------------------------------------------------
    def _maybe_fold(self, last_seq: int):
        """Fold the view's tail into its totals once it is FOLD_EVERY programs long."""
        if last_seq - self.folded < FOLD_EVERY:
            return None
        folded = self._fold()

        def apply():
            self.folded = folded
        return apply

    def _fold(self, refold: bool = False) -> int:
        """Write mutator_success's current figures as its totals; returns the seq they reach.

        `refold` recounts every program (a stored program's search score changed).
        """
        if refold:
            self.con.execute("UPDATE mutator_counts_seq SET seq = 0")
            self.con.execute("DELETE FROM mutator_counts")
        totals = self.con.execute("SELECT run_id, mutator, attempts, ok, improvements FROM mutator_success").fetchall()
        self.con.execute("DELETE FROM mutator_counts")
        if totals:
            self._insert("mutator_counts", pa.table({
                "run_id": [t[0] for t in totals], "mutator": [t[1] for t in totals],
                **{name: pa.array([t[i] for t in totals], pa.int64())
                   for i, name in ((2, "attempts"), (3, "ok"), (4, "improvements"))}}))
        last = self.con.execute("SELECT coalesce(max(seq), 0) FROM programs").fetchone()[0]
        self.con.execute("UPDATE mutator_counts_seq SET seq = ?", [last])
        return last

    def _insert(self, table_name: str, table: pa.Table) -> None:
        insert_arrow(self.con, table_name, table)


def insert_arrow(con, table_name: str, table: pa.Table) -> None:
    """Append an Arrow table to `table_name`, columns matched by name (the archive's one bulk insert)."""
    con.register("_batch", table)
    try:
        con.execute(f"INSERT INTO {table_name} BY NAME SELECT * FROM _batch")
    finally:
        with contextlib.suppress(duckdb.TransactionException):  # a failed statement aborted the transaction
            con.unregister("_batch")


def _status(result: EvalResult) -> str:
    """The status as stored; a value that is no Status is a caller's bug."""
    status = result.status
    return status.value if type(status) is Status else Status(status).value
