"""Live reads: the process holding an archive answers read-only queries of it.

DuckDB lets one process hold a database file read-write, and no other process may
open it meanwhile. So while the driver (or `atoll report`) holds a run's archive, a
thread of it serves a Unix socket in the run directory, `archive.sock`. Each query
runs on a connection of its own to the writer's database, inside a read-only
transaction, after the same statement rules as `atoll query` (`store/readonly.py`);
that database reaches no other file and its settings are locked
(`store.duckdb_archive.CONFIG`). Rows stream back as Arrow IPC. Nothing is copied
ahead of a query, so its cost is the query's own, whatever the archive's size.

A killed process leaves its socket file behind: connecting to it is refused. The
next process to hold the archive replaces it; until then readers open the archive
itself, which no one holds.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import select
import socket
import stat
import struct
import sys
import threading
import time
from pathlib import Path

import duckdb
import msgpack

from store.arrow import pa
from store.readonly import QueryError, explained, first_line, owner_of, reads

SOCKET = "archive.sock"
LIVE_NOTE = "live run: answered by the process holding it"
QUERY_TIMEOUT_S = 300.0  # a live query is interrupted after this long
AT_ONCE = 4  # live queries answered at the same time; a further asker waits until one of them ends
_HEADER = struct.Struct("!I")
_MAX_REQUEST = 1 << 20


def _send(sock: socket.socket, obj) -> None:
    data = msgpack.packb(obj)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _receive(stream) -> dict:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise ConnectionError("the live reader closed the connection")
    (size,) = _HEADER.unpack(head)
    if size > _MAX_REQUEST:
        raise ConnectionError(f"message of {size} bytes is too long")
    return msgpack.unpackb(stream.read(size))


@contextlib.contextmanager
def _address(run_dir: Path):
    """The socket's path, short enough for AF_UNIX (107 bytes) however deep the run directory is."""
    path = str(run_dir / SOCKET)
    if len(path.encode()) < 100:
        yield path
        return
    fd = os.open(run_dir, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{SOCKET}"
    finally:
        os.close(fd)


class LiveReads:
    """Serves read-only queries of `archive` on RUN_DIR/archive.sock until closed.

    Up to `AT_ONCE` queries at a time, each in a thread and a read-only transaction on a
    connection of its own, so one slow query does not hold up `atoll status`; a query
    running past `timeout_s`, or whose asker hung up (Ctrl-C, a killed `atoll query`), is
    interrupted.
    """

    def __init__(self, archive, run_dir: str | Path, timeout_s: float = QUERY_TIMEOUT_S):
        self.run_dir, self.timeout_s = Path(run_dir), timeout_s
        self._con = archive.cursor()  # made here; its cursors are made under self._lock
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running: set = set()  # the cursors of the queries running now, to interrupt on close
        self._answering: set[threading.Thread] = set()
        self._slots = threading.BoundedSemaphore(AT_ONCE)
        self._thread = threading.Thread(target=self._serve, name="atoll-live-reads", daemon=True)

    def __enter__(self) -> "LiveReads":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Serve from now on; if the socket cannot be made, say so and carry on without live reads."""
        path = self.run_dir / SOCKET
        try:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(path.lstat().st_mode):
                    path.unlink()  # left by a killed holder: we hold the archive now, so it is stale
            with _address(self.run_dir) as address:
                self._sock.bind(address)
        except OSError as exc:
            print(f"[atoll] no live queries for this run: cannot serve {path}: {exc}", file=sys.stderr)
            return
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self._thread.start()

    def close(self) -> None:
        """Stop serving, interrupt the queries running and wait for their threads. The interrupts are
        sent again until every thread has ended: one that reaches a cursor before its query has begun
        executing is lost (DuckDB interrupts only what runs), and close then waited for the query."""
        self._stop.set()  # a query not begun yet sees the stop once it takes the lock
        if self._thread.is_alive():
            self._thread.join()
        while True:
            with self._lock:
                for running in self._running:
                    with contextlib.suppress(duckdb.Error):
                        running.interrupt()
                answering = list(self._answering)
            if not answering:
                break
            answering[0].join(timeout=0.1)
        self._sock.close()
        self._con.close()
        if self._thread.ident is not None:  # it served, so the socket file is ours
            with contextlib.suppress(FileNotFoundError):
                (self.run_dir / SOCKET).unlink()

    def _serve(self) -> None:
        """Accept askers while a slot is free, each answered in a thread of its own."""
        while not self._stop.is_set():
            if not self._slots.acquire(timeout=0.2):
                continue
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                self._slots.release()
                continue
            except OSError:
                self._slots.release()
                return
            thread = threading.Thread(target=self._answer_in_slot, args=(client,), name="atoll-live-query",
                                      daemon=True)
            with self._lock:
                self._answering.add(thread)
            thread.start()

    def _answer_in_slot(self, client: socket.socket) -> None:
        try:
            with client:
                self._answer(client)
        finally:
            with self._lock:
                self._answering.discard(threading.current_thread())
            self._slots.release()

    def _answer(self, client: socket.socket) -> None:
        client.settimeout(10.0)
        try:
            with client.makefile("rb") as stream:
                sql = _receive(stream)["sql"]
            self._run(client, reads(sql))
        except QueryError as exc:
            self._reply_error(client, str(exc))
        except duckdb.Error as exc:
            self._reply_error(client, explained(exc))
        except (OSError, ConnectionError, ValueError, KeyError, TypeError, msgpack.UnpackException):
            pass  # a client that went away or spoke nonsense gets nothing

    def _reply_error(self, client: socket.socket, message: str) -> None:
        with contextlib.suppress(OSError):
            _send(client, {"ok": False, "error": message})

    def _run(self, client: socket.socket, statements: list) -> None:
        """Run the statements in one read-only transaction; stream the last one's rows."""
        with self._lock:
            if self._stop.is_set():
                return
            cursor = self._con.cursor()
            self._running.add(cursor)
        watch = _Watch(client, cursor, self.timeout_s)
        try:
            try:
                relation = run_read_only(cursor, statements)
                reader = None if relation is None else relation.to_arrow_reader(8192)
                batches = iter(() if reader is None else reader)
                first = next(batches, None)  # most failures (and interrupts) happen before the first rows
            except duckdb.InterruptException:
                raise QueryError(self._interrupted()) from None
            if reader is None:
                _send(client, {"ok": True, "pid": os.getpid(), "columns": None})
                return
            _send(client, {"ok": True, "pid": os.getpid(), "columns": relation.columns})
            with client.makefile("wb") as out, pa.ipc.new_stream(out, reader.schema) as writer:
                for batch in itertools.chain([first] if first is not None else [], batches):
                    writer.write_batch(batch)
        finally:
            watch.stop()
            with contextlib.suppress(duckdb.Error):
                cursor.execute("ROLLBACK")
            with self._lock:
                self._running.discard(cursor)
                cursor.close()

    def _interrupted(self) -> str:
        """Why a live query was interrupted, for its asker (one that hung up reads nothing)."""
        if self._stop.is_set():
            return ("interrupted: the process holding the archive closed it (the run ended or stopped) while this "
                    "query ran; ask again")
        return (f"interrupted: the query ran past {self.timeout_s:g} s, the longest a live run answers one; "
                "narrow it (WHERE, LIMIT), or ask once the run has ended (its file is then read with no limit)")


class _Watch:
    """Interrupts a query's cursor once it runs past `timeout_s` or its asker hangs up, whichever
    comes first, until stopped. An asker sends nothing after its request, so anything that becomes
    readable on its socket is the end of it."""

    def __init__(self, client: socket.socket, cursor, timeout_s: float):
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, args=(client, cursor, timeout_s), daemon=True)
        self._thread.start()

    def _run(self, client: socket.socket, cursor, timeout_s: float) -> None:
        poller = select.poll()
        poller.register(client, select.POLLIN | select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        poller.register(self._wake_r, select.POLLIN)
        events = poller.poll(timeout_s * 1000)
        woken = any(fd == self._wake_r for fd, _ in events)
        while not woken:  # again until the query has ended: an interrupt before it began executing is lost
            with contextlib.suppress(duckdb.Error):
                cursor.interrupt()
            woken = bool(select.select([self._wake_r], [], [], 0.1)[0])

    def stop(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)


def run_read_only(cursor, statements: list):
    """Open a read-only transaction on `cursor`, run every statement but the last, and
    return the last one as a relation (None if it yields no rows). The caller rolls back."""
    cursor.execute("BEGIN TRANSACTION READ ONLY")
    for statement in statements[:-1]:
        cursor.execute(statement)
    return cursor.sql(statements[-1].query)


class NotServed(Exception):
    """No live reader answers in this run directory (none started yet, or a stale socket)."""


def ask(run_dir: str | Path, sql: str) -> tuple[list[str], list[tuple], str]:
    """Ask the process holding RUN_DIR's archive; (columns, rows, note) like `store.query.run_query`.

    Raises NotServed when nothing listens, QueryError for a refused or failed query.
    """
    columns, table, note = ask_arrow(run_dir, sql)
    return columns, ([] if table is None else _rows(table)), note


def ask_arrow(run_dir: str | Path, sql: str) -> tuple[list[str], pa.Table | None, str]:
    """`ask`, with the last statement's rows as the Arrow table that came back (None: no rows)."""
    run_dir = Path(run_dir)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(QUERY_TIMEOUT_S + 30)
        try:
            with _address(run_dir) as address:
                sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise NotServed(str(exc)) from None
        except PermissionError:  # another user's live run: a traceback said so
            raise QueryError(not_served_here(run_dir)) from None
        with sock.makefile("rb") as stream:
            try:
                _send(sock, {"sql": sql})
                header = _receive(stream)
            except (ConnectionError, OSError) as exc:  # it ended (or was killed) while we asked
                raise QueryError(f"the process holding the archive did not answer ({exc}): it may have stopped; "
                                 "ask again") from None
            if not header["ok"]:
                raise QueryError(header["error"])
            note = f"{LIVE_NOTE} (pid {header['pid']})"
            if header["columns"] is None:
                return [], None, note
            try:
                table = pa.ipc.open_stream(stream).read_all()
            except pa.ArrowInvalid as exc:
                raise QueryError(f"the live answer broke off (interrupted, or the process holding the archive "
                                 f"stopped): {first_line(exc)}") from None
    return list(header["columns"]), table, note


def not_served_here(run_dir: Path) -> str:
    """Why this user may not ask the holder of RUN_DIR's archive: its socket is its owner's (to connect is to write)."""
    owner = owner_of(run_dir / SOCKET)
    return (f"{run_dir}: the run is live, and the process holding its archive (its driver, or `atoll report`) "
            f"answers the user who started it only ({SOCKET}: permission denied); run this as that user"
            f"{f' ({owner})' if owner else ''}, "
            "or after the run has ended")


_converter: list = []  # one in-memory DuckDB per process, made on first use
_converter_lock = threading.Lock()


def _rows(table: pa.Table) -> list[tuple]:
    """Python values exactly as DuckDB's own fetchall gives them (the Arrow is lossless)."""
    plain = table.rename_columns([f"c{i}" for i in range(table.num_columns)])
    with _converter_lock:
        if not _converter:
            _converter.append(duckdb.connect())
        cursor = _converter[0].cursor()
    try:
        return cursor.from_arrow(plain).fetchall()
    finally:
        cursor.close()


def ask_waiting(run_dir: str | Path, sql: str, wait_s: float = 3.0):
    """`ask`, retrying while the holder may still be starting its live reader."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return ask(run_dir, sql)
        except NotServed:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
