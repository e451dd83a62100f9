"""Faults survived by the real CLI (subprocesses, real Ray, DuckDB and sandboxes, tiny inventory runs).

Two runs at once; a second driver on a live run directory; a failing reference
computation in the report; a full disk; a chain of kill -9 at random moments; bad
input refused before the run exists.
"""
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import time

import pytest

from store.query import QueryError, run_query
from tests.controller.runs import (CONFIG, TINY, atoll, committed_ids, counts, kill_group, proposed_texts, start,
                                   tiny_domain, wait_for_evaluations)
from tests.disks import small_disk

ONE_ACTOR = [*TINY, "--set", "evaluator.actors=1"]


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.slow
@pytest.mark.timeout(600)  # minutes on a busy 2-core machine
def test_two_runs_at_once_finish_and_a_second_driver_on_a_live_run_is_refused(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    (tmp_path / "a-file").write_text("")  # the report's reference figures cannot be cached under it: they fail
    a = start(tmp_path, "run", CONFIG, "--run-dir", a_dir, "--max-evals", 8, "--no-report", *ONE_ACTOR,
              "--set", "controller.backup_every_s=0.3")  # a backup's copy must not drop the driver's lock
    try:
        b = start(tmp_path, "run", CONFIG, "--run-dir", b_dir, "--max-evals", 5, *ONE_ACTOR,
                  ATOLL_CACHE_DIR=str(tmp_path / "a-file" / "cache"))
    except BaseException:
        kill_group(a)
        raise
    try:
        wait_for_evaluations(a_dir, 2, a)
        while not (a_dir / "archive.backup.duckdb").exists() and a.poll() is None:
            time.sleep(0.1)
        os.kill(a.pid, signal.SIGSTOP)  # A's driver holds its directory, however fast A would finish
        try:
            for args in (["resume", a_dir], ["report", a_dir], ["resume", a_dir, "--from-backup"]):
                out = atoll(tmp_path, *args)
                assert out.returncode == 2, out
                assert f"{a_dir} is in use by a live run (driver pid {a.pid})" in _one_line(out.stderr)
            again = atoll(tmp_path, "run", CONFIG, "--run-dir", a_dir)
            assert again.returncode == 2 and "already holds a run" in _one_line(again.stderr)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        a_out, a_err = a.communicate(timeout=400)
        b_out, b_err = b.communicate(timeout=400)
    finally:
        kill_group(a)
        kill_group(b)
    assert a.returncode == 0 and b.returncode == 0, (a_err, b_err)
    assert counts(a_dir) == (8, 8) and counts(b_dir) == (5, 5)
    status = atoll(tmp_path, "query", a_dir, "SELECT status FROM runs", "--json")
    assert status.stdout.strip() == '{"status": "completed"}'  # one run row, ended by its own driver
    assert "reference figures FAILED" in b_out and "Not a directory" in b_out
    assert "evolved best" in b_out and "baseline: optimized base-stock" in b_out and "Traceback" not in b_err


def _fill(disk) -> object:
    """Write zeros on `disk` until no byte is left."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler


@pytest.mark.slow
@pytest.mark.timeout(600)  # minutes on a busy 2-core machine
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs for the run directory needs root")
def test_a_full_disk_stops_the_run_cleanly_and_resume_finishes_once_space_is_free(tmp_path):
    with small_disk(tmp_path / "disk", "48m") as disk:
        run_dir = disk / "run"
        proc = start(tmp_path, "run", CONFIG, "--run-dir", run_dir, "--max-evals", 14, "--no-report", *TINY)
        try:
            seen = wait_for_evaluations(run_dir, 3, proc)
            filler = _fill(disk)
            _, err = proc.communicate(timeout=120)
        finally:
            kill_group(proc)
        last = err.strip().splitlines()[-1]
        assert proc.returncode == 1 and "Traceback" not in err, err
        assert last == (f"atoll: the disk holding {run_dir} is full (no space left on device): the run stopped. "
                        "Everything committed before is kept and readable (atoll status, atoll query). Free some "
                        f"space, then continue with: atoll resume {run_dir}")
        kept = committed_ids(run_dir)  # read while the disk is still full
        assert len(kept) >= seen
        assert "atoll resume" in atoll(tmp_path, "status", run_dir).stdout
        filler.unlink()
        done = atoll(tmp_path, "resume", run_dir, "--no-report")
        assert done.returncode == 0, done.stderr
        assert counts(run_dir) == (14, 14) and kept <= committed_ids(run_dir)


def _kill_at_a_random_moment(proc, run_dir, rng, done_before: int, first: bool = False) -> str | None:
    """Kill -9 the driver's process group at a random moment; None if it finished first.

    Half the moments are counted from the start (loading, Ray, the archive, the seed), half
    from the run's next committed evaluation (mid-search: commits, snapshots, evaluations),
    so both kinds are hit however fast the machine is. The `first` kill comes 0.5 to 1.5 s after
    the first committed evaluation: mid-search, with a backup made (every commit's, here), and
    before a run of the test's budget can have finished, so the chain always has one.
    """
    if not first and rng.random() < 0.5:
        moment, anchor = rng.uniform(0.3, 8.0), "start"
    else:
        moment, anchor = rng.uniform(0.5, 1.5) if first else rng.uniform(0.0, 2.5), "progress"
        while proc.poll() is None and _live_count(run_dir) <= done_before:
            time.sleep(0.1)
    try:
        proc.wait(timeout=moment)
        return None
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return f"{moment:.2f}s after {anchor}"


def _live_count(run_dir) -> int:
    try:
        return counts(run_dir)[0]
    except QueryError:
        return 0


@pytest.mark.timeout(900)  # minutes on a busy 2-core machine
def test_a_chain_of_kill_9_at_random_moments_loses_nothing_and_completes_the_budget_exactly(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng, run_dir, budget = random.Random(seed), tmp_path / "run", 16
    # the archive is backed up after nearly every commit: a kill can land in a backup too
    first = ["run", CONFIG, "--run-dir", run_dir, "--max-evals", budget, "--no-report", *TINY,
             "--set", "controller.backup_every_s=0.3"]
    kept, kills, proc, backed_up = set(), [], None, 0
    while len(kills) < 6:
        resume = (run_dir / "archive.duckdb").exists()
        proc = start(tmp_path, *(["resume", run_dir, "--no-report"] if resume else first))
        kill = _kill_at_a_random_moment(proc, run_dir, rng, len(kept), first=not kills)
        ids = committed_ids(run_dir)
        assert kept <= ids, f"a committed evaluation was lost (seed {seed}, kills {kills + [kill]})"
        if (run_dir / "archive.backup.duckdb").exists():  # a whole archive, whenever the kill came
            backup = committed_ids(run_dir, "archive.backup.duckdb")
            assert backup <= ids, f"the backup holds what was never committed (seed {seed}, kills {kills + [kill]})"
            backed_up = max(backed_up, len(backup))
        kept = ids
        if kill is None:
            break  # the run finished before the kill
        if not kills:  # the kill left the stored status `running`: status and runs say no driver holds it
            assert run_query(run_dir, "SELECT status FROM runs")[1] == [("running",)]
            stopped = "stopped without ending (no driver holds it)"
            assert _shown_status(tmp_path, run_dir) == (stopped, stopped), f"(seed {seed})"
            assert "no driver holds this run: it stopped without ending" in atoll(tmp_path, "status", run_dir).stdout
        kills.append(kill)
    context = f"(seed {seed}, kills {kills})"
    assert kills, f"the run finished before its first kill: nothing was killed {context}"
    if proc.returncode == -9:
        done = atoll(tmp_path, "resume", run_dir, "--no-report")
        assert done.returncode == 0, (done.stderr, context)
    else:
        assert proc.returncode == 0, (proc.communicate(), context)
    assert counts(run_dir) == (budget, budget), context
    assert proposed_texts(run_dir) == budget, context  # no program text was evaluated twice
    assert kept <= committed_ids(run_dir), context
    assert not (run_dir / "archive.sock").exists(), context  # a killed driver's stale socket is gone at the end
    assert backed_up and not list(run_dir.glob("*.tmp")), context


def _shown_status(tmp_path, run_dir) -> tuple[str, str]:
    """The run's status in `atoll status`'s table (its first row), and in `atoll runs`."""
    table = atoll(tmp_path, "status", run_dir, COLUMNS="500").stdout  # wide: no cell wraps
    row = next(line for line in table.splitlines() if line.startswith("│"))
    [listed] = [run for run in map(json.loads, atoll(tmp_path, "runs", "--json").stdout.splitlines())
                if run["run_dir"] == str(run_dir.resolve())]
    return row.split("│")[2].strip(), listed["status"]


@pytest.mark.parametrize("args, needle", [
    (["configs/trading_sp500.toml", "--set", 'domain.options.assets=["SP500", "NOPE"]'],
     "domain.options.assets: unknown assets ['NOPE']"),
    (["configs/trading_sp500.toml", "--set", 'domain.options.validation_assets=["NOPE"]'],  # was a seed-failed run
     "domain.options.validation_assets: unknown assets ['NOPE']"),
    (["configs/trading_synthetic.toml", "--set", "domain.options.synthetic.bars=1500"],
     "domain.options: the market has 1500 bars: too few for lookback"),
    ([CONFIG, "--set", "islands.niche=map_elites", "--set", "islands.descriptor_bounds=[[0, 1], [0, 1], [0, 1]]"],
     "islands.descriptor_bounds: 3 [low, high] pairs, but domain 'inventory' reports 2 descriptors"),
    (["configs/milp_setcover.toml", "--set", "domain.options.search_size=huge"],
     "domain.options: search_size 'huge' is not a size of setcover"),
    ([CONFIG, "--max-evals", "0"], "run.max_evals: Input should be greater than or equal to 1"),
    ([CONFIG, "--ray-address", "127.0.0.1:1"], "--ray-address 127.0.0.1:1: no Ray cluster answers at 127.0.0.1:1"),
    ([CONFIG, "--ray-address", "not an address"], "--ray-address 'not an address': not an address"),
])
def test_bad_input_is_refused_before_the_run_exists(tmp_path, args, needle):
    run_dir = tmp_path / "run"
    out = atoll(tmp_path, "run", *args, "--run-dir", run_dir, timeout=60)
    assert out.returncode == 2 and needle in _one_line(out.stderr), out.stderr
    assert not run_dir.exists()


# A user domain whose seed program never returns, so the seed times out on any machine, however fast.
HANGING_SEED = tiny_domain("hang", "def act(state, params):\n    while True:\n        pass\n")


@pytest.mark.slow
def test_resuming_a_run_whose_seed_failed_says_so(tmp_path):
    run_dir = tmp_path / "run"
    (tmp_path / "hang.py").write_text(HANGING_SEED)
    (tmp_path / "hang.toml").write_text('[domain]\npath = "hang.py"\n')
    out = atoll(tmp_path, "run", tmp_path / "hang.toml", "--run-dir", run_dir, "--set", "islands.count=2",
                "--set", "evaluator.actors=1", "--set", "evaluator.sandbox.wall_s=1", "--no-report")
    assert out.returncode == 2 and "the seed program failed (TIMEOUT" in out.stderr
    again = atoll(tmp_path, "resume", run_dir, timeout=60)
    assert again.returncode == 2
    assert "the run's seed program failed (TIMEOUT" in _one_line(again.stderr)
    status = atoll(tmp_path, "status", run_dir)
    assert "seed-failed" in status.stdout and "atoll resume" not in status.stdout


def test_a_domain_that_raises_is_named_in_one_line_with_where(tmp_path):
    """The domain's own bug, raised in its evaluator actor: the exception and the line that raised it,
    not the last 500 characters of Ray's remote traceback, which began mid-line."""
    broken = tiny_domain("broken", "def act(state, params):\n    return 0.0\n").replace(
        "        return [-abs(", "        instances[len(instances)]\n        return [-abs(")
    (tmp_path / "broken.py").write_text(broken)
    (tmp_path / "broken.toml").write_text('[domain]\npath = "broken.py"\n')
    line = broken.splitlines().index("        instances[len(instances)]") + 1
    out = atoll(tmp_path, "run", tmp_path / "broken.toml", "--run-dir", tmp_path / "run", "--set", "islands.count=2",
                "--set", "evaluator.actors=1", "--no-report", timeout=120)
    assert out.returncode == 2
    assert (f"atoll: the seed program failed (FAILED: internal evaluator error: IndexError: list index out of range "
            f"(broken.py, line {line}, in simulate)); nothing to evolve from") in out.stderr.splitlines(), out.stderr


def test_a_damaged_archive_is_one_line_that_says_so(tmp_path):
    """An archive cut short (an unfinished copy of the run directory): DuckDB cannot read a block."""
    from store.duckdb_archive import DuckDBArchive
    from store.records import Candidate, EvalResult, Status

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        archive.record([(Candidate(f"p{i}", "r1", 0, 0, (), f"x = {i}\n" * 20, "seed", 0.0),
                         EvalResult(f"p{i}", "search", Status.OK, score=-i)) for i in range(3000)])
        archive.set_run_status("r1", "running")  # as a lost machine leaves it
    path = run_dir / "archive.duckdb"
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    cut = path.read_bytes()
    out = atoll(tmp_path, "resume", run_dir, timeout=60)
    assert out.returncode == 2, out.stderr
    line = _one_line(out.stderr)
    assert line.startswith("atoll: an archive cannot be read: Could not read enough bytes from file")
    assert "it was cut short" in line and "The file is damaged or cut short" in line
    assert path.read_bytes() == cut and "ray" not in out.stderr.lower()  # nothing written, no Ray started
    status = atoll(tmp_path, "status", run_dir)  # never an offer to resume it
    assert "damaged archive: " in status.stderr and "it was cut short" in status.stderr, status.stderr
    assert "Continue with" not in status.stdout


@pytest.mark.slow
def test_a_damaged_archive_is_resumed_from_its_backup_which_keeps_the_damaged_file(tmp_path):
    """A disk error after hours of search: the run's backup (made every controller.backup_every_s)
    is offered where the damage is reported, and `resume --from-backup` completes the budget from it."""
    run_dir, budget = tmp_path / "run", 8
    out = atoll(tmp_path, "run", CONFIG, "--run-dir", run_dir, "--max-evals", budget, "--no-report", *TINY,
                "--set", "controller.backup_every_s=0.3")
    assert out.returncode == 0, out.stderr
    backup, path = run_dir / "archive.backup.duckdb", run_dir / "archive.duckdb"
    saved = committed_ids(run_dir, backup.name)
    assert saved and saved <= committed_ids(run_dir)
    _, rows, _ = run_query(run_dir, "SELECT count(*) FROM events WHERE kind = 'archive-backed-up'")
    assert rows[0][0] >= 1
    shown = atoll(tmp_path, "status", run_dir).stdout  # when it was made, and what it holds
    assert f"backup: {backup}, of " in shown and (f", {len(saved)} search evaluations (if the archive is ever "
                                                  f"damaged: atoll resume {run_dir} --from-backup)") in shown, shown
    copy = tmp_path / "copy"  # the run with a disk error in the middle of its archive: a block's checksum fails
    shutil.copytree(run_dir, copy)
    _disk_error(copy / "archive.duckdb")
    for args in (["status", copy], ["query", copy, "SELECT count(*) FROM evaluations"], ["best", copy]):
        out = atoll(tmp_path, *args, timeout=60)
        line = _one_line(out.stderr)
        assert out.returncode == 2 and "Corrupt database file: computed checksum" in line, out.stderr
        assert line.endswith(f"can be resumed from, keeping the damaged file: atoll resume {copy} --from-backup"), line
    path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    cut = path.read_bytes()
    offer = f"can be resumed from, keeping the damaged file: atoll resume {run_dir} --from-backup"
    refused = atoll(tmp_path, "resume", run_dir, timeout=60)
    assert refused.returncode == 2 and offer in _one_line(refused.stderr), refused.stderr
    assert offer in atoll(tmp_path, "status", run_dir).stderr
    done = atoll(tmp_path, "resume", run_dir, "--from-backup", "--no-report")
    assert done.returncode == 0, done.stderr
    kept = list(run_dir.glob("archive.replaced-*.duckdb"))
    assert len(kept) == 1 and kept[0].read_bytes() == cut  # the damaged file, as it was
    assert "atoll: the archive is now its backup of " in done.stdout
    assert f"({len(saved)} search evaluations committed then;" in done.stdout
    assert "LLM calls" not in done.stdout  # a run that asks no model hears nothing of their budget
    assert saved <= committed_ids(run_dir) and counts(run_dir) == (budget, budget)
    again = atoll(tmp_path, "resume", tmp_path / "nowhere", "--from-backup")
    assert again.returncode == 2 and "holds no backup (archive.backup.duckdb)" in _one_line(again.stderr)
    lost = tmp_path / "lost"  # the archive itself gone, its backup left
    lost.mkdir()
    shutil.copyfile(backup, lost / backup.name)
    said = atoll(tmp_path, "status", lost)
    assert said.returncode == 2 and _one_line(said.stderr) == (
        f"atoll: {lost} is not a run directory (no archive.duckdb in it), but its backup is there "
        f"(archive.backup.duckdb): atoll resume {lost} --from-backup")


@pytest.mark.slow
@pytest.mark.timeout(600)  # two runs' Ray starts on a busy 2-core machine
def test_a_run_whose_sessions_are_all_shorter_than_the_backup_interval_is_backed_up(tmp_path):
    """A preemptible machine: every session ends before controller.backup_every_s. The interval counts
    from the run's first session (or its last backup), so the resume backs it up at its first commit;
    it counted from each driver's start, and such a run never had a backup, here or in backup_dir."""
    from store.duckdb_archive import DuckDBArchive

    run_dir = tmp_path / "run"
    first = atoll(tmp_path, "run", CONFIG, "--run-dir", run_dir, "--max-evals", 2, "--no-report", *TINY,
                  "--set", "controller.backup_every_s=3600")
    assert first.returncode == 0, first.stderr
    assert not (run_dir / "archive.backup.duckdb").exists()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:  # that session began two hours ago
        archive.con.execute("UPDATE events SET ts = ts - 7200 WHERE kind = 'started'")
    resumed = atoll(tmp_path, "resume", run_dir, "--set", "run.max_evals=3", "--no-report")
    assert resumed.returncode == 0, resumed.stderr
    assert committed_ids(run_dir, "archive.backup.duckdb")
    _, rows, _ = run_query(run_dir, "SELECT count(*) FROM events WHERE kind = 'archive-backed-up'")
    assert rows[0][0] >= 1


@pytest.mark.slow
def test_a_backup_of_another_run_never_replaces_a_run_whose_archive_reads(tmp_path):
    """The wrong file given at 3 a.m.: `resume DIR --from-backup FILE` where FILE holds another run and
    DIR's archive is whole is refused, DIR untouched; that run goes on in a folder of its own."""
    first, second = tmp_path / "first", tmp_path / "second"
    for run_dir in (first, second):
        out = atoll(tmp_path, "run", CONFIG, "--run-dir", run_dir, "--max-evals", 2, "--no-report", *TINY,
                    "--set", f"run.name={run_dir.name}")
        assert out.returncode == 0, out.stderr
    other, archive = first / "archive.duckdb", second / "archive.duckdb"
    held = archive.read_bytes()
    refused = atoll(tmp_path, "resume", second, "--from-backup", other)
    line = _one_line(refused.stderr)
    assert refused.returncode == 2 and f"--from-backup {other}: it holds run first-" in line, refused.stderr
    assert f"and {second} holds run second-" in line and "nothing was changed" in line, line
    assert line.endswith(f"resume into a new folder: atoll resume NEWDIR --from-backup {other}"), line
    assert archive.read_bytes() == held and not list(second.glob("archive.replaced-*")), list(second.iterdir())
    moved = atoll(tmp_path, "resume", tmp_path / "new", "--from-backup", other, "--no-report")
    assert moved.returncode == 0 and "the archive is now the backup" in moved.stdout, moved.stderr
    text = tmp_path / "notes.txt"  # not an archive at all: no folder is left made for it
    text.write_text("not a database\n" * 100)
    wrong = atoll(tmp_path, "resume", tmp_path / "newer", "--from-backup", text)
    line = _one_line(wrong.stderr)
    assert wrong.returncode == 2 and line.startswith(f"atoll: {text} cannot be read: "), wrong.stderr
    assert f'"{text}"' in line and "nothing was changed" in line and not (tmp_path / "newer").exists(), line


@pytest.mark.slow
def test_a_run_whose_machine_is_lost_resumes_elsewhere_from_its_copy_in_backup_dir(tmp_path):
    """controller.backup_dir (another disk or machine) gets a copy of each backup as RUN_ID.duckdb; with
    the run directory gone whole, `resume NEWDIR --from-backup FILE` makes NEWDIR and finishes the budget."""
    away, run_dir, budget = tmp_path / "mnt" / "atoll-backups", tmp_path / "machine" / "run", 8
    for folder, why in (("mnt/atoll-backups", "is relative"), (str(away), "is not a folder here")):
        refused = atoll(tmp_path, "run", CONFIG, "--run-dir", run_dir, *TINY, "--set", f"controller.backup_dir={folder}")
        assert refused.returncode == 2 and why in _one_line(refused.stderr), refused.stderr
        assert not run_dir.exists()  # refused before the run exists
    away.mkdir(parents=True)
    out = atoll(tmp_path, "run", CONFIG, "--run-dir", run_dir, "--max-evals", budget, "--no-report", *TINY,
                "--set", "controller.backup_every_s=0.3", "--set", f"controller.backup_dir={away}",
                "--set", "memory.backup_every_s=0.3")
    assert out.returncode == 0, out.stderr
    copies = sorted(away.iterdir())  # the run's backup, and the library's (memory across runs)
    assert [c.name.split("-")[0] for c in copies] == ["library", "run"], copies
    library_copy, copy = copies
    assert copy.suffix == library_copy.suffix == ".duckdb", copies
    assert f"; its backup copied to {library_copy}\n" in out.stdout, out.stdout
    assert f"backups every 0.3 s, also off this machine: {copy}\n" in out.stdout, out.stdout
    saved = committed_ids(away, copy.name)
    assert saved and saved <= committed_ids(run_dir)
    shown = atoll(tmp_path, "status", run_dir).stdout
    assert f"backup's copy off this machine: {copy}, of " in shown, shown
    assert f"(if this machine is lost: atoll resume NEWDIR --from-backup {copy})" in shown, shown
    assert f"library's copy off this machine: {library_copy}, of " in shown, shown  # memory across runs, too
    shutil.rmtree(tmp_path / "machine")  # the machine is lost, and its disk with it
    shown = atoll(tmp_path, "status", copy)  # what the copy holds, read where it lies
    assert shown.returncode == 0 and "running then" in shown.stdout, shown.stdout + shown.stderr
    assert (f"{copy} is an archive file (a backup, or its copy off a machine) of " in shown.stdout and
            f"to continue its run from it: atoll resume NEWDIR --from-backup {copy}" in shown.stdout), shown.stdout
    wrong = atoll(tmp_path, "resume", copy)  # a file is resumed into a run directory of its own
    assert wrong.returncode == 2 and _one_line(wrong.stderr) == (
        f"atoll: {copy} is an archive file, not a run directory: to continue its run from it, atoll resume NEWDIR "
        f"--from-backup {copy}"), wrong.stderr
    best = atoll(tmp_path, "best", copy, "--out", tmp_path / "best.py")
    assert best.returncode == 0 and (tmp_path / "best.py").read_text().strip() in best.stdout, best.stderr
    elsewhere = tmp_path / "elsewhere" / "run"
    library = tmp_path / "elsewhere" / "library.duckdb"  # that machine has no library yet
    done = atoll(tmp_path, "resume", elsewhere, "--from-backup", copy, "--no-report", "--set",
                 f"run.max_evals={budget + 4}", ATOLL_LIBRARY=str(library))
    assert done.returncode == 0, done.stderr
    assert (f"atoll: this machine had no library: the library's copy {library_copy} (of " in done.stdout and
            f"which knows this run, is now its library ({library})" in done.stdout), done.stdout
    import duckdb

    with duckdb.connect(str(library), read_only=True) as con:  # its skills and elites go on with the run
        assert (copy.stem,) in con.execute("SELECT run_id FROM runs").fetchall()
    assert f"atoll: the archive is now the backup {copy} of " in done.stdout, done.stdout
    assert f"({len(saved)} search evaluations committed then;" in done.stdout
    assert saved <= committed_ids(elsewhere) and counts(elsewhere) == (budget + 4, budget + 4)
    # the resumed run goes on copying to the same file (same run: its id and start are the archive's)
    assert saved <= committed_ids(away, copy.name) <= committed_ids(elsewhere)
    _, rows, _ = run_query(elsewhere, "SELECT data->>'away', data->>'away_error' FROM events "
                                      "WHERE kind = 'backup-copied'")
    assert rows and set(rows) == {(str(copy), None)}, rows
    missing = atoll(tmp_path, "resume", tmp_path / "other", "--from-backup", away / "nothing.duckdb")
    assert missing.returncode == 2 and "no such file" in _one_line(missing.stderr), missing.stderr
    assert not (tmp_path / "other").exists()


def _disk_error(path) -> None:
    """80 KB of noise from 200 KB on, as `dd if=/dev/urandom of=PATH bs=1k seek=200 count=80 conv=notrunc`."""
    assert path.stat().st_size > 280 * 1024
    with open(path, "r+b") as file:
        file.seek(200 * 1024)
        file.write(os.urandom(80 * 1024))


def test_resuming_a_completed_run_says_so_and_starts_nothing_and_the_domain_cannot_change(tmp_path):
    """Its evaluations all done: one line on how to give it more, exit 0, no Ray and no model started.
    A resume that would change the domain's options is refused: the scores so far were measured with
    the old ones (it was accepted, and the run went on mixing the two); a default given again is no change."""
    from controller.config import validate
    from store.duckdb_archive import DuckDBArchive
    from store.records import Candidate, EvalResult, Status

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = validate({"domain": {"name": "inventory"}, "run": {"max_evals": 2}}).model_dump(mode="json")
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", config)
        archive.record([(Candidate(f"p{i}", "r1", 0, i, ("p0",) if i else (), f"x = {i}", "seed", 0.0),
                         EvalResult(f"p{i}", "search", Status.OK, score=-1.0)) for i in range(2)])
        archive.set_run_status("r1", "completed", ended=True)
    started = time.monotonic()
    out = atoll(tmp_path, "resume", run_dir, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (f"r1 completed with its 2 of 2 evaluations; nothing to resume. Give it more with: atoll resume {run_dir} "
            f"--set run.max_evals=N (its held-out table: atoll report {run_dir})") in out.stdout
    assert "atoll resuming" not in out.stdout and time.monotonic() - started < 30  # Ray alone takes seconds to start
    changed = atoll(tmp_path, "resume", run_dir, "--set", "run.max_evals=4", "--set", "domain.options.search_periods=99",
                    timeout=60)
    assert changed.returncode == 2 and "Traceback" not in changed.stderr, changed.stderr
    assert ("--set domain.options.search_periods: a resume cannot change the domain or its options "
            "(domain.options.search_periods was null, would be 99): the run's 2 search scores") in changed.stderr
    from evaluators.domains.inventory.domain import InventoryConfig

    same = atoll(tmp_path, "resume", run_dir, "--set", "run.max_evals=2",
                 "--set", f"domain.options.search_periods={InventoryConfig().search_periods}", timeout=60)
    assert same.returncode == 0 and "nothing to resume" in same.stdout, same.stderr
