"""The CLI's commands; each returns an exit status."""
from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from controller import rundir
from controller.cli import UserError
from controller.config import load_config
from controller.resume_config import DataMissing, edited_domain_file, resumed_config
from controller.memory_commands import cmd_runs, cmd_skills, library_query  # noqa: F401  (the library's commands)
from controller.domain_commands import cmd_check, cmd_new_domain  # noqa: F401  (the CLI finds commands here)
from controller.control_commands import cmd_continue, cmd_pause, cmd_set, cmd_stop, cmd_watch  # noqa: F401
from controller.submit import cmd_jobs, cmd_submit, resume_command, storage_root  # noqa: F401
from controller.read_commands import cmd_best, cmd_query, cmd_status, console  # noqa: F401
from controller.progress_command import cmd_progress  # noqa: F401
from controller.lineage_command import cmd_lineage  # noqa: F401
from store import signals



def _latest_run(archive, run_dir: Path, verb: str) -> tuple[str, dict]:
    run_id = archive.latest_run_id()
    run = archive.get_run(run_id) if run_id else None
    if run is None:
        raise UserError(f"{run_dir} holds no run to {verb}")
    return run_id, run


def cmd_run(args) -> int:
    """Everything that can be refused is checked (config, run directory, Ray address) before the run exists."""
    from store.live import LiveReads

    overrides = list(args.set) + ([f"run.max_evals={args.max_evals}"] if args.max_evals is not None else [])
    config, text = load_config(args.config, overrides)
    root = storage_root(config, args.run_dir)  # in a Ray job: never inside Ray's copy of the working dir
    protections = _sandbox_protections(config)
    _memory_checked(config)
    _models_checked(config)
    _backup_dir_checked(config)
    if args.run_dir:
        rundir.check_free(Path(args.run_dir))
    rundir.check_can_make(Path(args.run_dir) if args.run_dir else root)
    args.control = _control_setup(config)
    _connect(args.ray_address)
    run_dir = rundir.claim(config.run.name, args.run_dir, root)
    # for a stop before the search (controller.cli): a run directory with its archive resumes
    args.continue_with = lambda: resume_command(run_dir) if (run_dir / rundir.ARCHIVE).exists() else None
    # a directory made here is named for the run and its start already (rundir.claim); one given is
    # named by the user, and may hold another run of the same name later (after its archive was moved)
    run_id = run_dir.resolve().name + ("-" + time.strftime("%H%M%S") if args.run_dir else "")
    secrets = _new_secrets(config)

    def setup(archive):
        archive.save_secrets(run_id, secrets.to_record())
        archive.record_protections(run_id, protections)

    with rundir.create_archive(run_dir, run_id, config.model_dump(mode="json"), text, setup) as archive, \
            LiveReads(archive, run_dir):  # `atoll query` asks it while the run is live
        console.print(f"atoll run {run_id} in {run_dir} (resume with: {resume_command(run_dir)})",
                      soft_wrap=True)
        return _search(config, archive, run_id, run_dir, args)


def _new_secrets(config):
    """The secret randomness of a new run or baseline table: drawn from the OS unless run.replay_seed fixes it."""
    from evaluators.secrets import RunSecrets

    if config.run.replay_seed is None:
        return RunSecrets.draw()
    return RunSecrets.fixed(config.run.replay_seed)


def _say_if_replayable(replay_seed: int | None) -> None:
    from evaluators.secrets import replay_note

    if replay_seed is not None:
        console.print(replay_note(replay_seed), style="bold yellow", soft_wrap=True)


def _say_if_edited(config, done: int) -> None:
    note = edited_domain_file(config, done)
    if note:
        print(f"atoll: {note}", file=sys.stderr, flush=True)


def _stored_secrets(archive, run_id: str, run_dir: Path):
    """The run's secrets from its archive; a run without them cannot be continued comparably."""
    from evaluators.secrets import RunSecrets

    record = archive.load_secrets(run_id)
    if record is None:
        raise UserError(f"{run_dir} predates secret randomness (its archive holds no run_secrets row), so new "
                        "scores would not be comparable with its old ones; start a new run")
    _say_if_replayable(archive.get_run(run_id)["config"].get("run", {}).get("replay_seed"))
    return RunSecrets.from_record(record)


def cmd_resume(args) -> int:
    from store.live import LiveReads

    run_dir = Path(args.run_dir)
    from_backup = getattr(args, "from_backup", None)  # True: the run directory's own backup; else a FILE
    source = Path(from_backup).expanduser() if from_backup and from_backup is not True else None
    if from_backup:
        from controller.backup import restore

        console.print(restore(run_dir, source), soft_wrap=True)
    with rundir.open_archive(run_dir) as archive, LiveReads(archive, run_dir):
        run_id, run = _latest_run(archive, run_dir, "resume")
        args.continue_with = lambda: resume_command(run_dir)
        _refuse_failed_seed(archive, run_id)
        done = archive.count_evaluations(run_id, "search")
        changes = list(getattr(args, "set", None) or ())  # e.g. a resume that adds or drops an LLM model
        config, moved = resumed_config(run["config"], changes, done)
        _say_if_edited(config, done)
        _models_checked(config)
        _backup_dir_checked(config)
        if source is not None:
            _library_from_copy(config, source, run_id)
        finished = run["status"] == "completed" and done >= config.run.max_evals  # nothing left: no Ray, no models
        if not finished:  # what can refuse the resume does so before its changes are stored
            _library_checked(config)
        protections = _sandbox_protections(config)
        args.control = _control_setup(config)
        if changes:
            archive.con.execute("UPDATE runs SET config = ? WHERE run_id = ?",
                                [json.dumps(config.model_dump(mode="json")), run_id])
            console.print(f"atoll config changed for the rest of the run: {', '.join(changes)}")
            for line in moved:
                print(f"atoll: {line}", file=sys.stderr, flush=True)
        archive.record_protections(run_id, protections)
        if finished:
            best = archive.best_program(run_id, "search")
            try:  # what a library that was not written at the run's end missed (a full disk, a busy file)
                note = _memory_checked(config, archive, run_id, run_dir, "completed").finish(
                    "completed", done, best and best["score"])
            except UserError as exc:  # nothing to resume either way: the library's trouble is a note here
                note = f"library not updated ({exc})"
            if note:
                console.print(f"[atoll] {note}", soft_wrap=True)
            console.print(f"atoll: {run_id} completed with its {done} of {config.run.max_evals} evaluations; nothing "
                          f"to resume. Give it more with: atoll resume {run_dir} --set run.max_evals=N (its held-out "
                          f"table: atoll report {run_dir})", soft_wrap=True)
            return 0
        console.print(f"atoll resuming {run_id}: {done}/{config.run.max_evals} evaluations done")
        _connect(args.ray_address)
        return _search(config, archive, run_id, run_dir, args)


def _library_from_copy(config, source: Path, run_id: str) -> None:
    """A run resumed from its copy in controller.backup_dir (its machine lost): the library's copy in
    the same folder that knows the run becomes this machine's library where it has none yet, so its
    skills and elites go on with the run; beside another library it is named, and left there."""
    from controller.backup import library_copy_for, stamp
    from store.duckdb_archive import ArchiveDamaged, copy_whole
    from store.library import default_path

    if not config.memory.enabled:
        return
    copy = library_copy_for(source.parent, run_id)
    if copy is None:
        return
    library = default_path(config.memory.library)
    if library.exists():
        console.print(f"atoll: the library's copy {copy} (of {stamp(copy.stat().st_mtime)}) knows this run; this "
                      f"machine's library, {library}, is used as it is (to go on with the copy instead, point "
                      "ATOLL_LIBRARY at a copy of it)", soft_wrap=True)
        return
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
        copy_whole(copy, library)
    except (OSError, ArchiveDamaged) as exc:  # the run goes on with a library of its own
        why = getattr(exc, "strerror", None) or str(exc)
        console.print(f"atoll: the library's copy {copy}, which knows this run, could not be put in place ({library}: "
                      f"{why}); the run goes on with a new library", soft_wrap=True)
        return
    console.print(f"atoll: this machine had no library: the library's copy {copy} (of {stamp(copy.stat().st_mtime)}), "
                  f"which knows this run, is now its library ({library})", soft_wrap=True)


def _library_checked(config) -> None:
    """A resume's library opens, or one line (memory.library a path it cannot use). Its warm start
    is not planned again: the run's archive keeps the plan it began with."""
    from controller.memory import open_library
    from store.library import LibraryError

    try:
        open_library(config)
    except LibraryError as exc:
        raise UserError(str(exc)) from None


def _backup_dir_checked(config) -> None:
    from controller.backup import check_backup_dir

    check_backup_dir(config.controller.backup_dir)


def _models_checked(config) -> None:
    """What the driver can know of each LLM model is there: its API key, read here, and a local
    model's llama.cpp and default weights. A missing one is a line before the run exists (or
    before a resume starts Ray), not an error after it started. (A vLLM model's environment is
    the GPU node's, which may differ from this one's: its server says what it lacks.)"""
    from workers.llm.client import api_key
    from workers.llm.local_server import gguf_problem, missing

    for cfg in config.mutator.llm.models if config.mutator.llm else ():
        lacking = missing(cfg) if cfg.backend == "local" else []
        if lacking:
            what, how = zip(*lacking)
            raise UserError(f"mutator.llm model {cfg.name!r} (backend = \"local\") cannot start without "
                            f"{' and '.join(what)}; install {'them' if len(how) > 1 else 'it'} with: "
                            f"{' and: '.join(how)}")
        problem = gguf_problem(cfg.gguf) if cfg.backend == "local" and cfg.gguf else ""
        if problem:
            raise UserError(f"mutator.llm model {cfg.name!r}: gguf: {problem}; set gguf to a llama.cpp model "
                            "file (.gguf), or leave it out for the default model")
        env, file = getattr(cfg, "api_key_env", None), getattr(cfg, "api_key_file", None)
        try:
            api_key(env, file)
        except ValueError as exc:
            where = ("set it in this command's environment (it is read here and handed to the model's worker, "
                     "never stored), or give the model api_key_file" if env else "put the key on its first line")
            raise UserError(f"mutator.llm model {cfg.name!r}: {exc}; {where}") from None


def _memory_checked(config, archive=None, run_id="", run_dir=None, status="running"):
    """The run's memory (library, warm start), its first write under `status`, or a one-line error; only
    a check without an archive."""
    from controller.memory import RunMemory, check_memory
    from controller.warm_start import WarmStartError
    from evaluators.registry import get_domain_class
    from store.library import LibraryError

    try:
        if archive is None:
            return check_memory(config)
        return RunMemory(config, archive, run_id, run_dir, get_domain_class(config.domain).entry_point, status)
    except (LibraryError, WarmStartError) as exc:
        raise UserError(str(exc)) from None


def _sandbox_protections(config) -> list[str]:
    """The sandbox's protections on this machine, printed once; refuses if a required one cannot hold."""
    from evaluators.sandbox.probe import SandboxRefused, required

    try:
        held = required(config.evaluator.sandbox)
    except SandboxRefused as exc:
        raise UserError(str(exc)) from None
    console.print(f"sandbox: {', '.join(held)}", soft_wrap=True)
    return held


def _refuse_failed_seed(archive, run_id: str) -> None:
    from controller.loop import stored_seed_error

    error = stored_seed_error(archive, run_id)
    if error:
        raise UserError(f"the run's seed program failed ({error}); there is nothing to evolve from: "
                        "start a new run once the seed program can score")


def _guard_disk(run_dir: Path, work) -> int:
    """`work()`'s exit status; a full disk on the way stops it with one line and exit status 1."""
    from controller.faults import disk_full, disk_full_message

    try:
        return work()
    except Exception as exc:
        if not disk_full(exc, run_dir):
            raise
    print(f"atoll: {disk_full_message(run_dir)}", file=sys.stderr)
    return 1


def _search(config, archive, run_id, run_dir, args) -> int:
    if config.controller.backup_dir and config.controller.backup_every_s:  # where a lost machine's run is
        from controller.backup import away_path

        console.print(f"backups every {config.controller.backup_every_s:g} s, also off this machine: "
                      f"{away_path(config.controller.backup_dir, run_id)}", soft_wrap=True)
    return _guard_disk(run_dir, lambda: _search_and_report(config, archive, run_id, run_dir, args))


def _search_and_report(config, archive, run_id, run_dir, args) -> int:
    """The search, then its held-out report."""
    from controller.actors import new_evaluator
    from controller.loop import Search

    memory = _memory_checked(config, archive, run_id, run_dir)
    archive.set_run_status(run_id, "running")
    hide = (str(run_dir.resolve()),)
    secrets = _stored_secrets(archive, run_id, run_dir)
    search = Search(config, archive, run_id, run_dir, hide=hide, secrets=secrets, memory=memory)
    status = _steered(search, run_dir, getattr(args, "control", None))
    archive.set_run_status(run_id, status, ended=True)
    note = memory.finish(status, search.done, search.best_score)
    if note:
        console.print(f"[atoll] {note}", soft_wrap=True)
    if status == "seed-failed":
        raise UserError(f"the seed program failed ({search.seed_error}); nothing to evolve from")
    console.print(f"search {status}: {archive.count_evaluations(run_id, 'search')} evaluations")
    if status == "stalled":
        console.print(f"no mutator had a new program to propose (said above); everything finished is committed. "
                      f"Continue with: {resume_command(run_dir)}", soft_wrap=True)
    _llm_summary(archive, run_id)
    if status != "interrupted" and not args.no_report:
        return _report(archive, run_id, search.domain, search.ready_evaluators, run_dir,
                       lambda: new_evaluator(config, hide, secrets=secrets))
    if status == "interrupted":
        console.print(f"stopped; everything finished is committed. Continue with: {resume_command(run_dir)}",
                      soft_wrap=True)
    return 130 if status == "interrupted" else 0


def _control_setup(config):
    """The control plane's bind address and token, checked before the run starts (None: disabled)."""
    from controller.control import prepare

    return prepare(config.control)


def _steered(search, run_dir: Path, setup) -> str:
    """`search.run()` with its control plane served beside it (`atoll watch|pause|continue|stop|set`)."""
    from controller.control_server import ControlPlane

    with ControlPlane(setup, run_dir, search.helm.steering) as plane:
        if plane.address:
            console.print(f"steer it with: atoll watch|pause|continue|stop|set {run_dir} (control plane on "
                          f"{plane.address})", soft_wrap=True)
        status = search.run()
        plane.end(status)
    return status


def _llm_summary(archive, run_id) -> None:
    from controller.llm_report import archive_fetch, print_summary

    print_summary(console, archive_fetch(archive), run_id)


def _report(archive, run_id, domain, evaluators, run_dir, new_evaluator, again: bool = False) -> int:
    """The held-out table; Ctrl-C (or SIGTERM) stops it with what finished kept. `evaluators()` gives
    the evaluators, called only if something is to be evaluated. A row that did not end OK is named
    with the command that scores it again (`again`: that command)."""
    from controller.report import heldout_report, not_ok

    _racing_summary(archive, run_id)
    try:
        with signals.ctrl_c_as_such():
            results = heldout_report(archive, run_id, domain, evaluators, console, new_evaluator, again)
        lines = not_ok(results)
        if lines:
            console.print("; ".join(lines) + f". To score {'it' if len(lines) == 1 else 'them'} again: atoll report "
                          f"{run_dir} --again (a timeout on a busy machine: give more time first with atoll resume "
                          f"{run_dir} --set evaluator.sandbox.wall_s=N)", soft_wrap=True)
    except KeyboardInterrupt:
        signals.stopping()
        console.print("held-out report stopped. The search is committed, and so is every held-out result "
                      f"that finished. Print the table (scoring only what is missing) with: atoll report {run_dir}",
                      soft_wrap=True)  # one line: the command must survive copy and paste
        return 130
    return 0


def _racing_summary(archive, run_id) -> None:
    """One line on the search evaluations racing stopped early (none: nothing printed)."""
    raced, seen, total, seconds = archive.con.execute(
        "SELECT count(*), sum(CAST(json_extract(metrics, '$.instances_seen') AS INTEGER)), "
        "sum(CAST(json_extract(metrics, '$.instances') AS INTEGER)), sum(duration_s) FROM evaluations "
        "WHERE run_id = ? AND split = 'search' AND status = 'RACED'", [run_id]).fetchone()
    if raced:
        console.print(f"racing: {raced} search evaluations stopped early as clearly worse than their parent "
                      f"({seen} of {total} instances scored, {seconds:.0f} s); they are partial, never a best "
                      "(SQL: SELECT * FROM raced)", soft_wrap=True)


def cmd_report(args) -> int:
    from store.live import LiveReads

    run_dir = Path(args.run_dir)
    try:
        archive = rundir.open_archive(run_dir)
    except rundir.NotWritable as unwritable:  # a read-only copy: read it only, if nothing is left to store
        with rundir.open_archive(run_dir, read_only=True) as archive:
            return _report_on(archive, run_dir, args, unwritable)
    with archive, LiveReads(archive, run_dir):
        return _report_on(archive, run_dir, args)


def _report_on(archive, run_dir: Path, args, unwritable: rundir.NotWritable | None = None) -> int:
    from controller.actors import evaluator_count, new_evaluator
    from evaluators.registry import get_domain

    run_id, run = _latest_run(archive, run_dir, "report on")
    args.continue_with = lambda: f"atoll report {run_dir}"
    if run["status"] == "running":
        raise UserError(f"{run_dir}: the run is marked running (live, or stopped without ending); "
                        f"finish it with: atoll resume {run_dir}")
    done = archive.count_evaluations(run_id, "search")
    if done == 0:
        raise UserError(f"{run_dir} has no search evaluations yet; nothing to report")
    try:  # the stored config as a resume reads it: a data file that moved says how to point at it
        config, _ = resumed_config(run["config"], [], done)
    except DataMissing as exc:
        raise UserError(f"{exc}, given to atoll resume {run_dir} (it keeps the new path; then atoll report "
                        f"{run_dir})") from None
    _say_if_edited(config, done)
    secrets = _stored_secrets(archive, run_id, run_dir)
    domain = get_domain(config.domain, secrets=secrets)
    if unwritable is not None:
        _read_only_report(archive, run_id, domain, unwritable, args.again)
    hide = (str(run_dir.resolve()),)

    def evaluators():  # Ray and the evaluators only for a report with something to evaluate
        _connect(args.ray_address)
        return [new_evaluator(config, hide, secrets=secrets) for _ in range(evaluator_count(config))]
    return _guard_disk(run_dir, lambda: _report(archive, run_id, domain, evaluators, run_dir,
                                                lambda: new_evaluator(config, hide, secrets=secrets), args.again))


def _read_only_report(archive, run_id: str, domain, unwritable: rundir.NotWritable, again: bool = False) -> None:
    """A report that may not write the archive goes on only if it would write nothing: every held-out
    result stored (and, `again`, every one OK), and the archive at this version's schema. Else the
    refusal says what is missing."""
    from controller.crowning import crowned
    from controller.report import heldout_programs, not_ok
    from store.duckdb_archive import migrations

    programs, stored = heldout_programs(archive, run_id, domain, crowned(archive, run_id, None, None))
    failed = not_ok(stored) if again else []
    if failed:
        raise unwritable.because(f"atoll report --again needs to write it: {len(failed)} held-out results did not "
                                 "end OK")
    if len(stored) < len(programs):
        lacking = len(programs) - len(stored)
        raise unwritable.because(f"atoll report needs to write it: it lacks {lacking} of the {len(programs)} "
                                 "held-out results")
    if {version for version, *_ in migrations()} - set(archive.schema_versions()):
        raise unwritable.because("atoll report needs to write it: the archive predates this version's schema")
    console.print(f"[atoll] {unwritable.run_dir} is not writable here; every held-out result is in its archive, "
                  "so the report reads it only", soft_wrap=True)


def _connect(address) -> None:
    """Ray; then Atoll's stop on Ctrl-C and SIGTERM again, since ray.init puts a sys.exit of its own on SIGTERM."""
    from controller.actors import connect

    connect(address)
    stop_on_signals()


def stop_on_signals() -> None:
    """Ctrl-C, SIGTERM (`ray job stop`, a scheduler's kill) and a hangup stop a run, resume or report cleanly.
    The first raises KeyboardInterrupt; whoever catches it (the loop, the report, `controller.cli.main`)
    begins the stop, and from then on the next ones get one line (`store.signals.stopping`). One
    more within STOP_GRACE_S gets that line too: the first is still on its way to its catcher, through
    `with` blocks closing the archive or the control plane, and a second KeyboardInterrupt would break
    those off. After that it raises again: the first one was lost where Python ignores exceptions (an
    at-fork handler, a destructor), and the run must not go on saying it is stopping."""
    _FIRST_STOP.clear()
    signal.signal(signal.SIGINT, _stop_cleanly)
    signal.signal(signal.SIGTERM, _stop_cleanly)
    if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # under nohup the run outlives its terminal
        signal.signal(signal.SIGHUP, _stop_cleanly)  # else a hangup (a lost ssh session) stops it as Ctrl-C
    if sys.unraisablehook is not _quiet_lost_stops:
        _quiet_lost_stops.before = sys.unraisablehook
        sys.unraisablehook = _quiet_lost_stops


def _quiet_lost_stops(unraisable) -> None:
    """No 'Exception ignored ... Traceback' for a stop lost where Python ignores exceptions (the
    next signal stops, see `stop_on_signals`); anything else as Python says it."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        _quiet_lost_stops.before(unraisable)


STOP_GRACE_S = 3.0
_FIRST_STOP: list[float] = []  # when the first signal of a stop not yet begun was raised


def _stop_cleanly(signum, frame):  # imports nothing: a signal may come in the middle of an import
    now = time.monotonic()
    if signum == signal.SIGHUP:
        signals.off_the_terminal()
    if _FIRST_STOP and now - _FIRST_STOP[0] < STOP_GRACE_S:
        signals.still_stopping(signum)
        return
    _FIRST_STOP[:] = [now]
    signals.STOPPED_BY[:] = [_SIGNAL_NAMES.get(signum, str(signum))]
    raise KeyboardInterrupt


_SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "a hangup (SIGHUP)"}


def cmd_baselines(args) -> int:
    from controller.report import baseline_report

    config, _ = load_config(args.config, args.set)
    secrets = _new_secrets(config)
    _say_if_replayable(config.run.replay_seed)
    _connect(None)
    baseline_report(config, console, secrets)
    return 0
