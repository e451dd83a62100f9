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
import math
import time
from dataclasses import dataclass, field

import duckdb
import numpy as np

from store.arrow import pa
from store.columns import finite_lists, floats, json_column, plain_floats, statuses, strings, to_json
from store.hash_index import HashIndex, id_hashes
from store.records import Candidate, EvalResult, Status

__all__ = ["FOLD_EVERY", "TableColumns", "Writer", "insert_arrow", "to_json"]
FOLD_EVERY = 10_000  # programs between folds of mutator_success's tail into its totals
_NAN = float("nan")
_STRINGS = pa.list_(pa.string())


@dataclass
class _Batch:
    """A batch sorted out, as columns: new programs and the evaluations to store."""

    fresh: list[Candidate]  # new programs, first of each id, in batch order
    items: list[tuple[EvalResult, str]]  # (result, run id), one per (program, split), the last one wins
    stored: dict[str, int] = field(default_factory=dict)  # stored program id -> its seq
    hashes: dict[str, int] = field(default_factory=dict)  # program id -> id_hash, for every id of the batch


class Writer:
    """Builds and inserts one batch inside the caller's transaction; see the module docstring."""

    def __init__(self, con, columns: TableColumns | None = None):
        self.con = con
        self.columns = columns or TableColumns(con)
        keys, seqs, scores = self._column_arrays(
            "SELECT id_hash, seq, coalesce(CASE WHEN search_status = 'OK' THEN search_score END, 'NaN'::DOUBLE) "
            "FROM programs")
        self.index = HashIndex(keys, seqs, scores)
        self.island_best = self._island_bests()
        self.next_seq = con.execute("SELECT coalesce(max(seq), 0) + 1 FROM programs").fetchone()[0]
        self.pending = 0
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
        self.pending = len(batch.fresh)  # programs this batch adds, once it commits
        after = []
        if batch.fresh:
            after.append(self._insert_programs(batch))
        if batch.items:
            after.append(self._insert_evaluations(batch))
        after.append(self._maybe_fold(self.next_seq - 1 + len(batch.fresh)))
        return lambda: [apply() for apply in after if apply]

    def _sort_out(self, pairs, evaluations) -> _Batch:
        candidates = _first_of_each([c for c, _ in pairs])
        items = [(r, c.run_id) for c, r in pairs] + list(evaluations)
        ids = [c.program_id for c in candidates]
        plain = not evaluations and len(candidates) == len(pairs) and ids == [r.program_id for _, r in pairs]
        items = items if plain else _last_of_each(items)  # plain: one result per new id, nothing else
        hashes = dict(zip(ids, id_hashes(ids)))
        others = [] if plain else list(dict.fromkeys(r.program_id for r, _ in items if r.program_id not in hashes))
        hashes.update(zip(others, id_hashes(others)))
        stored = self._stored(hashes)
        unknown = [pid for pid in others if pid not in stored]
        if unknown:
            raise ValueError(f"evaluations of programs that are not in the archive: {', '.join(unknown[:5])}")
        fresh = [c for c in candidates if c.program_id not in stored] if stored else candidates
        return _Batch(fresh, items, stored, hashes)

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
        fresh = batch.fresh
        ids = [c.program_id for c in fresh]
        seqs = list(range(self.next_seq, self.next_seq + len(fresh)))
        found = {r.program_id: r for r, _ in batch.items if r.split == "search"}
        search = [found.get(pid) for pid in ids]
        status = statuses([None if r is None else r.status for r in search], nullable=True)
        score = floats([None if r is None else r.score for r in search])
        ok = [s if st == "OK" else None for s, st in zip(score.to_pylist(), status)]
        parent_best, edges = self._parents(fresh, seqs, ok, batch.hashes)
        bests, island_best = self._running_bests(fresh, ok)
        hashes = [batch.hashes[pid] for pid in ids]
        self._insert("programs", pa.table({
            "program_id": strings(ids), "run_id": strings([c.run_id for c in fresh]),
            "island": pa.array([c.island for c in fresh], pa.int32()),
            "generation": pa.array([c.generation for c in fresh], pa.int32()),
            "parent_ids": pa.array([c.parent_ids for c in fresh], _STRINGS),
            "code": strings([c.code for c in fresh]), "code_hash": strings([c.code_hash for c in fresh]),
            "mutator": strings([c.mutator for c in fresh]), "created_at": plain_floats([c.created_at for c in fresh]),
            "seq": pa.array(seqs, pa.int64()), "id_hash": pa.array(hashes, pa.uint64()),
            "proposed_hash": strings([None if r is None else r.metrics.get("proposed_hash") for r in search]),
            "search_status": strings(status), "search_score": score,
            "parent_score": pa.array(parent_best, pa.float64()), "best_so_far": pa.array(bests, pa.float64())}))
        if edges:
            child, parent, run, child_seq, parent_seq = zip(*edges)
            self._insert("lineage", pa.table({
                "child_id": strings(child), "parent_id": strings(parent), "run_id": strings(run),
                "child_seq": pa.array(child_seq, pa.int64()), "parent_seq": pa.array(parent_seq, pa.int64())}))
        known = dict(zip(hashes, zip(seqs, [_NAN if s is None else s for s in ok])))

        def apply():
            self.index.add_new(known)
            self.island_best.update(island_best)
            self.next_seq += len(fresh)
        return apply

    def _parents(self, fresh: list[Candidate], seqs: list[int], scores: list[float | None],
                 hashes: dict[str, int]) -> tuple[list[float | None], list[tuple]]:
        """The best OK search score of each new program's parents, and the lineage edges
        (child id, parent id, run id, child seq, parent seq or None), each parent once."""
        ids = list(dict.fromkeys(p for c in fresh for p in c.parent_ids))
        unhashed = [p for p in ids if p not in hashes]
        hashes = {**hashes, **dict(zip(unhashed, id_hashes(unhashed)))} if unhashed else hashes
        where = {p: (at[0], None if math.isnan(at[1]) else at[1])
                 for p, at in zip(ids, self.index.get_many([hashes[p] for p in ids])) if at is not None}
        local = dict(zip([c.program_id for c in fresh], zip(seqs, scores)))
        bests, edges, nowhere = [], [], (None, None)
        for c, seq in zip(fresh, seqs):
            best = None
            for p in c.parent_ids if len(c.parent_ids) < 2 else dict.fromkeys(c.parent_ids):
                at = local.get(p)
                if at is None or at[0] >= seq:  # a parent later in the batch is no parent yet
                    at = where.get(p, nowhere)
                edges.append((c.program_id, p, c.run_id, seq, at[0]))
                if at[1] is not None and (best is None or at[1] > best):
                    best = at[1]
            bests.append(best)
        return bests, edges

    def _running_bests(self, fresh: list[Candidate], scores: list[float | None]):
        island_best, bests = {}, []
        for c, score in zip(fresh, scores):
            if score is None or c.island < 0:
                bests.append(None)
                continue
            key = (c.run_id, c.island)
            best = island_best.get(key, self.island_best.get(key))
            island_best[key] = score if best is None or score > best else best
            bests.append(island_best[key])
        return bests, island_best

    # --- evaluations ----------------------------------------------------------------
    def _insert_evaluations(self, batch: _Batch):
        items = batch.items
        results = [r for r, _ in items]
        stored = [r for r in results if r.program_id in batch.stored] if batch.stored else []
        for split in {r.split for r in stored}:
            self.con.execute("DELETE FROM evaluations WHERE split = ? AND program_id IN (SELECT unnest(?))",
                             [split, [r.program_id for r in stored if r.split == split]])
        self._insert("evaluations", pa.table({
            "program_id": strings([r.program_id for r in results]), "run_id": strings([run for _, run in items]),
            "split": strings([r.split for r in results]), "status": strings(statuses([r.status for r in results])),
            "score": floats([r.score for r in results]),
            "metrics": json_column([r.metrics for r in results]),
            "instance_scores": finite_lists([r.instance_scores for r in results]),
            "descriptors": finite_lists([r.descriptors for r in results]),
            "error": strings([r.error for r in results]),
            "duration_s": plain_floats([r.duration_s for r in results]),
            "node_id": strings([r.node_id for r in results]),
            "node_ip": strings([r.node_ip for r in results]),
            "created_at": pa.array(np.full(len(results), time.time()), pa.float64())}))
        researched = [r for r in stored if r.split == "search"]
        return self._update_search(researched) if researched else None

    def _update_search(self, results: list[EvalResult]):
        """Stored programs got a new search evaluation: their row, island bests and totals follow."""
        table = pa.table({"program_id": strings([r.program_id for r in results]),
                          "search_status": strings(statuses([r.status for r in results])),
                          "search_score": floats([r.score for r in results]),
                          "proposed_hash": strings([r.metrics.get("proposed_hash") for r in results])})
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
                "run_id": strings([t[0] for t in totals]), "mutator": strings([t[1] for t in totals]),
                **{name: pa.array([t[i] for t in totals], pa.int64())
                   for i, name in ((2, "attempts"), (3, "ok"), (4, "improvements"))}}))
        last = self.con.execute("SELECT coalesce(max(seq), 0) FROM programs").fetchone()[0]
        self.con.execute("UPDATE mutator_counts_seq SET seq = ?", [last])
        return last

    def _insert(self, table_name: str, table: pa.Table) -> None:
        insert_arrow(self.con, table_name, table, self.columns)


class TableColumns:
    """Each table's column names in order, read once (the schema is migrated before any write)."""

    def __init__(self, con):
        self.con, self._names = con, {}

    def __call__(self, table_name: str) -> list[str]:
        if table_name not in self._names:
            self._names[table_name] = [name for (name,) in self.con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' AND table_name = ? "
                "ORDER BY column_index", [table_name]).fetchall()]
        return self._names[table_name]


def insert_arrow(con, table_name: str, table: pa.Table, columns: TableColumns | None = None) -> None:
    """Append an Arrow table to `table_name`, columns matched by name (the archive's one bulk insert).

    With the table's `columns` known, the batch is put in their order (missing ones null) and
    appended from a relation: no view registered and dropped inside the transaction, a
    quarter less per statement than matching by name, which is most of a small commit's cost.
    """
    names = columns(table_name) if columns is not None else ()
    if names and set(table.column_names) <= set(names):
        present, n = set(table.column_names), table.num_rows
        ordered = pa.table([table[c] if c in present else pa.nulls(n) for c in names], names=names)
        con.from_arrow(ordered).insert_into(table_name)
        return
    con.register("_batch", table)
    try:
        con.execute(f"INSERT INTO {table_name} BY NAME SELECT * FROM _batch")
    finally:
        with contextlib.suppress(duckdb.TransactionException):  # a failed statement aborted the transaction
            con.unregister("_batch")


def _first_of_each(candidates: list[Candidate]) -> list[Candidate]:
    """The first candidate of each program id, in batch order."""
    if len({c.program_id for c in candidates}) == len(candidates):
        return candidates
    first: dict[str, Candidate] = {}
    for c in candidates:
        first.setdefault(c.program_id, c)
    return list(first.values())


def _last_of_each(items: list[tuple[EvalResult, str]]) -> list[tuple[EvalResult, str]]:
    """One item per (program, split): the last one, at the place of the first."""
    keys = [(r.program_id, r.split) for r, _ in items]
    if len(set(keys)) == len(keys):
        return items
    return list(dict(zip(keys, items)).values())
