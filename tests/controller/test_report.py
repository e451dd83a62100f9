"""The held-out report's trial summary: what selection-bias corrections are computed from."""
import time

from controller.report import search_trials
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status


def _cand(pid, mutator="embedded:perturb_const"):
    return Candidate(pid, "r1", 0, 1, (), f"def policy(s, p):\n    return {pid!r}", mutator, time.time())


def test_search_trials_count_every_evaluated_program_and_keep_only_real_scores(tmp_path):
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        archive.create_run("r1", {"run": {"name": "t"}}, "")
        archive.record([(_cand("a", "seed"), EvalResult("a", "search", Status.OK, score=0.4)),
                        (_cand("b"), EvalResult("b", "search", Status.OK, score=-0.1)),
                        (_cand("c"), EvalResult("c", "search", Status.TIMEOUT, error="slow")),
                        (_cand("d"), EvalResult("d", "search", Status.INVALID, error="NaN")),
                        (_cand("base", "baseline:cash"), EvalResult("base", "search", Status.OK, score=9.0))])
        trials = search_trials(archive, "r1")
    assert trials["count"] == 4  # failures are trials too; baselines are not
    assert sorted(trials["search_scores"]) == [-0.1, 0.4]
