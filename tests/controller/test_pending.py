"""The run loop's jobs table keeps its per-kind counts through every way a job comes and goes."""
from controller.cluster import Pending


def test_counts_follow_every_change():
    jobs = Pending()
    jobs["a"], jobs["b"], jobs["c"] = ("eval", 1, 0), ("mutate", 2, 0), ("eval", 3, 1)
    assert (jobs.count("eval"), jobs.count("mutate"), jobs.count("llm"), jobs.count()) == (2, 1, 0, 3)
    jobs["a"] = ("heldout", 1, 0)  # replaced: counted once, under its new kind
    assert (jobs.count("eval"), jobs.count("heldout")) == (1, 1)
    assert set(jobs.sent) == {"a", "b", "c"}  # when each was sent (controller.faults.sent_after_death)
    del jobs["b"]
    assert jobs.pop("c")[0] == "eval" and jobs.pop("zz", None) is None
    assert (jobs.count("eval"), jobs.count("mutate")) == (0, 0)
    ref, _ = jobs.popitem()
    assert ref == "a" and jobs.count("heldout") == 0 and jobs.count() == 0
    jobs["d"] = ("llm", 4, None)
    assert set(jobs.sent) == {"d"}  # none kept of a job gone
    jobs.clear()
    assert jobs.count("llm") == 0 and not jobs and not jobs.sent
