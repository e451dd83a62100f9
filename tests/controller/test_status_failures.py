"""`atoll status` (and a run's end) says why its children fail: the most common last lines of their errors."""
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

TRACEBACK = ("the policy raised:\nTraceback (most recent call last):\n  File \"<candidate>\", line 8, in policy\n"
             "    return close[:, idx]\nIndexError: index 284 is out of bounds for axis 1 with size 260\n")


def test_status_lists_the_most_common_failure_reasons_by_their_last_line(tmp_path, atoll_cli):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    results = [(Status.OK, None), *[(Status.FAILED, TRACEBACK)] * 3,
               (Status.TIMEOUT, "CPU-time limit of 30 s exceeded"),
               (Status.INVALID, "bar 1991-12-04: positions must be in [-1, 1], got -2.9"),
               (Status.INVALID, "bar 2003-05-17: positions must be in [-1, 1], got 1.25e+03"),  # the same, its numbers aside
               (Status.RACED, "stopped early: clearly worse than its parent")]
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
        archive.record([(Candidate(f"p{i}", "r1", 0, i, ("p0",) if i else (), f"x = {i}", "embedded:perturb", 0.0),
                         EvalResult(f"p{i}", "search", status, score=-1.0 if status == Status.OK else None,
                                    error=error))
                        for i, (status, error) in enumerate(results)])
        archive.set_run_status("r1", "completed")
    out = atoll_cli("status", str(run_dir)).stdout  # 80 columns: a long reason wraps onto the next rows
    table = out.split("failed search evaluations, the most common reasons", 1)[1]
    rows = [" ".join(line.strip("│ ").split()) for line in table.splitlines() if line.startswith("│")]
    text = "\n".join(rows)
    assert "FAILED │ 3 │ IndexError: index 284" in text, table
    assert "TIMEOUT │ 1 │ CPU-time limit of 30 s exceeded" in text and "INVALID │ 2 │ bar 1991-12-04" in text
    assert "RACED" not in table and "Traceback" not in table


def test_status_names_the_librarys_copy_and_waits_for_no_dead_backup_dir(tmp_path, atoll_cli):
    """The library's copy in controller.backup_dir is looked for in a thread: where the folder does not
    answer (a FIFO's open blocks, as a file on a mount whose server is gone does), status says so
    after a few seconds and ends; where it holds no copy that knows the run, it says that."""
    import os
    import time

    away = tmp_path / "away"
    away.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {"controller": {"backup_dir": str(away)}, "memory": {"enabled": True}})
        archive.set_run_status("r1", "completed")
    out = atoll_cli("status", str(run_dir)).stdout
    assert f"library's copy off this machine: none in {away} knows this run yet" in out, out
    os.mkfifo(away / "library-host-0123abcd.duckdb")  # no one ever writes to it
    start = time.monotonic()
    out = atoll_cli("status", str(run_dir), timeout=60).stdout
    assert f"library's copy off this machine: {away} did not answer within 5 s" in out, out
    assert time.monotonic() - start < 30


def test_a_run_whose_driver_died_before_its_search_began_is_shown_stopped_with_the_resume(tmp_path, atoll_cli):
    """A driver killed while Ray started leaves its run `created`: status showed `created`, as if it were about
    to start, and no way on; it is a run stopped without ending, which a resume begins."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", {})
    out = atoll_cli("status", str(run_dir)).stdout
    assert "stopped without ending" in out and " created " not in out, out
    assert f"Continue with: atoll resume {run_dir}" in " ".join(out.split()), out
