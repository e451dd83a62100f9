"""The run archive: one DuckDB file per run directory, written by the driver only.

Every write is one transaction over a whole batch, inserted through Arrow tables
(never row by row), so a crash leaves either the whole batch or none of it; the
write path itself is `store/writer.py`. The schema is a sequence of versioned SQL
files in `store/schema/`; opening an archive for writing applies the missing ones
and records them in `schema_version`.

The connection reaches no file but the archive and its settings are locked, so the
driver can answer live read-only queries from a cursor of its own (`store/live.py`).
"""
from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np

from store import signals
from store.arrow import pa
from store.columns import strings
from store.hash_index import HashSet
from store.readonly import cut_short, is_damage_error, log_of
from store.records import Candidate, EvalResult
from store.writer import TableColumns, Writer, insert_arrow, to_json

SCHEMA_DIR = Path(__file__).with_name("schema")
# The write-ahead log is folded into the file every 256 MB rather than DuckDB's default 16 MB:
# each fold recompresses the table's newest row group whole, so frequent small folds cost
# 2.5x the CPU and twice the file size on programs of 1-2 KB (benchmarks/archive_scale.py).
# A crash then replays at most 256 MB of log on the next open. Live queries read Arrow
# losslessly (store/live.py).
CONFIG = {"enable_external_access": False, "autoinstall_known_extensions": False,
          "autoload_known_extensions": False, "lock_configuration": True, "checkpoint_threshold": "256MB",
          "arrow_lossless_conversion": True}
_SEARCH_ROW = ("program_id", "island", "generation", "code", "mutator", "status", "score",
               "instance_scores", "descriptors", "seq")


@contextlib.contextmanager
def _gc_paused():
    """No cyclic garbage collection while a batch is built and inserted.

    A batch makes and drops thousands of small containers (its rows' tuples, lists and
    dicts, all freed by reference counting); each allocation burst otherwise sets off
    collections that walk the driver's long-lived objects: a sixth of the write time in
    benchmarks/archive_scale.py. Collection resumes after the batch.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def copy_whole(source: Path, target: Path, with_log: bool = False) -> None:
    """Copy the DuckDB file `source` (its log folded in, nobody writing) to `target`: under a
    temporary name, read whole (`read_whole`), flushed to disk, then renamed and the rename flushed,
    so `target` stays the last whole copy whenever the process is killed, the machine loses power
    or the copy fails (a full disk, damage). `with_log`: a log beside `source` (SOURCE.wal, left by a
    driver that was killed or lost its machine) holds commits the file does not; it is copied too and
    folded into the copy, which then holds them."""
    tmp = target.with_name(target.name + ".tmp")
    log, tmp_log = log_of(source), log_of(tmp)
    try:
        _copy_apart(source, tmp)
        if with_log and log.exists():
            _copy_apart(log, tmp_log)
            fold_log(tmp)
        try:
            read_whole(tmp)
        except ArchiveDamaged as exc:  # named by its source: the copy is byte for byte, and is removed
            raise ArchiveDamaged(f"{source}, copied, does not read whole: {str(exc).replace(str(tmp), str(source))}") from None
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
        flush_dir(target.parent)
    finally:
        tmp.unlink(missing_ok=True)
        tmp_log.unlink(missing_ok=True)


def fold_log(path: Path) -> None:
    """Fold the log beside the DuckDB file `path` into it (a file no other process has open)."""
    con = duckdb.connect(str(path), config=CONFIG)
    try:
        con.execute("CHECKPOINT")
    finally:
        con.close()


def flush_dir(path: Path) -> None:
    """Flush the folder `path` to disk: the renames made in it survive a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_COPY = ("import shutil, sys\n"
         "try:\n"
         "    shutil.copyfile(sys.argv[1], sys.argv[2])\n"
         "except OSError as exc:\n"
         "    print(exc.errno or 0, exc.strerror or exc, sep='\\t', file=sys.stderr)\n"
         "    sys.exit(3)\n")


def _copy_apart(source: Path, target: Path) -> None:
    """Copy a file in a child process. A process that closes any descriptor of a file loses every
    fcntl lock it holds on that file (POSIX), DuckDB's own among them: a copy made in the process
    that holds the database would let a second process open it. An OSError as the child met it."""
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", _COPY, str(source), str(target)], capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        code, _, why = proc.stderr.strip().rpartition("\n")[2].partition("\t")
        raise OSError(int(code) if code.isdigit() and why else errno.EIO, why or proc.stderr.strip()[-300:])


def read_whole(path: Path) -> None:
    """Read every stored value of the archive at `path` (an aggregate over every column of every
    table), so DuckDB checks each block it reads; damage raises ArchiveDamaged, a Ctrl-C
    KeyboardInterrupt, any other error of DuckDB's is raised as it is."""
    try:
        con = duckdb.connect(str(path), read_only=True, config=CONFIG)
        try:
            missing = cut_short(con, path)
            if missing:
                raise ArchiveDamaged(missing)
            tables = con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall()
            for (table,) in tables:
                con.execute(f'SELECT bit_xor(hash(COLUMNS(*))) FROM "{table}"').fetchall()
        finally:
            con.close()
    except duckdb.InterruptException:
        raise KeyboardInterrupt from None  # a Ctrl-C during the reading (store.signals)
    except duckdb.Error as exc:
        if is_damage_error(exc):
            raise ArchiveDamaged(str(exc).strip().splitlines()[0]) from None
        raise


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every schema file, in order."""
    found = []
    for path in sorted(SCHEMA_DIR.glob("[0-9][0-9][0-9]_*.sql")):
        found.append((int(path.name[:3]), path.name, path.read_text()))
    return found


class ArchiveNewer(Exception):
    """The archive was written by a newer Atoll (a schema version this one does not know): this one
    may read it, never write it, since its rows would lack what the newer schema holds."""


class ArchiveDamaged(Exception):
    """The archive's file is shorter than the blocks it records: cut short (an unfinished copy, a disk error)."""


class DuckDBArchive:
    """A run directory's archive. Open read-write in the driver only.

    What callers may rely on:
    - Each write method is one transaction: the whole batch lands, or none of it.
    - A program is stored once: recording a stored program id again keeps the first
      row (and its `seq`). An evaluation is kept per (program, split), and a later
      one for the same key replaces it: the latest measurement wins. Evaluations are
      of stored programs (or of programs in the same batch).
    - What the reads return (dicts, tuples, bytes) is a copy, detached from the file.
    - One connection, no lock of its own: use an archive from one thread at a time
      (`cursor()` gives another thread a connection of its own).
    """

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        self.con = duckdb.connect(str(self.path), read_only=read_only, config=CONFIG)
        missing = cut_short(self.con, self.path)
        if missing:  # before anything is written into it
            self.close()
            raise ArchiveDamaged(missing)
        self._writer: Writer | None = None
        if not read_only:
            try:
                self.migrate()
            except ArchiveNewer:
                self.close()
                raise
        self._columns = TableColumns(self.con)

    def __enter__(self) -> "DuckDBArchive":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None

    def cursor(self):
        """A connection of its own to the same database, for another thread."""
        return self.con.cursor()

    def backup(self, target: Path) -> int:
        """Copy the archive whole to `target`, holding what was committed so far; its size in bytes.

        The log is folded into the file first, and nothing is written until the copy ends (call it
        between writes, from the writing thread; live reads may go on). The copy is made under a
        temporary name, read whole, flushed to disk and renamed, so `target` is a whole archive
        whenever the process is killed, and a failed copy (a full disk) leaves the last one as it
        was. Reading every column of every table makes DuckDB check every block's checksum: an
        archive a disk error damaged raises ArchiveDamaged and never replaces the last good backup.
        """
        self.con.execute("CHECKPOINT")
        copy_whole(self.path, target)
        return target.stat().st_size

    # --- schema ---------------------------------------------------------------
    def migrate(self) -> list[int]:
        """Apply the schema files not yet recorded; returns the versions applied. An archive of a newer
        schema than these files make raises ArchiveNewer before anything is written."""
        self.con.execute("CREATE TABLE IF NOT EXISTS schema_version "
                         "(version INTEGER PRIMARY KEY, name VARCHAR, applied_at TIMESTAMP)")
        done = {v for (v,) in self.con.execute("SELECT version FROM schema_version").fetchall()}
        known = max(version for version, _, _ in migrations())
        if done and max(done) > known:
            raise ArchiveNewer(f"{self.path} was written by a newer Atoll (archive schema version {max(done)}; this "
                               f"Atoll knows up to {known}): continue it with that Atoll or a newer one (upgrade "
                               "Atoll here); atoll query, status and best still read it")
        applied = []
        for version, name, sql in migrations():
            if version in done:
                continue
            if done:  # an existing archive: say so, a rebuild of a large one takes a while (once)
                print(f"atoll: upgrading {self.path} to schema version {version} ({name}), once; "
                      "a large archive takes a while, and an interruption leaves it as it was", file=sys.stderr)
            self.con.execute("BEGIN")  # no store.signals.held: Ctrl-C may stop a long upgrade, rolled back
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
                         [run_id, name, to_json(config), toml_text])

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
    def write(self, run_id: str, pairs: list[tuple[Candidate, EvalResult]] = (),
              evaluations: list[EvalResult] = (), events: list[tuple[str, dict]] = (),
              snapshot: bytes | Callable[[int], bytes] | None = None,
              also: Callable[[], None] | None = None) -> None:
        """New programs with their evaluations, evaluations of stored programs (of run `run_id`),
        events and the run's islands snapshot, all in one transaction. `snapshot` may be a
        function of the commit number of the latest program, this batch's included. `also`
        writes more rows in the same transaction, after the programs (e.g. their LLM calls)."""
        if not (pairs or evaluations or events or snapshot is not None or also is not None):
            return
        writer = self._writer or Writer(self.con, self._columns)
        self._writer = writer

        def work():
            after = writer.write(list(pairs), [(r, run_id) for r in evaluations]) if pairs or evaluations else None
            if events:
                self._insert_events(run_id, events)
            if also is not None:
                also()
            if snapshot is not None:
                last = writer.next_seq - 1 + (writer.pending if after else 0)  # next_seq moves once committed
                self._save_snapshot(run_id, snapshot(last) if callable(snapshot) else snapshot)
            return after
        with _gc_paused():
            self._transaction(work)

    def record(self, pairs: list[tuple[Candidate, EvalResult]]) -> None:
        """Programs (new ones), their lineage edges and evaluations, in one transaction."""
        if pairs:
            self.write(pairs[0][0].run_id, pairs=pairs)

    def record_evaluations(self, results: list[EvalResult], run_id: str) -> None:
        """Evaluations of programs already stored (e.g. held-out scores), in one transaction."""
        self.write(run_id, evaluations=results)

    def log_events(self, run_id: str, events: list[tuple[str, dict]]) -> None:
        self.write(run_id, events=events)

    def save_snapshot(self, run_id: str, data: bytes) -> None:
        self.write(run_id, snapshot=data)

    def load_snapshot(self, run_id: str) -> bytes | None:
        row = self.con.execute("SELECT data FROM snapshots WHERE run_id = ? ORDER BY saved_at DESC LIMIT 1",
                               [run_id]).fetchall()
        return bytes(row[0][0]) if row else None

    def _insert_events(self, run_id: str, events: list[tuple[str, dict]]) -> None:
        now = time.time()
        self._insert("events", pa.table({"run_id": strings([run_id] * len(events)),
                                         "ts": pa.array([now] * len(events), pa.float64()),
                                         "kind": strings([kind for kind, _ in events]),
                                         "data": strings([to_json(data) for _, data in events])}))

    def _save_snapshot(self, run_id: str, data: bytes) -> None:
        self.con.execute("DELETE FROM snapshots WHERE run_id = ?", [run_id])
        self.con.execute("INSERT INTO snapshots VALUES (?, ?, ?)", [run_id, time.time(), data])

    def _transaction(self, work) -> None:
        """Run `work` in one transaction; what it returns is called once the transaction committed."""
        with signals.held():  # a Ctrl-C waits for the COMMIT (store.signals)
            self.con.execute("BEGIN")
            try:
                after = work()
                self.con.execute("COMMIT")
            except BaseException:
                try:
                    self.con.execute("ROLLBACK")
                except duckdb.Error:  # a COMMIT that failed (e.g. no space left) already ended the transaction
                    pass
                raise
            if after:  # the writer's own count of what is committed: with the commit, never without
                after()

    def _insert(self, table_name: str, table: pa.Table) -> None:
        insert_arrow(self.con, table_name, table, self._columns)

    # --- reads ------------------------------------------------------------------
    def count_evaluations(self, run_id: str, split: str = "search") -> int:
        """Evaluations of the run's programs on `split`, baselines excluded."""
        if split == "search":
            return self.con.execute("SELECT count(*) FROM programs WHERE run_id = ? AND search_status IS NOT NULL "
                                    "AND mutator NOT LIKE 'baseline:%'", [run_id]).fetchall()[0][0]
        return self.con.execute("SELECT count(*) FROM evaluations e JOIN programs p USING (program_id) "
                                "WHERE e.run_id = ? AND e.split = ? AND p.mutator NOT LIKE 'baseline:%'",
                                [run_id, split]).fetchall()[0][0]

    def known_hashes(self, run_id: str) -> HashSet:
        """Hashes of every program text of the run: as stored, and as proposed before tuning
        rewrote its PARAMS (`proposed_hash`), as a compact set (8 bytes a hash)."""
        arrays = self.con.execute(
            "SELECT TRY_CAST('0x' || code_hash AS UBIGINT) AS h FROM programs WHERE run_id = ? UNION ALL "
            "SELECT TRY_CAST('0x' || proposed_hash AS UBIGINT) FROM programs WHERE run_id = ? "
            "AND proposed_hash IS NOT NULL", [run_id, run_id]).fetchnumpy()
        hashes = arrays["h"]
        if np.ma.isMaskedArray(hashes):  # a stored hash that is not 16 hex digits
            hashes = hashes.compressed()
        return HashSet(np.asarray(hashes, dtype=np.uint64))

    def form_hashes(self, run_id: str) -> list[str]:
        """The normal-form hashes the run's search evaluations stored (`metrics.form_hash`), for dedup."""
        rows = self.con.execute("SELECT json_extract_string(metrics, '$.form_hash') FROM evaluations "
                                "WHERE run_id = ? AND split = 'search' AND json_exists(metrics, '$.form_hash')",
                                [run_id]).fetchall()
        return [h for (h,) in rows]

    def last_seq(self) -> int:
        """The commit number of the latest program (0 in an empty archive)."""
        if self._writer is not None:
            return self._writer.next_seq - 1
        return self.con.execute("SELECT coalesce(max(seq), 0) FROM programs").fetchone()[0]

    def search_rows(self, run_id: str, after_seq: int = 0, chunk: int = 10_000):
        """The run's programs evaluated on the search split with seq > `after_seq`, code included,
        in commit order (baselines excluded), fetched `chunk` rows at a time."""
        cursor = self.con.cursor()
        try:
            cursor.execute(
                "SELECT p.program_id, p.island, p.generation, p.code, p.mutator, p.search_status, p.search_score, "
                "e.instance_scores, e.descriptors, p.seq FROM programs p JOIN evaluations e "
                "ON e.program_id = p.program_id AND e.split = 'search' "
                "WHERE p.run_id = ? AND p.seq > ? AND p.search_status IS NOT NULL "
                "AND p.mutator NOT LIKE 'baseline:%' ORDER BY p.seq", [run_id, after_seq])
            while rows := cursor.fetchmany(chunk):
                for row in rows:
                    item = dict(zip(_SEARCH_ROW, row))
                    item["instance_scores"] = tuple(item["instance_scores"] or ())
                    item["descriptors"] = tuple(item["descriptors"] or ())
                    yield item
        finally:
            cursor.close()

    def codes(self, run_id: str, program_ids: list[str]) -> dict[str, str]:
        """The code of each of the run's programs in `program_ids` that is stored (program id -> code)."""
        rows = self.con.execute(
            "SELECT p.program_id, p.code FROM programs p JOIN (SELECT unnest(?::VARCHAR[]) AS program_id) w "
            "USING (program_id) WHERE p.run_id = ?", [list(program_ids), run_id]).fetchall()
        return dict(rows)

    def search_scores(self, run_id: str) -> list[float]:
        """The OK search scores of the run's programs, in commit order (baselines excluded)."""
        rows = self.con.execute("SELECT search_score FROM programs WHERE run_id = ? AND search_status = 'OK' "
                                "AND search_score IS NOT NULL AND mutator NOT LIKE 'baseline:%' ORDER BY seq",
                                [run_id]).fetchall()
        return [score for (score,) in rows]

    def programs_with_scores(self, run_id: str, split: str = "search") -> list[dict]:
        """Programs evaluated on `split`, in commit order (baselines excluded), code included:
        every row in memory at once, so for small archives and tests; see `search_rows`."""
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
        """The best OK program on `split` (ties: the shorter code, then the earlier)."""
        if split == "search":
            row = self.con.execute(
                "SELECT program_id, code, search_score, island, generation FROM programs WHERE run_id = ? "
                "AND search_status = 'OK' AND mutator NOT LIKE 'baseline:%' AND search_score = (SELECT "
                "max(search_score) FROM programs WHERE run_id = ? AND search_status = 'OK' AND mutator NOT LIKE "
                "'baseline:%') ORDER BY length(code), seq LIMIT 1", [run_id, run_id]).fetchall()
            return dict(zip(("program_id", "code", "score", "island", "generation"), row[0])) if row else None
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
