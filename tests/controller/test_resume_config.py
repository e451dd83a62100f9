"""What `atoll resume --set` may change: the run's data at a new path (the same content, as after
restoring a run and its data elsewhere), and budgets no lower than the work already done.
The real CLI in subprocesses, real DuckDB (and Ray for the run that makes the archive)."""
import re
import shutil
from pathlib import Path

import pytest

from store.duckdb_archive import DuckDBArchive
from tests.controller.runs import TINY, atoll
from tests.userdata_files import INVENTORY, write_demand

KEY = "domain.options.demand_history.path"


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def _stored(run_dir) -> dict:
    with DuckDBArchive(run_dir / "archive.duckdb", read_only=True) as archive:
        return archive.get_run(archive.latest_run_id())


def _scored(run_dir) -> int:
    """Search evaluations that scored (status OK)."""
    with DuckDBArchive(run_dir / "archive.duckdb", read_only=True) as archive:
        return archive.con.execute("SELECT count(*) FROM evaluations WHERE split = 'search' AND status = 'OK'"
                                   ).fetchone()[0]


@pytest.mark.slow
@pytest.mark.timeout(600)  # two runs' Ray starts on a busy 2-core machine
def test_a_run_on_moved_data_resumes_from_the_new_path_and_only_on_the_same_content(tmp_path):
    old, new = tmp_path / "old", tmp_path / "restored"
    old.mkdir()
    write_demand(old / "demand.csv")
    (old / "inventory.toml").write_text(INVENTORY)
    run_dir = tmp_path / "run"
    first = atoll(tmp_path, "run", old / "inventory.toml", "--run-dir", run_dir, "--max-evals", 2, "--no-report",
                  *TINY)
    assert first.returncode == 0, first.stderr
    pinned = _stored(run_dir)["config"]["domain"]["options"]["demand_history"]["sha256"]
    scored = _scored(run_dir)
    shutil.move(old, new)  # the machine was lost: the run and its data restored to new paths

    lost = atoll(tmp_path, "resume", run_dir, "--no-report", timeout=60)
    assert lost.returncode == 2
    assert _one_line(lost.stderr) == (
        f"atoll: domain.options.demand_history: file {old / 'demand.csv'} does not exist; if it moved, point the "
        f"run at the moved copy (it must hold the same content): --set {KEY}=NEWPATH")

    report = atoll(tmp_path, "report", run_dir, timeout=60)  # the table: only after the resume points at the data
    assert report.returncode == 2 and _one_line(report.stderr) == (
        f"atoll: domain.options.demand_history: file {old / 'demand.csv'} does not exist; if it moved, point the "
        f"run at the moved copy (it must hold the same content): --set {KEY}=NEWPATH, given to atoll resume "
        f"{run_dir} (it keeps the new path; then atoll report {run_dir})")

    write_demand(tmp_path / "other.csv", seed=4)
    other = atoll(tmp_path, "resume", run_dir, "--set", f"{KEY}={tmp_path / 'other.csv'}", timeout=60)
    assert other.returncode == 2
    line = _one_line(other.stderr)
    assert line.startswith(f"atoll: --set {KEY}: {tmp_path / 'other.csv'} is not the run's data"), line
    assert re.search(rf"sha256 is [0-9a-f]{{12}}\.\.\., the run's is {pinned[:12]}\.\.\.\).*the same file", line)
    assert _stored(run_dir)["config"]["domain"]["options"]["demand_history"]["path"] == str(old / "demand.csv")

    moved = atoll(tmp_path, "resume", run_dir, "--no-report", "--set", f"{KEY}={new / 'demand.csv'}",
                  "--set", "run.max_evals=4")
    assert moved.returncode == 0, moved.stderr
    assert (f"atoll: domain.options.demand_history: the run now reads its data from {new / 'demand.csv'} (the same "
            f"content as {old / 'demand.csv'}, sha256 {pinned[:12]}...)") in moved.stderr.splitlines()
    assert "search completed: 4 evaluations" in moved.stdout and _scored(run_dir) > scored  # on the moved file
    data = _stored(run_dir)["config"]["domain"]["options"]["demand_history"]
    assert (data["path"], data["sha256"]) == (str(new / "demand.csv"), pinned)
    again = atoll(tmp_path, "resume", run_dir, timeout=60)  # the next resume reads the new path by itself
    assert again.returncode == 0 and "nothing to resume" in again.stdout, again.stderr


def test_a_resume_takes_moved_data_by_its_content_and_no_other_change_of_it(tmp_path):
    """The library's fingerprint leaves a data option's path out: what refuses other data (or other
    settings of it) on a resume is still said in one line naming the key. No run: the stored config alone."""
    from controller.cli import UserError
    from controller.config import ConfigError, load_config
    from controller.resume_config import resumed_config

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_demand(old / "demand.csv")
    (old / "inventory.toml").write_text(INVENTORY)
    stored = load_config(old / "inventory.toml")[0].model_dump(mode="json")
    digest = stored["domain"]["options"]["demand_history"]["sha256"]
    shutil.move(old, new)

    config, said = resumed_config(stored, [f"{KEY}={new / 'demand.csv'}"], 3)
    assert config.domain.options["demand_history"]["path"] == str(new / "demand.csv")
    assert said == [(f"domain.options.demand_history: the run now reads its data from {new / 'demand.csv'} (the "
                     f"same content as {old / 'demand.csv'}, sha256 {digest[:12]}...)")]
    with pytest.raises(UserError) as err:
        resumed_config(stored, [f"{KEY}={new / 'demand.csv'}", "domain.options.demand_history.block=5"], 3)
    assert str(err.value).startswith("--set domain.options.demand_history.block: a resume cannot change the domain "
                                     "or its options (domain.options.demand_history.block was 7, would be 5): the "
                                     "run's 3 search scores were measured with the old ones")
    write_demand(new / "demand.csv", seed=4)  # other content at the path the run now reads
    with pytest.raises(ConfigError, match=rf"demand.csv changed since the run recorded it .*the run's is "
                                          rf"{digest[:12]}\.\.\.\): restore it"):
        resumed_config(config.model_dump(mode="json"), [], 3)


def _interrupted_run(tmp_path, programs: int, islands: int = 1) -> tuple[Path, dict]:
    """A run directory whose archive holds `programs` scored programs on `islands` islands and a run
    stopped before its 8 evaluations; (the directory, the stored config)."""
    from controller.config import validate
    from evaluators.secrets import RunSecrets
    from store.records import Candidate, EvalResult, Status

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = validate({"domain": {"name": "inventory"}, "run": {"max_evals": 8},
                       "islands": {"count": islands}}).model_dump(mode="json")
    with DuckDBArchive(run_dir / "archive.duckdb") as archive:
        archive.create_run("r1", config)
        archive.save_secrets("r1", RunSecrets.fixed(0).to_record())
        archive.record([(Candidate(f"p{i}", "r1", i % islands, i, ("p0",) if i else (), f"x = {i}",
                                   "embedded:tweak" if i else "seed", 0.0),
                         EvalResult(f"p{i}", "search", Status.OK, score=-1.0)) for i in range(programs)])
        archive.set_run_status("r1", "interrupted", ended=True)
    return run_dir, config


def test_a_resume_cannot_lower_the_evaluations_below_those_done(tmp_path):
    """As `atoll set` on a live run: one line, exit 2, nothing changed (it was accepted, printed
    '4/2 evaluations done' and ended the run as completed at once)."""
    run_dir, _ = _interrupted_run(tmp_path, 4)
    out = atoll(tmp_path, "resume", run_dir, "--set", "run.max_evals=2", timeout=60)
    assert out.returncode == 2
    assert _one_line(out.stderr) == ("atoll: run.max_evals: 2 is below the 4 evaluations finished or under way; "
                                     "give at least 4")
    run = _stored(run_dir)
    assert run["status"] == "interrupted" and run["config"]["run"]["max_evals"] == 8


def test_a_resume_cannot_drop_islands_and_a_refused_one_changes_nothing(tmp_path):
    """Fewer islands than the run's programs were made on: one line, exit 2, the stored config
    unchanged (it raised a traceback rebuilding the islands, and had stored the change first, so
    a plain `atoll resume` raised it too and the run could not be continued)."""
    run_dir, _ = _interrupted_run(tmp_path, 4, islands=2)
    out = atoll(tmp_path, "resume", run_dir, "--set", "islands.count=1", timeout=60)
    assert out.returncode == 2
    assert _one_line(out.stderr) == (
        "atoll: --set islands.count: 1 is below the run's 2 islands, whose programs a resume puts back on them; "
        "a resume may add islands, never remove them (give at least 2)")
    run = _stored(run_dir)
    assert run["status"] == "interrupted" and run["config"]["islands"]["count"] == 2


def test_a_resume_refused_for_its_library_keeps_the_stored_config(tmp_path):
    """A `--set` the library cannot use is refused in one line before Ray starts, and none of the
    resume's changes is stored (they were, before the refusal, so every later resume met it too)."""
    run_dir, config = _interrupted_run(tmp_path, 1)
    out = atoll(tmp_path, "resume", run_dir, "--set", "run.max_evals=10", "--set",
                "memory.library=/proc/atoll/library.duckdb", timeout=60)
    assert out.returncode == 2
    assert _one_line(out.stderr).startswith("atoll: cannot create the library's folder /proc/atoll")
    assert "atoll resuming" not in out.stdout
    run = _stored(run_dir)
    assert run["status"] == "interrupted" and run["config"]["run"]["max_evals"] == 8
    assert run["config"]["memory"]["library"] == config["memory"]["library"]
