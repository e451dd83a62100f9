"""The library file shared by runs: created when missing, refused (never reset) when damaged or
newer, and written by several processes at once without losing a row."""
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import duckdb
import pytest

from store import library_records as records
from store.library import (
    Library,
    LibraryBusy,
    LibraryError,
    default_path,
    latest_version,
)
from tests.disks import small_disk

ROOT = Path(__file__).resolve().parents[2]


def _skill(skill_id, run_id, child_id, domain="inventory"):
    return {"skill_id": skill_id, "domain": domain, "fingerprint": "fp", "title": f"title {skill_id}",
            "applies_when": "any policy", "edit": {"kind": "expr", "before": "x", "after": "y"},
            "search_gain": 0.1, "validation_gain": 0.05, "parent_code": "p", "child_code": "c",
            "run_id": run_id, "parent_id": "parent", "child_id": child_id}


def test_a_missing_library_is_created_where_the_environment_says(temporary_library):
    assert default_path() == temporary_library and not temporary_library.exists()
    assert Library(default_path()).ensure() == latest_version()
    assert temporary_library.is_file()
    assert default_path("/elsewhere/lib.duckdb") == Path("/elsewhere/lib.duckdb")  # the config key wins


def test_a_library_folder_that_cannot_be_made_says_how_to_go_on(tmp_path):
    (tmp_path / "home").write_text("")  # a home that is a file: no folder can be made in it, even by root
    with pytest.raises(LibraryError) as err:
        Library(tmp_path / "home" / ".local" / "library.duckdb").ensure()
    message = str(err.value)
    assert "\n" not in message and "cannot create the library's folder" in message
    assert "memory.library (or ATOLL_LIBRARY)" in message and "memory.enabled = false" in message
    assert f"{tmp_path / 'home'} is a file, not a folder" in message  # was "Not a directory" or "File exists"


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_damaged_library_gives_one_clear_message_and_is_left_as_it_was(tmp_path, damage):
    path = tmp_path / "library.duckdb"
    Library(path).transaction(lambda con: records.add_skills(con, [_skill("sk-1", "r1", "c1")]))
    data = {"garbage": b"not a database " * 400, "truncated": path.read_bytes()[:5000], "empty": b""}[damage]
    path.write_bytes(data)
    with pytest.raises(LibraryError) as err:
        Library(path).ensure()
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "start a fresh library" in message
    assert path.read_bytes() == data  # never silently reset


def test_a_newer_library_or_a_foreign_duckdb_file_is_refused(tmp_path):
    newer = tmp_path / "newer.duckdb"
    Library(newer).ensure()
    con = duckdb.connect(str(newer))
    con.execute("INSERT INTO library_version VALUES (?, 'from the future', now())", [latest_version() + 1])
    con.close()
    with pytest.raises(LibraryError, match="newer than this Atoll knows"):
        Library(newer).ensure()
    foreign = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE programs (x INTEGER)")
    con.close()
    with pytest.raises(LibraryError, match="not an Atoll library"):
        Library(foreign).ensure()


_WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from store import library_records as records
    from store.library import Library
    lib, run, n = Library(sys.argv[2], busy_timeout_s=60), sys.argv[3], int(sys.argv[4])
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(n):
        def work(con, i=i):
            records.upsert_run(con, {"run_id": run, "run_dir": "/runs/" + run, "domain": "inventory",
                                     "fingerprint": "fp", "config": {}, "status": "running", "evaluations": i})
            records.add_skill_uses(con, [{"run_id": run, "program_id": f"p{i}", "skill_id": "sk-shared",
                                          "parent_id": "p", "status": "OK", "success": i % 3 == 0, "gain": 0.1}])
            if i % 10 == 0:
                records.add_skills(con, [{"skill_id": f"sk-{run}-{i}", "domain": "inventory", "fingerprint": "fp",
                    "title": "t", "applies_when": "w", "edit": {}, "search_gain": 0.1, "validation_gain": 0.1,
                    "parent_code": "p", "child_code": "c", "run_id": run, "parent_id": "p", "child_id": f"p{i}"}])
        lib.transaction(work)
    print("done", flush=True)
""")


def test_two_processes_writing_at_once_both_succeed_and_lose_nothing(tmp_path):
    path, n = tmp_path / "library.duckdb", 30
    Library(path).transaction(lambda con: records.add_skills(con, [_skill("sk-shared", "r0", "c0")]))
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(ROOT), str(path), run, str(n)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for run in ("run-a", "run-b")]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:  # both start writing at once
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = [proc.communicate(timeout=240) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    lib = Library(path)
    assert {(r["run_id"], r["evaluations"]) for r in lib.transaction(records.runs)} == {("run-a", n - 1),
                                                                                         ("run-b", n - 1)}
    shared = lib.transaction(lambda con: records.skills(con, "inventory"))
    by_id = {s["skill_id"]: s for s in shared}
    assert len(by_id) == 1 + 2 * (n // 10)
    assert by_id["sk-shared"]["uses"] == 2 * n
    assert by_id["sk-shared"]["successes"] == 2 * len(range(0, n, 3))


def test_a_library_on_a_full_disk_says_so_in_one_line_and_takes_the_write_once_there_is_room(tmp_path):
    with small_disk(tmp_path / "disk", "2m") as disk:
        library = Library(disk / "library.duckdb")
        library.transaction(lambda con: records.add_skills(con, [_skill("sk-1", "r1", "c1")]))
        filler = disk / "filler"
        with open(filler, "wb", buffering=0) as out, pytest.raises(OSError):
            while True:
                out.write(b"x" * 4096)
        uses = [{"run_id": "r1", "program_id": f"p{i}", "skill_id": "sk-1", "parent_id": "x", "status": "OK",
                 "success": i % 2 == 0, "gain": 0.1} for i in range(2000)]
        with pytest.raises(LibraryError) as err:  # was DuckDB's 'cannot rollback - no transaction is active'
            library.transaction(lambda con: records.add_skill_uses(con, uses))
        message = str(err.value)
        assert "\n" not in message and "No space left on device" in message and "free some space" in message
        assert "delete" not in message
        filler.unlink()
        library.transaction(lambda con: records.add_skill_uses(con, uses))
        [skill] = library.transaction(lambda con: records.skills(con, "inventory"))
        assert (skill["uses"], skill["successes"]) == (2000, 1000)


def test_a_busy_library_is_waited_for_then_reported(tmp_path):
    path = tmp_path / "library.duckdb"
    Library(path).ensure()
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); sys.stdin.readline(); c.close()", str(path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"  # it holds the file until told to let go
        with pytest.raises(LibraryBusy, match="stayed busy"):
            Library(path, busy_timeout_s=0.5).ensure()
        wrote = []
        writer = threading.Thread(target=lambda: wrote.append(Library(path, busy_timeout_s=60).transaction(
            lambda con: records.add_skills(con, [_skill("sk-1", "r", "c")]))))
        writer.start()
        writer.join(1.0)
        assert writer.is_alive() and not wrote  # waiting while the file is held
        holder.communicate("go\n", timeout=30)
        writer.join(60)
        assert not writer.is_alive() and len(wrote) == 1  # then it wrote
    finally:
        holder.kill()
        holder.wait()
    assert [s["skill_id"] for s in Library(path).transaction(lambda con: records.skills(con))] == ["sk-1"]


def test_skills_keep_every_sighting_and_retired_ones_are_not_retrieved(tmp_path):
    lib = Library(tmp_path / "library.duckdb")
    lib.transaction(lambda con: records.add_skills(con, [_skill("sk-1", "r1", "c1"), _skill("sk-1", "r2", "c9"),
                                                          _skill("sk-2", "r2", "c2", domain="milp")]))
    rows = lib.transaction(lambda con: records.skills(con, "inventory"))
    assert [(r["skill_id"], r["times_learned"], r["learned_in"]) for r in rows] == [("sk-1", 2, "r1")]
    assert [r["skill_id"] for r in lib.transaction(lambda con: records.skills(con, run_ids=["r2"]))] == ["sk-1", "sk-2"]
    lib.transaction(lambda con: records.set_abstraction(con, "sk-1", "Analysis: ... Strategy: ..."))
    assert lib.transaction(lambda con: records.skills(con, "inventory"))[0]["abstraction"].startswith("Analysis")
    assert lib.transaction(lambda con: records.retire_skill(con, "sk-1"))
    assert not lib.transaction(lambda con: records.retire_skill(con, "sk-404"))
    assert lib.transaction(lambda con: records.skills(con, "inventory")) == []
    assert len(lib.transaction(lambda con: records.skills(con, "inventory", retired=True))) == 1


def test_elites_are_chosen_by_search_score_from_the_runs_asked_for(tmp_path):
    lib = Library(tmp_path / "library.duckdb")

    def elite(pid, score, code, fp="fp"):
        return {"program_id": pid, "domain": "inventory", "fingerprint": fp, "search_score": score, "code": code,
                "code_hash": code}
    lib.transaction(lambda con: records.replace_elites(con, "r1", [elite("a", -0.9, "A"), elite("b", -0.95, "B")]))
    lib.transaction(lambda con: records.replace_elites(con, "r2", [elite("c", -0.8, "C"), elite("d", -0.9, "A")]))
    lib.transaction(lambda con: records.replace_elites(con, "r3", [elite("e", -0.5, "E", fp="other")]))
    best = lib.transaction(lambda con: records.elites(con, fingerprint="fp", limit=3))
    assert [e["program_id"] for e in best] == ["c", "a", "b"]  # one copy of code A, other options' run left out
    assert [e["program_id"] for e in lib.transaction(lambda con: records.elites(con, run_ids=["r3"]))] == ["e"]
    lib.transaction(lambda con: records.replace_elites(con, "r1", [elite("z", -0.7, "Z")]))  # a resume replaces
    assert [e["program_id"] for e in lib.transaction(lambda con: records.elites(con, run_ids=["r1"]))] == ["z"]


def _skill_ids(path) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {skill_id for (skill_id,) in con.execute("SELECT skill_id FROM skills").fetchall()}
    finally:
        con.close()


def test_a_backup_is_made_at_most_hourly_and_a_damaged_library_says_how_to_go_back_to_it(tmp_path):
    path = tmp_path / "library.duckdb"
    lib = Library(path)
    assert lib.back_up() is False and not lib.backup_path.exists()  # no library yet: nothing to keep
    lib.transaction(lambda con: records.add_skills(con, [_skill("sk-1", "r1", "c1")]))
    assert lib.back_up() is True and lib.backup_path == tmp_path / "library.backup.duckdb"
    lib.transaction(lambda con: records.add_skills(con, [_skill("sk-2", "r2", "c2")]))
    assert lib.back_up() is False and _skill_ids(lib.backup_path) == {"sk-1"}  # the backup is under an hour old
    assert lib.back_up(older_than_s=0) is True and _skill_ids(lib.backup_path) == {"sk-1", "sk-2"}
    saved = lib.backup_path.read_bytes()
    path.write_bytes(path.read_bytes()[:5000])  # a disk error
    with pytest.raises(LibraryError) as err:
        lib.ensure()
    way_back = f"mv {path} {path}.damaged && cp {lib.backup_path} {path}"
    assert "\n" not in str(err.value) and "Its backup of " in str(err.value) and way_back in str(err.value)
    with pytest.raises(LibraryError):
        lib.back_up(older_than_s=0)
    assert lib.backup_path.read_bytes() == saved and not list(tmp_path.glob("*.tmp"))  # never replaced by damage
    subprocess.run(way_back, shell=True, check=True)  # what the message says to do
    assert {s["skill_id"] for s in lib.transaction(lambda con: records.skills(con))} == {"sk-1", "sk-2"}


def test_the_way_back_to_the_backup_moves_the_damaged_files_log_aside_too(tmp_path):
    """A writer killed mid-run leaves the library's write-ahead log beside it; followed as it was, the
    way back put the backup under that log, and DuckDB replayed the damaged file's later writes onto it."""
    path = tmp_path / "library.duckdb"
    lib = Library(path)
    lib.transaction(lambda con: records.add_skills(con, [_skill("sk-1", "r1", "c1")]))
    assert lib.back_up() is True
    killed = subprocess.run([sys.executable, "-c", f"""
import os, duckdb
con = duckdb.connect({str(path)!r})
con.execute("SET checkpoint_threshold = '1TB'")  # the write stays in the log, as a killed writer leaves it
con.execute("UPDATE skills SET title = 'written after the backup'")
os._exit(9)  # no checkpoint, no close
"""], check=False)
    assert killed.returncode == 9 and Path(f"{path}.wal").exists()
    path.write_bytes(path.read_bytes()[:5000])  # and then a disk error in the file itself
    with pytest.raises(LibraryError) as err:
        lib.ensure()
    way_back = (f"mv {path} {path}.damaged && mv {path}.wal {path}.damaged.wal && cp {lib.backup_path} {path}")
    assert "move the damaged file and its log (library.duckdb.wal) aside" in str(err.value), str(err.value)
    assert way_back in str(err.value), str(err.value)
    subprocess.run(way_back, shell=True, check=True)
    titles = lib.transaction(lambda con: con.execute("SELECT skill_id, title FROM skills").fetchall())
    assert titles == [("sk-1", _skill("sk-1", "r1", "c1")["title"])]  # the backup as it was made


def _with_run(lib: Library, run: str) -> None:
    lib.transaction(lambda con: records.upsert_run(con, {"run_id": run, "run_dir": "/runs/" + run, "domain": "inventory",
                                                         "fingerprint": "fp", "config": {}, "status": "running",
                                                         "evaluations": 1}))


def test_the_librarys_copy_in_backup_dir_is_its_own_never_another_librarys_and_is_found_by_a_run_it_knows(tmp_path):
    """controller.backup_dir gets the library's backups too (controller.backup.LibraryAway), named for this
    host and the library's path; a copy there that knows a run this library does not (another machine's
    library of the same name, a fresh library on a new machine) is never overwritten, and a copy at
    least as new as the backup is not made again."""
    from controller.backup import LibraryAway, library_away_path, library_copy_for

    away = tmp_path / "away"
    away.mkdir()
    lib = Library(tmp_path / "here" / "library.duckdb")
    _with_run(lib, "r1")
    assert lib.back_up(older_than_s=0)
    copier = LibraryAway(str(away), lib.path)
    assert copier.target == library_away_path(str(away), lib.path) and copier.target.name.startswith("library-")

    def copied() -> dict:
        assert copier.begin(lib.backup_path, 3600.0, 0, []) == {}
        events = copier.close([])
        assert [kind for kind, _ in events] == ["library-copied"], events
        return events[0][1]
    assert copied()["away"] == str(copier.target) and library_copy_for(away, "r1") == copier.target
    assert copied()["away_seconds"] == 0.0  # that backup is there already: not copied again
    _with_run(lib, "r2")
    assert lib.back_up(older_than_s=0) and copied()["away"] == str(copier.target)
    assert library_copy_for(away, "r2") == copier.target and library_copy_for(away, "r9") is None
    fresh = Library(tmp_path / "new-machine" / "library.duckdb")  # the same name: what a new machine would write
    _with_run(fresh, "r3")
    assert fresh.back_up(older_than_s=0)
    shutil.copyfile(copier.target, tmp_path / "kept.duckdb")
    later = fresh.backup_path.stat().st_mtime + 60
    os.utime(copier.target, (later, later))  # newer than that backup: what the copy holds decides, not its age
    notices: list[str] = []
    assert copier.begin(fresh.backup_path, 3600.0, 0, notices) == {}
    data = copier.close(notices)[0][1]
    assert "holds another library (it knows 2 runs this one does not)" in data["away_error"], data
    assert len(notices) == 1 and "the library's copy in controller.backup_dir could not be written" in notices[0]
    assert "memory.backup_every_s" in notices[0] and library_copy_for(away, "r1") == copier.target
    assert copier.target.read_bytes() == (tmp_path / "kept.duckdb").read_bytes()
