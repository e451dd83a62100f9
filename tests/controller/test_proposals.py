"""The proposal scheduler's state lives in the archive: a resume rebuilds the budget, the model
bandit (also when the new config adds or drops a model) and the failure memory."""
import time

from controller.config import validate
from controller.dedup import Dedup
from controller.proposals import Proposals
from evaluators.registry import get_domain
from store import llm_calls
from store.duckdb_archive import DuckDBArchive
from store.records import Candidate, EvalResult, Status

RUN = "run-1"


def _config(models, budget=None):
    llm = {"models": [{"backend": "openai", "name": n, "base_url": "http://127.0.0.1:1/v1", "model": n}
                      for n in models], "budget": budget or {}}
    return validate({"domain": {"name": "inventory"}, "mutator": {"llm": llm}})


def _call(call_id, model, program_id, parent, tokens, status="ok"):
    return {"call_id": call_id, "run_id": RUN, "program_id": program_id, "model": model, "completion": "x",
            "tokens_in": tokens, "tokens_out": 10, "latency_s": 1.0, "created_at": time.time(), "island": 0,
            "parent_id": parent, "kind": "edit", "status": status, "error": None, "cost": 0.0, "gpu_s": 0.0,
            "attempts": 1, "prompt_parts": ["p1", "p2"], "completion_truncated": False, "tokens_estimated": False}


def _archive(tmp_path):
    archive = DuckDBArchive(tmp_path / "archive.duckdb")
    archive.create_run(RUN, {})
    now = time.time()
    progs = [Candidate("seed", RUN, 0, 0, (), "def policy(s, p):\n    return 1\n", "seed", now),
             Candidate("c1", RUN, 0, 1, ("seed",), "def policy(s, p):\n    return 2\n", "llm:a", now),
             Candidate("c2", RUN, 0, 1, ("seed",), "oops", "llm:b", now)]
    results = [EvalResult("seed", "search", Status.OK, score=-1.0), EvalResult("c1", "search", Status.OK, score=-0.9),
               EvalResult("c2", "search", Status.INVALID, error="unparseable: no code")]
    archive.record(list(zip(progs, results)))
    llm_calls.record_calls(archive, [_call("k1", "a", "c1", "seed", 500), _call("k2", "b", "c2", "seed", 900,
                                                                                 "unparseable")],
                           {"p1": "system text", "p2": "parent text"})
    return archive


def test_resume_rebuilds_budget_bandit_and_failures_and_follows_model_changes(tmp_path):
    archive = _archive(tmp_path)
    domain = get_domain("inventory")
    kept = Proposals(_config(["a", "b"], {"tokens": 1500}), archive, RUN, domain, Dedup())
    assert (kept.budget.calls, kept.budget.tokens) == (2, 1420)
    assert not kept.budget.allows(1, 100, 0.0)  # 80 tokens left
    assert (kept.bandit.arms["a"].edits, kept.bandit.arms["a"].improvements, kept.bandit.arms["a"].cost) == (1, 1, 510)
    assert (kept.bandit.arms["b"].edits, kept.bandit.arms["b"].improvements) == (1, 0)
    assert list(kept.failures["seed"]) == [("INVALID", "unparseable: no code")]
    changed = Proposals(_config(["a", "c"]), archive, RUN, domain, Dedup())  # drops b, adds c
    assert set(changed.bandit.arms) == {"a"} and changed.bandit.arms["a"].improvements == 1
    assert changed.bandit.choose({"a": 1.0, "c": 1.0}) in {"a", "c"}  # c starts from its prior
    assert changed.budget.tokens == 1420  # spending by a dropped model still counts against the budget


def test_prompt_parts_are_stored_once(tmp_path):
    archive = _archive(tmp_path)
    llm_calls.record_calls(archive, [_call("k3", "a", None, "seed", 100)], {"p1": "system text", "p2": "parent text"})
    parts = archive.con.execute("SELECT count(*) FROM llm_prompt_parts").fetchall()[0][0]
    prompt = archive.con.execute("SELECT prompt FROM llm_prompts WHERE call_id = 'k3'").fetchall()[0][0]
    assert parts == 2 and prompt == "system textparent text"
    usage = archive.con.execute("SELECT model, calls, ok, unparseable, children_ok, improvements FROM llm_usage "
                                "ORDER BY model").fetchall()
    assert usage == [("a", 2, 2, 0, 1, 1), ("b", 1, 0, 1, 0, 0)]


def test_the_driver_keeps_recent_feedback_and_failures_only_and_reads_older_feedback_back(tmp_path, monkeypatch):
    from controller import proposals

    monkeypatch.setattr(proposals, "FEEDBACK_KEPT", 8)
    monkeypatch.setattr(proposals, "FAILURES_KEPT", 8)
    archive = _archive(tmp_path)
    kept = Proposals(_config(["a"]), archive, RUN, get_domain("inventory"), Dedup())
    code = "PARAMS = {'k': (1.0, 0.0, 2.0)}\n\ndef policy(s, p):\n    return p['k']\n"
    for i in range(100):  # a long run's children, each evaluated once; each a parent's failure too
        child = Candidate(f"k{i}", RUN, 0, 1, (f"parent{i}",), code, "llm:a", time.time())
        kept.on_evaluated(child, EvalResult(f"k{i}", "search", Status.OK, score=-float(i)), None)
        kept.on_evaluated(child, EvalResult(f"k{i}", "search", Status.TIMEOUT, error="slow"), None)
    assert len(kept.evaluated) == 8 and len(kept.failures) == 8 and not kept.feedback
    assert list(kept.failures["parent99"]) == [("TIMEOUT", "slow")] and "parent0" not in kept.failures
    recent = kept._feedback("k99", code)  # made now, from the result in memory
    assert recent.score == -99.0 and recent.params == (("k", "1 in [0, 2]"),) and "k99" not in kept.evaluated
    assert kept._feedback("c1", "def policy(s, p):\n    return 2\n").score == -0.9  # long gone: the archive's row
    assert kept._feedback("k0", code) is None  # neither in memory nor committed
    for i in range(20):
        kept._feedback(f"k{80 + i}", code)
    assert len(kept.feedback) == 8


def test_replies_cut_at_max_tokens_three_in_a_row_are_said_once_with_what_to_raise(tmp_path):
    """A local model's context holds its prompt and its reply: raising max_tokens alone would not fit."""
    local = {"backend": "local", "name": "small", "max_tokens": 256, "context": 2048}
    config = validate({"domain": {"name": "inventory"}, "mutator": {"llm": {"models": [
        local, {"backend": "openai", "name": "big", "base_url": "http://127.0.0.1:1/v1", "model": "m"}]}}})
    with DuckDBArchive(tmp_path / "archive.duckdb") as archive:
        archive.create_run(RUN, {})
        proposals = Proposals(config, archive, RUN, get_domain("inventory"), Dedup())
        for cut in (True, True, False, True, True):  # a whole reply between: the count starts again
            proposals._maybe_cut("small", cut)
            proposals._maybe_cut("big", True)
        assert len(proposals.notices) == 1 and "'big'" in proposals.notices[0]  # 5 in a row, said at 3, once
        assert proposals.notices[0].endswith("atoll resume DIR --set mutator.llm.models.big.max_tokens=2048.")
        proposals._maybe_cut("small", True)
        assert len(proposals.notices) == 2 and proposals.notices[1].endswith(
            "--set mutator.llm.models.small.max_tokens=1024 --set mutator.llm.models.small.context=4096.")
        assert [e for e, _ in proposals.events].count("llm-replies-cut") == 2


def test_a_prompt_tells_the_worker_whether_the_domain_tunes_params(tmp_path):
    """The worker's duplicate check of a child against its parent leaves the PARAMS defaults out only
    where tuning sets them (not MILP's tune_trials = 0)."""
    from store.records import MutationRequest

    archive = _archive(tmp_path)
    request = MutationRequest(RUN, 0, 1, "seed", "def policy(s, p):\n    return 1\n")
    for name, tuned in (("inventory", True), ("milp", False)):
        proposals = Proposals(_config(["a"]), archive, RUN, get_domain(name), Dedup())
        assert proposals._prompt_input(proposals.llm.model("a"), request, {}, {}).tuned is tuned
