"""The archive at scale: ingest, views, resume and the driver's own cost up to a million programs.

    python3 benchmarks/archive_scale.py [--programs 1000000] [--batch 1000] [--at N ...] [--full-replay]
        [--islands 8] [--snapshot-every 5000] [--driver-candidates 2000] [--code-constants 24]

Fills an archive through Atoll's own write path (`DuckDBArchive.write`, batches of
`--batch` as the driver commits them) with programs from a simulated island search:
a real `Archipelago` picks every parent, so the lineage has the deep chains of a
real run; programs are 1-2 KB policies, each with one search evaluation (85% OK,
with per-instance scores, descriptors and ~300 B of metrics; failures carry an
error text; a child beats its parent ever more rarely as its island ages). Islands snapshots are saved every `--snapshot-every` programs, as the
driver does every few seconds. At each size in `--at` it prints:
- ingest rows/s so far (rows = programs + lineage edges + evaluations; only the
  `write` calls are timed, not making the programs), and where that time went per row:
  building the batch's columns in Python, DuckDB's inserts, and its COMMIT (which
  writes the log, and folds it into the file every 256 MB),
- `best_per_island`, `mutator_success` and a 1,000-deep `lineage_of`, fetched whole
  (median of 5), one live query through the run directory's socket, and `atoll progress`
  and `atoll lineage --diff` of the 1,000-deep program (median of 3), whose queries go
  through that socket too,
- a resume: the archive reopened, then what `Search.__init__` reads (count, operator
  totals, known hashes, the islands from their snapshot plus the tail) and the
  writer's id index that the first commit loads (with `--full-replay`, also the
  islands rebuilt from every row, as for an archive without a snapshot),
- the driver's own cost per candidate: a real `Search` on that archive handles
  `--driver-candidates` results (parent selection and request, dedup and the new
  candidate, the islands' update, a commit every `--driver-batch` results, an islands
  snapshot every `--driver-snapshot`); Ray is left out: a local handle stands in for
  the mutator actor and the evaluator's results are made here,
- the load average it ran under (the machine may be shared).
"""
import argparse
import contextlib
import io
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.config import validate  # noqa: E402
from controller.resume import expand_seeds, islands_snapshot, load_islands  # noqa: E402
from evaluators.secrets import RunSecrets  # noqa: E402
from islands.archipelago import Archipelago  # noqa: E402
from islands.population import Member  # noqa: E402
import store.duckdb_archive as archive_module  # noqa: E402
import store.writer as writer_module  # noqa: E402
from store.duckdb_archive import DuckDBArchive, read_whole  # noqa: E402
from store.live import LiveReads  # noqa: E402
from store.query import run_query  # noqa: E402
from store.records import Candidate, EvalResult, Status  # noqa: E402
from store.writer import Writer  # noqa: E402
from workers._base import Proposal  # noqa: E402
from workers.normal_form import normal_form  # noqa: E402

RUN = "scale"
BODY = '''

def policy(state, params):
    """Order up to a level that follows recent demand, capped, with a safety stock."""
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    level = params["level"] + C0 * state["mean_demand"] + C1 * np.sqrt(state["mean_demand"])
    order = np.maximum(level - position, 0)
    order = np.minimum(order, params["cap"] + C2 * state["lead_time"])
    return np.where(position < C3 * level, order + C4, order)
'''


CONSTANTS = 24  # --code-constants: 24 make a policy of about 1.5 KB


def seed_code(rng) -> str:
    head = 'import numpy as np\n\nPARAMS = {"level": (15.0, 0.0, 80.0), "cap": (8.0, 0.0, 20.0)}\n\n'
    consts = "".join(f"C{i} = {rng.normal():.6f}  # tuned by the search; see the run's lineage\n"
                     for i in range(CONSTANTS))
    return head + consts + BODY


def child_code(code: str, rng) -> str:
    """One constant changed: what an embedded mutation does to a policy's text."""
    k = int(rng.integers(CONSTANTS))
    return re.sub(rf"^C{k} = [^ ]*", f"C{k} = {rng.normal():.6f}", code, count=1, flags=re.MULTILINE)


def result_for(pid: str, parent_score: float, generation: int, rng) -> EvalResult:
    """A child's evaluation: mostly a little worse than its parent, better ever more rarely as the
    island ages (the step's spread shrinks with its generation), as in a real search."""
    roll = rng.random()
    if roll > 0.85:
        status = Status.FAILED if roll > 0.9 else Status.TIMEOUT
        return EvalResult(pid, "search", status, error=f"{status.value}: Traceback (most recent call last): ... "
                          "ValueError: actions must be finite", duration_s=0.4)
    score = parent_score + float(rng.normal(-0.05, 0.04 * (1 + generation / 2000) ** -0.25))
    instances = tuple(round(score + float(e), 4) for e in rng.normal(0, 0.01, 4))
    metrics = {"mean_cost": -score * 4.2, "mean_ratio_to_base_stock": -score,
               "instances": {f"lt{k}": {"cost": -v * 4.2, "fill_rate": 0.93} for k, v in enumerate(instances)}}
    if roll < 0.3:
        metrics["proposed_hash"] = uuid.uuid4().hex[:16]
    return EvalResult(pid, "search", Status.OK, score=score, metrics=metrics, instance_scores=instances,
                      descriptors=(0.9 + float(rng.normal(0, 0.02)), 0.3), duration_s=0.5)


SPENT = {"insert": 0.0, "commit": 0.0, "duckdb_thread_cpu": 0.0}  # seconds the writes spent in DuckDB's
# inserts and COMMITs, and the CPU this thread spent in both (DuckDB's own threads not counted)


def _timed_insert(insert):
    def timed(*args, **kwargs):
        start, cpu = time.perf_counter(), time.thread_time()
        insert(*args, **kwargs)
        SPENT["insert"] += time.perf_counter() - start
        SPENT["duckdb_thread_cpu"] += time.thread_time() - cpu
    return timed


writer_module.insert_arrow = _timed_insert(writer_module.insert_arrow)
archive_module.insert_arrow = _timed_insert(archive_module.insert_arrow)


class TimedArchive(DuckDBArchive):
    """The archive, its COMMITs timed (`DuckDBArchive._transaction` with a clock around COMMIT)."""

    def _transaction(self, work) -> None:
        self.con.execute("BEGIN")
        try:
            after = work()
            start, cpu = time.perf_counter(), time.thread_time()
            self.con.execute("COMMIT")
            SPENT["commit"] += time.perf_counter() - start
            SPENT["duckdb_thread_cpu"] += time.thread_time() - cpu
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        if after:
            after()


class Fill:
    """The simulated search that makes the programs, and the timed writes."""

    def __init__(self, archive, config, rng):
        self.archive, self.config, self.rng = archive, config, rng
        self.islands = Archipelago(config.islands, 0)
        self.depth: dict[str, int] = {}
        self.deep: str | None = None  # the first program 1,000 parents from the seed
        self.write_s = self.write_cpu = self.rows = self.programs = 0
        self.insert_s = self.commit_s = 0.0  # of write_s: in DuckDB's inserts, in its COMMITs
        self.build_cpu = 0.0  # CPU of this thread in the writes outside DuckDB's inserts and COMMITs
        self.snapshot_s, self.snapshots = 0.0, 0

    def seed(self) -> None:
        pair = (Candidate("seed", RUN, 0, 0, (), seed_code(self.rng), "seed", time.time()),
                EvalResult("seed", "search", Status.OK, score=-1.0, instance_scores=(-1.0,) * 4, descriptors=(0.9, 0.3)))
        self._write([pair])
        for i in range(self.config.islands.count):
            self.islands.add_result(i, Member("seed", -1.0, pair[0].code, 0, (-1.0,) * 4, (0.9, 0.3)))
        self.depth["seed"] = 0

    def child(self) -> tuple[Candidate, EvalResult]:
        island = self.islands.pick_island()
        parent, _ = self.islands.next_parent(island)
        pid = uuid.uuid4().hex[:12]
        candidate = Candidate(pid, RUN, island, self.islands.islands[island].generation + 1, (parent.program_id,),
                              child_code(parent.code, self.rng), "embedded:perturb_const", time.time())
        result = result_for(pid, parent.score, candidate.generation, self.rng)
        if result.status == Status.OK:
            self.islands.add_result(island, Member(pid, result.score, candidate.code, candidate.generation,
                                                   result.instance_scores, result.descriptors))
        self.islands.on_generation(island)
        self.depth[pid] = self.depth.get(parent.program_id, -10**9) + 1
        if self.depth[pid] == 1000 and self.deep is None:
            self.deep = pid
        return candidate, result

    def until(self, n: int, batch: int, snapshot_every: int) -> None:
        while self.programs < n:
            self._write([self.child() for _ in range(min(batch, n - self.programs))])
            if (self.programs + snapshot_every // 2) % snapshot_every < batch:  # reports fall mid-interval
                start = time.perf_counter()
                self.archive.save_snapshot(RUN, islands_snapshot(self.islands, self.archive.last_seq()))
                self.snapshot_s += time.perf_counter() - start
                self.snapshots += 1

    def _write(self, pairs) -> None:
        spent = dict(SPENT)
        start, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
        self.archive.write(RUN, pairs=pairs)
        self.write_s += time.perf_counter() - start
        self.write_cpu += time.process_time() - cpu
        self.build_cpu += time.thread_time() - thread - (SPENT["duckdb_thread_cpu"] - spent["duckdb_thread_cpu"])
        self.insert_s += SPENT["insert"] - spent["insert"]
        self.commit_s += SPENT["commit"] - spent["commit"]
        self.programs += len(pairs)
        self.rows += 2 * len(pairs) + sum(len(c.parent_ids) for c, _ in pairs)


def median_s(work, repeat: int = 5) -> tuple[float, float, object]:
    """Median wall and CPU seconds (this process, DuckDB's threads included) of `work`, and its result."""
    walls, cpus, out = [], [], None
    for _ in range(repeat):
        start, cpu = time.perf_counter(), time.process_time()
        out = work()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), out


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f} (1/5/15 min) on {} CPUs".format(*os.getloadavg(), os.cpu_count())


def report_queries(archive, run_dir: Path, deep: str | None) -> None:
    con = archive.con
    target = deep or con.execute("SELECT program_id FROM programs ORDER BY seq DESC LIMIT 1").fetchone()[0]
    figures = {"best_per_island (all rows)": "SELECT * FROM best_per_island",
               "mutator_success": "SELECT * FROM mutator_success",
               f"lineage_of, {'1,000' if deep else 'deepest'} deep": f"SELECT * FROM lineage_of('{target}')"}
    for label, sql in figures.items():
        wall, cpu, rows = median_s(lambda: con.execute(sql).fetchall())
        print(f"    {label:<38}{wall * 1e3:>9.1f} ms ({cpu * 1e3:.1f} ms CPU)  {len(rows):,} rows")
    wall, cpu, _ = median_s(lambda: run_query(run_dir, "SELECT * FROM mutator_success"))
    print(f"    {'live query via archive.sock':<38}{wall * 1e3:>9.1f} ms ({cpu * 1e3:.1f} ms CPU)  mutator_success, "
          "asked as `atoll query` asks")
    from controller.progress_command import cmd_progress

    def progress() -> str:
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
            cmd_progress(argparse.Namespace(run_dir=str(run_dir), json=False))
        return out.getvalue()
    wall, cpu, out = median_s(progress, repeat=3)
    print(f"    {'atoll progress (its 5 live queries)':<38}{wall * 1e3:>9.1f} ms ({cpu * 1e3:.1f} ms CPU)  "
          f"{len(out.splitlines())} lines printed; this process's CPU, the answering thread's included")
    from controller.lineage_command import cmd_lineage

    def lineage() -> str:
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
            cmd_lineage(argparse.Namespace(run_dir=str(run_dir), program=target[:8], diff=True, last=None,
                                           json=False, whole=False))
        return out.getvalue()
    wall, cpu, out = median_s(lineage, repeat=3)
    print(f"    {'atoll lineage --diff (4 live queries)':<38}{wall * 1e3:>9.1f} ms ({cpu * 1e3:.1f} ms CPU)  "
          f"{out.count(chr(10) + 'step '):,} steps with their diffs, the program given by 8 characters of its id")


def report_copy(archive, tmp: Path) -> None:
    """A run's backup of the archive, as it makes it (controller.backup: the log folded into the
    file, the file copied and flushed); then what the old live view paid every few seconds."""
    start, cpu = time.perf_counter(), time.process_time()
    size = archive.backup(tmp / "archive.backup.duckdb") / 2**20
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    read = time.perf_counter()
    read_whole(tmp / "archive.backup.duckdb")  # again, as the backup read its copy: that step's share
    read = time.perf_counter() - read
    (tmp / "archive.backup.duckdb").unlink()
    print(f"    {'backup (checkpoint, copy, read, fsync)':<38}{seconds * 1e3:>9.1f} ms ({cpu * 1e3:.1f} ms CPU)  of a "
          f"{size:,.0f} MiB file, every controller.backup_every_s (1800 s); reading the copy whole "
          f"{read * 1e3:.1f} ms of it")
    start = time.perf_counter()
    archive.con.execute("CHECKPOINT")
    shutil.copyfile(archive.path, tmp / "copy.duckdb")
    seconds = time.perf_counter() - start
    size = (tmp / "copy.duckdb").stat().st_size / 2**20
    (tmp / "copy.duckdb").unlink()
    print(f"    {'(old live view: checkpoint + copy)':<38}{seconds * 1e3:>9.1f} ms  of a {size:,.0f} MiB file, "
          "every few seconds")


def resume(path: Path, config, full_replay: bool) -> tuple[DuckDBArchive, object]:
    """Reopen the archive and time what a resume reads, then build a real Search on it."""
    from controller.loop import Search

    archive = TimedArchive(path)
    if full_replay:
        wall, cpu, _ = median_s(lambda: Archipelago(config.islands, 0).replay(
            expand_seeds(archive.search_rows(RUN), config.islands.count)), repeat=1)
        print(f"    {'(islands from every row, no snapshot)':<38}{wall:>9.2f} s ({cpu:.2f} s CPU)")
    steps = {"count_evaluations": lambda: archive.count_evaluations(RUN),
             "operator_stats": lambda: archive.operator_stats(RUN),
             "known_hashes": lambda: archive.known_hashes(RUN),
             "islands: snapshot + tail": lambda: load_islands(archive, RUN, config, 0),
             "writer's id index (first commit)": lambda: Writer(archive.con)}
    total = 0.0
    for label, work in steps.items():
        seconds, cpu, out = median_s(work, repeat=1)
        total += seconds
        extra = f"  replayed {out.replayed:,} rows after the snapshot" if label.startswith("islands") else ""
        print(f"    {label:<38}{seconds * 1e3:>9.1f} ms ({cpu * 1e3:.1f} ms CPU){extra}")
    print(f"    {'resume, archive and islands':<38}{total:>9.2f} s")
    search = Search(config, archive, RUN, path.parent, secrets=RunSecrets.fixed(0))
    return archive, search


class _Handle:
    """Stands in for the mutator actor's handle: `propose.remote(request)` is answered here."""

    class propose:  # noqa: N801 (mirrors a Ray actor method)
        @staticmethod
        def remote(request):
            return object()


def drive(search, n: int, commit_every: int, snapshot_every: int, rng, depth: dict) -> dict[str, tuple]:
    """The driver's own work for `n` results, by part: (wall, CPU) microseconds per candidate."""
    submitted = []
    search._submit_eval = lambda candidate, split="search": submitted.append((candidate, split))
    search.mutators, search._next_mutator = [_Handle()], 0
    search.load, search.nodes, search.backlog = {0: 0}, {}, []  # one ready evaluator slot (controller.cluster)
    names = ("parent + request", "dedup + candidate", "islands update", "commit", "islands snapshot")
    wall, cpu = np.zeros(5), np.zeros(5)

    def clock():
        return np.array([time.perf_counter(), time.process_time()])
    for i in range(n):
        t0 = clock()
        search._submit_mutation()
        _, (_, request, _) = search.pending.popitem()
        t1 = clock()
        code = child_code(request.parent_code, rng)  # the mutator's work, as its normal form below (not timed)
        proposal = Proposal(code, "embedded:perturb_const", form=normal_form(code))
        t2 = clock()
        search._on_mutate(request, proposal)
        t3 = clock()
        candidate = next((c for c, split in reversed(submitted) if split == "search"), None)
        submitted.clear()
        if candidate is None:  # a duplicate: dropped
            continue
        depth[candidate.program_id] = depth.get(request.parent_id, -10**9) + 1
        result = result_for(candidate.program_id, request.parent_score, request.generation, rng)
        t4 = clock()
        search._on_eval(candidate, result)
        t5 = clock()
        if (i + 1) % commit_every == 0:
            search.commit()
        t6 = clock()
        if (i + 1) % snapshot_every == 0:
            search.publish()
        t7 = clock()
        spans = np.array([t1 - t0, t3 - t2, t5 - t4, t6 - t5, t7 - t6])
        wall += spans[:, 0]
        cpu += spans[:, 1]
    search.publish()
    return {name: (w / n * 1e6, c / n * 1e6) for name, w, c in zip(names, wall, cpu)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=1_000_000, help="programs to ingest in all")
    parser.add_argument("--at", type=int, nargs="+", help="sizes to report at (default: programs/100, /10, all)")
    parser.add_argument("--batch", type=int, default=1000, help="programs per write (one driver commit)")
    parser.add_argument("--islands", type=int, default=8, help="islands of the simulated search")
    parser.add_argument("--snapshot-every", type=int, default=5000, help="programs between islands snapshots")
    parser.add_argument("--driver-candidates", type=int, default=2000, help="results the real Search handles")
    parser.add_argument("--driver-batch", type=int, default=10, help="results per driver commit")
    parser.add_argument("--driver-snapshot", type=int, default=30, help="results between driver snapshots")
    parser.add_argument("--code-constants", type=int, default=CONSTANTS,
                        help="constant lines per program (24: about 1.5 KB of code; at least 5)")
    parser.add_argument("--full-replay", action="store_true", help="also time rebuilding the islands from every row")
    parser.add_argument("--dir", help="where the archive goes (default: a temporary directory, removed)")
    args = parser.parse_args()
    globals()["CONSTANTS"] = max(5, args.code_constants)
    at = sorted(set(args.at or [args.programs // 100, args.programs // 10, args.programs]))
    config = validate({"domain": {"name": "inventory"}, "run": {"seed": 0, "max_evals": 10**9},
                       "islands": {"count": args.islands}})
    rng = np.random.default_rng(0)
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        run_dir = Path(tmp)
        print(f"archive scale: {args.programs:,} programs in batches of {args.batch:,}, {args.islands} islands, "
              f"{len(seed_code(rng)):,} B of code a program; {load()}")
        archive = TimedArchive(run_dir / "archive.duckdb")
        archive.create_run(RUN, config.model_dump(mode="json"))
        fill = Fill(archive, config, rng)
        fill.seed()
        last = (0, 0.0, 0.0)
        for n in at:
            with LiveReads(archive, run_dir):
                fill.until(n, args.batch, args.snapshot_every)
                print(f"\nat {fill.programs:,} programs; {load()}")
                rows, seconds, cpu = fill.rows - last[0], fill.write_s - last[1], fill.write_cpu - last[2]
                print(f"  ingest: {rows / seconds:,.0f} rows/s since the last report ({rows / cpu:,.0f} rows per "
                      f"CPU-second of this process), {fill.rows / fill.write_s:,.0f} rows/s in all "
                      f"({fill.programs / fill.write_s:,.0f} programs/s); islands snapshots "
                      f"{fill.snapshot_s / max(fill.snapshots, 1) * 1e3:.1f} ms each")
                split = (fill.write_s - fill.insert_s - fill.commit_s, fill.insert_s, fill.commit_s)
                print("  ingest time per row, in all: " + ", ".join(
                    f"{label} {seconds / fill.rows * 1e6:.2f} µs" for label, seconds in
                    zip(("building the columns (Python)", "DuckDB inserts", "DuckDB COMMIT"), split))
                      + f" = {fill.write_s / fill.rows * 1e6:.2f} µs (the building's own CPU "
                      f"{fill.build_cpu / fill.rows * 1e6:.2f} µs)")
                last = (fill.rows, fill.write_s, fill.write_cpu)
                print("  queries, in process, median of 5:")
                report_queries(archive, run_dir, fill.deep)
                report_copy(archive, run_dir)
            archive.close()
            print("  resume (the archive reopened):")
            archive, search = resume(run_dir / "archive.duckdb", config, args.full_replay)
            print(f"  driver per candidate over {args.driver_candidates:,} results, a commit every "
                  f"{args.driver_batch}, a snapshot every {args.driver_snapshot}; microseconds wall (CPU):")
            with LiveReads(archive, run_dir):
                parts = drive(search, args.driver_candidates, args.driver_batch, args.driver_snapshot, rng, fill.depth)
            print("    " + "  ".join(f"{k} {w:,.0f} ({c:,.0f})" for k, (w, c) in parts.items())
                  + f"  = {sum(w for w, _ in parts.values()):,.0f} ({sum(c for _, c in parts.values()):,.0f})")
            print(f"  driver memory: known hashes {search.known.nbytes() / 2**20:.1f} MiB for {len(search.known):,}; "
                  f"writer's id index {archive._writer.index.nbytes() / 2**20:.1f} MiB; "
                  f"{sum(len(i) for i in search.islands.islands)} island members")
            fill.archive, fill.islands = archive, search.islands
            fill.programs = archive.count_evaluations(RUN)
        archive.close()
        print(f"\ndone; {load()}")


if __name__ == "__main__":
    main()
