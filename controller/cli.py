"""`atoll`: run, resume, inspect and query searches.

Every bad input (missing file, bad config, bad SQL, a folder that is not a run)
ends with one clear line on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import atexit
import signal
import sys
import textwrap

from controller.config import ConfigError
from store import signals

EPILOG = """examples:
  atoll run configs/inventory.toml                  search with the embedded mutator
  atoll run configs/inventory.toml --set run.max_evals=50 --run-dir runs/try
  atoll resume runs/try                             continue after Ctrl-C, kill -9 or a lost machine
  atoll status runs/try
  atoll query runs/try "SELECT * FROM mutator_success"
  atoll best runs/try
  atoll progress runs/try                           still improving? the best so far, each improvement
  atoll lineage runs/try --diff                     how the best was made: each step from the seed, its diff
  atoll watch runs/try                              live status and events; also pause, continue, stop
  atoll set runs/try run.max_evals=800              change the budget of a live run
  atoll report runs/try                             the held-out table again (after a stopped report)
  atoll baselines configs/inventory.toml
  atoll runs                                        the runs the library knows
  atoll query --library "SELECT * FROM best_per_run"   SQL across every known run
  atoll skills --domain inventory                   learned skills and their efficacy
  atoll run configs/inventory.toml --set memory.warm_start=true   start from the library
  atoll new-domain pricing                          write an example domain of your own into ./pricing
  atoll check pricing/pricing.toml                  check that a domain keeps the contract
  atoll submit configs/inventory.toml --address http://HEAD:8265   the search as a Ray job on a cluster
  atoll jobs --address http://HEAD:8265             Atoll's jobs there, with their run directories

shipped configs (configs/*.toml): inventory, inventory_llm (a local model on the CPU),
inventory_api (a hosted model), inventory_vllm (vLLM on GPUs); milp_setcover, milp_cauctions,
milp_facility, milp_indset; control_lunarlander, control_pendulum, control_mountaincar; trading_sp500,
trading_synthetic, trading_null"""


QUERY_EPILOG = """\
a run's archive (DuckDB SQL; every table has run_id):
  runs             one row a run: status, started_at, ended_at, config, toml, protections
  programs         program_id, island, generation, parent_ids, code, mutator, seq, search_score
  evaluations      program_id, split (search, validation, heldout), status, score, metrics (JSON),
                   instance_scores, error, duration_s, node_ip
  lineage          child_id, parent_id
  llm_calls        model, kind, status, error, completion, reasoning, tokens_in, tokens_out, cost, latency_s
  events           ts, kind, data (JSON): what the run met (lost actors, stalls, internal errors)
  run_secrets      the seeds each split's data was drawn from
views: best_per_island, program_scores, mutator_success, llm_usage, llm_prompts (each call's
  prompt), raced, racing_summary, skills_learned, skill_uses, warm_starts
macro: lineage_of('PROGRAM_ID'): the program and its ancestors, nearest first (depth, score, ...);
  atoll lineage DIR PROGRAM_ID --diff shows its first parents' line with each step's change

examples:
  atoll query runs/x "SELECT * FROM best_per_island"
  atoll query runs/x "SELECT status, count(*) FROM evaluations GROUP BY ALL"
  atoll query runs/x "SELECT program_id, error FROM evaluations WHERE status <> 'OK' LIMIT 10"
  atoll query runs/x "SELECT * FROM lineage_of('PROGRAM_ID')"
  atoll query --library "SELECT * FROM best_per_run"
"""


class UserError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _command(sub, name: str, text: str, **options) -> argparse.ArgumentParser:
    """A command whose own --help opens with what the command list says of it."""
    sentence = textwrap.fill(text[0].upper() + text[1:] + ".", 79)  # a raw formatter (query's) keeps the breaks
    return sub.add_parser(name, help=text, description=sentence, **options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atoll", description="Evolve policy programs on a Ray cluster.",
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = _command(sub, "run", "start a new search from a config file")
    run.add_argument("config", help="TOML config, e.g. configs/inventory.toml")
    run.add_argument("--run-dir", help="where the archive goes (default runs/NAME-TIMESTAMP)")
    run.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                     help="override a config value (repeatable), e.g. run.seed=3; one LLM model by its name: "
                          "mutator.llm.models.NAME.base_url=URL")
    run.add_argument("--max-evals", type=int, help="shorthand for --set run.max_evals=N")
    for name, text in (("resume", "continue a stopped or crashed run"), ("status", "show a run's state"),
                       ("best", "show the best program and its held-out metrics")):
        p = _command(sub, name, text)
        p.add_argument("run_dir", help="a run directory (holds archive.duckdb)" + ("" if name == "resume" else
                       "; or an archive file, read where it lies: a backup, or its copy in controller.backup_dir"))
    progress = _command(sub, "progress", "whether the search still improves: its best so far over the evaluations, "
                                         "each improvement, and each island's last one (also while it is live)")
    progress.add_argument("run_dir", help="a run directory, or an archive file (a backup, or its copy in "
                                          "controller.backup_dir)")
    progress.add_argument("--json", action="store_true", help="print each improvement of the run's best as a "
                                                              "JSON line (evaluation, made, score, island, source, "
                                                              "program_id), e.g. to plot")
    lineage = _command(sub, "lineage", "how a program was made: each step from the seed (or another root) with "
                                       "its source, score and gain, and with --diff what each step changed")
    lineage.add_argument("run_dir", help="a run directory, or an archive file (a backup, or its copy in "
                                         "controller.backup_dir)")
    lineage.add_argument("program", nargs="?", help="a program id, or the start of one (default: the run's best, "
                                                    "as atoll best names it)")
    lineage.add_argument("--diff", action="store_true", help="also print each step's diff from its parent")
    lineage.add_argument("--whole", action="store_true", help="also print what the steps changed together: one "
                                                              "diff from the root (or the parent of the first step "
                                                              "shown) to the program")
    lineage.add_argument("--last", type=int, metavar="N", help="only the latest N steps")
    lineage.add_argument("--json", action="store_true", help="print each step as a JSON line, its code included")
    sub.choices["best"].add_argument("--out", metavar="FILE", help="also write the program to FILE, ready to "
                                                                    "import or to run with the domain's simulator")
    report = _command(sub, "report", "print a finished run's held-out table again (scores only what the "
                                           "archive lacks, e.g. after a report was stopped)")
    report.add_argument("run_dir", help="a run directory (holds archive.duckdb)")
    report.add_argument("--again", action="store_true", help="also score again the programs whose held-out "
                        "evaluation did not end OK (a timeout on a busy machine, a failure); the run's limits "
                        "stand: atoll resume DIR --set evaluator.sandbox.wall_s=N changes them first")
    report.add_argument("--ray-address", help="join this Ray cluster (default: RAY_ADDRESS, else start a local Ray)")
    sub.choices["resume"].add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                                       help="change a config value for the rest of the run (e.g. the LLM models)")
    sub.choices["resume"].add_argument("--from-backup", nargs="?", const=True, metavar="FILE",
                                       help="first put the run directory's archive.backup.duckdb (made every "
                                            "controller.backup_every_s) in the archive's place, keeping the archive "
                                            "it replaces: for an archive that is damaged or lost. With FILE, that "
                                            "backup instead, e.g. the copy in controller.backup_dir of a run whose "
                                            "machine was lost (RUN_DIR is made if it is not there)")
    for p in (run, sub.choices["resume"]):
        p.add_argument("--ray-address", help="join this Ray cluster (default: RAY_ADDRESS, else start a local Ray)")
        p.add_argument("--no-report", action="store_true", help="skip the held-out table at the end")
    query = _command(sub, "query", "run read-only SQL on a run's archive (also while it is live), "
                                         "or with --library across every run the library knows",
                           epilog=QUERY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    query.add_argument("run_dir", nargs="?", help="a run directory, or an archive file (a backup, or its copy in "
                                                  "controller.backup_dir) read where it lies (not with --library)")
    query.add_argument("sql", help='e.g. "SELECT * FROM best_per_island"')
    query.add_argument("--json", action="store_true", help="print rows as JSON lines")
    query.add_argument("--library", action="store_true", help="query the library: runs, skills, elites, and "
                       "all_programs, all_evaluations, all_events, best_per_run over every known run")
    runs = _command(sub, "runs", "list the runs the library knows")
    skills = _command(sub, "skills", "list the library's skills with their efficacy, or retire one")
    for p in (runs, skills):
        p.add_argument("--domain", help="only this domain")
        p.add_argument("--json", action="store_true", help="print rows as JSON lines")
    skills.add_argument("--retire", metavar="SKILL_ID", help="retire a skill: kept, never retrieved again")
    skills.add_argument("--all", action="store_true", help="include retired skills")
    base = _command(sub, "baselines", "score the domain's baselines on the held-out split")
    base.add_argument("config", help="TOML config naming the domain, e.g. configs/inventory.toml")
    base.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                      help="override a config value (repeatable), e.g. domain.options.heldout_tune_trials=32")
    new = _command(sub, "new-domain", "write a working example domain of your own (a file, a config, a test)")
    new.add_argument("name", help="the domain's name: lowercase letters, digits, underscores")
    new.add_argument("--dir", help="where to write it (default ./NAME)")
    check = _command(sub, "check", "check that a config's domain keeps the contract (real sandbox, no Ray)")
    check.add_argument("config", help="TOML config naming the domain, e.g. pricing/pricing.toml")
    check.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a config value (repeatable), e.g. domain.options.search_instances=4")
    _control_parsers(sub)
    _add_cluster_commands(sub)
    return parser


def _control_parsers(sub) -> None:
    """`atoll watch|pause|continue|stop|set RUN_DIR`: steering a live run (controller/control_commands.py)."""
    for name, text in (("watch", "live view of a running search's status and events (Ctrl-C stops watching)"),
                       ("pause", "submit no new work; what is in flight finishes and is committed"),
                       ("continue", "continue a paused run"),
                       ("stop", "stop a live run as Ctrl-C does (everything finished is committed; resumable)"),
                       ("set", "change a live run's budget, e.g. run.max_evals=500")):
        p = _command(sub, name, text)
        p.add_argument("run_dir", help="a live run's directory")
        if name == "set":
            p.add_argument("assignments", nargs="+", metavar="KEY=VALUE",
                           help="run.max_evals, run.max_wall_s, mutator.llm.budget.calls|tokens|cost")
        if name == "watch":
            p.add_argument("--every", type=float, default=5.0, help="seconds between status updates (default 5)")
        p.add_argument("--token-file", help="the run's control token, for a run bound beyond loopback "
                                            "(default: ATOLL_CONTROL_TOKEN)")


def _add_cluster_commands(sub) -> None:
    """`atoll submit` and `atoll jobs`: searches as Ray jobs on a cluster (controller/submit.py)."""
    address = ("the cluster's job server (its dashboard), default RAY_API_SERVER_ADDRESS, else "
               "http://127.0.0.1:8265")
    submit = _command(sub, "submit", "submit a search (or its resume) to a Ray cluster as a Ray job")
    submit.add_argument("config", nargs="?", help="TOML config inside the project folder (it travels as the "
                                                  "job's working directory)")
    submit.add_argument("--resume", metavar="RUN_DIR", help="submit `atoll resume RUN_DIR` instead (a run "
                                                            "directory on the driver's node)")
    submit.add_argument("--from-backup", nargs="?", const=True, metavar="FILE", help="with --resume: resume from "
                        "the run directory's archive.backup.duckdb, or from FILE on the driver's node (absolute or "
                        "under ~/), keeping the archive it replaces (atoll resume --help)")
    submit.add_argument("--address", help=address)
    submit.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value (repeatable)")
    submit.add_argument("--max-evals", type=int, help="shorthand for --set run.max_evals=N")
    submit.add_argument("--run-dir", help="the run directory on the driver's node, absolute or under ~/ "
                                          "(default STORAGE_ROOT/NAME-TIMESTAMP)")
    submit.add_argument("--storage-root", help="folder on the driver's node for run directories "
                                               "(default: the config's cluster.storage_root, ~/atoll-runs)")
    submit.add_argument("--no-report", action="store_true", help="skip the held-out table at the end")
    submit.add_argument("--wait", action="store_true", help="print the job's output until it ends; exit 0 "
                                                            "if it succeeded")
    jobs = _command(sub, "jobs", "list the Atoll jobs of a Ray cluster with their run directories")
    jobs.add_argument("--address", help=address)


def _stoppable() -> None:
    """Ctrl-C and SIGTERM stop a run cleanly even when whoever started Atoll ignored or blocked them
    (a background job of a non-interactive shell ignores SIGINT; children inherit that and the mask)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _stoppable()
    atexit.register(signals.stop_done)  # the last of Atoll's exit steps (after Ray's shutdown, registered later)
    try:  # a Ctrl-C while the commands load is the command's one line too
        from controller import commands

        if args.command in _SEARCHING:
            commands.stop_on_signals()
        status = getattr(commands, f"cmd_{args.command.replace('-', '_')}")(args)
        sys.stdout.flush()  # here, where a reader that left is caught (at exit it is a traceback)
        return status
    except (UserError, ConfigError) as exc:  # its text may quote data (a program, a reply): written out
        from controller.terminal import visible

        print(visible(f"atoll: {exc}"), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted(args)
    except BrokenPipeError:  # `atoll best DIR | head`: the reader has what it wanted
        return _pipe_closed()
    except Exception as exc:
        if signals.interrupted(exc):  # DuckDB's word for a Ctrl-C during a query
            return _interrupted(args)
        if not damaged(exc):
            raise
        print(_damage_text(exc, getattr(args, "run_dir", None)), file=sys.stderr)
        return 2


def _pipe_closed() -> int:
    """Whoever read the output closed it (`| head`): no traceback, and what is still buffered or
    printed at exit goes nowhere; 141 as for a process SIGPIPE stopped (128 + 13)."""
    signals.discard([sys.stdout.fileno()])
    return 141


_SEARCHING = ("run", "resume", "report", "baselines")  # their stop commits first (store.signals.stopping)
_READING = ("status", "progress", "lineage", "query", "runs", "watch", "jobs", "check")  # change nothing


def _interrupted(args) -> int:
    """A Ctrl-C (or SIGTERM) that stopped a command outside its search loop (while it started, say):
    one line, no traceback, and the command that continues once there is something to continue."""
    if args.command in _SEARCHING:  # what is left (closing the archive, Ray's shutdown) is not broken off
        signals.stopping()  # store.signals imports nothing of Ray's: this Ctrl-C may have cut `import ray` short
    then = getattr(args, "continue_with", lambda: None)()
    try:
        kept = "it only reads, so nothing changed" if args.command in _READING else "what was committed before stays"
        print(f"atoll {args.command}: stopped (Ctrl-C, SIGTERM or SIGHUP); {kept}"
              + (f". Continue with: {then}" if then else ""), file=sys.stderr, flush=True)
    except OSError:  # nowhere to say it
        pass
    return 130


def _damage_text(exc: BaseException, run_dir) -> str:
    """The one line for an archive DuckDB cannot read as written: its file, or its log (which no command opens)."""
    from controller import backup
    from store.readonly import is_log_damage, log_aside

    first = str(exc).strip().splitlines()[0]
    if is_log_damage(exc) and run_dir:
        from pathlib import Path

        archive = Path(run_dir) / "archive.duckdb"
        return (f"atoll: an archive cannot be read: {first}. Nothing opens the archive with that log: "
                f"{log_aside(archive)}{backup.offer(run_dir)}")
    return (f"atoll: an archive cannot be read: {first}. The file is damaged or cut short (a disk error, a copy "
            "that did not finish): a resume cannot start from it, though `atoll query` may still read its undamaged "
            f"parts. If the run directory exists elsewhere (the node it ran on, a backup), give that copy"
            f"{backup.offer(run_dir)}")


def damaged(exc: BaseException) -> bool:
    """Whether DuckDB found a file it cannot read as written: a block past its end, or one whose
    checksum does not match. Any other error is a bug of Atoll's, and keeps its traceback."""
    from store.duckdb_archive import ArchiveDamaged
    from store.readonly import is_damage_error

    return isinstance(exc, ArchiveDamaged) or is_damage_error(exc)
