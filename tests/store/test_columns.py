"""The write path's column builders keep what the archive stored before: JSON values, statuses, floats."""
import dataclasses
import datetime
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from store.columns import finite_lists, floats, json_column, statuses, to_json
from store.records import Status
from tests.conftest import ROOT


@dataclasses.dataclass
class _Point:
    x: int = 1


@pytest.mark.parametrize("value", [
    {"a": 1.5, "nan": float("nan"), "inf": [1, float("-inf")], "t": (1, 2), "s": "h\u00e9llo"},
    {"f32": np.float32(0.1), "arr": np.array([1.0, np.nan]), "i": np.int64(3), "b": np.bool_(True)},
    {"when": datetime.datetime(2026, 1, 1), "point": _Point(), "status": Status.OK},
    {1: "an int key", None: "a null key"}, {"big": 2**70}, None, [1e16, 1e-7, -0.0],
])
def test_json_holds_the_values_the_standard_encoder_wrote(value):
    def jsonable(v):
        return v.tolist() if hasattr(v, "tolist") else v.value if hasattr(v, "value") else str(v)

    def clean(v):  # non-finite floats are null, as they always were in the archive
        if isinstance(v, float):
            return v if np.isfinite(v) else None
        if isinstance(v, dict):
            return {str(k) if not isinstance(k, str) else k: clean(x) for k, x in v.items()}
        return [clean(x) for x in v] if isinstance(v, (list, tuple)) else v
    expected = clean(json.loads(json.dumps(value, default=jsonable)))
    assert json.loads(to_json(value)) == expected
    assert json.loads(json_column([value]).to_pylist()[0]) == expected


def test_statuses_floats_and_lists_as_stored():
    assert statuses([Status.OK, "TIMEOUT"]) == ["OK", "TIMEOUT"]
    assert statuses([None, Status.RACED], nullable=True) == [None, "RACED"]
    with pytest.raises(ValueError):
        statuses(["not a status"])
    assert floats([1, None, float("nan"), np.float64(2.5), "3.5"]).to_pylist() == [1.0, None, None, 2.5, 3.5]
    assert finite_lists([(1.0, float("inf")), ()]).to_pylist() == [[1.0, None], []]


_WRITES = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, sys.argv[1])
    from store import library_records as records
    from store.duckdb_archive import DuckDBArchive
    from store.library import Library
    from store.llm_calls import CALL_COLUMNS, insert_calls
    from store.records import Candidate, EvalResult, Status

    def cand(pid, parents=(), gen=1):
        return Candidate(pid, "r1", 0, gen, parents, f"def policy(s, p):\\n    return {pid!r}", "seed", time.time())

    def ok(pid, score, split="search"):
        return EvalResult(pid, split, Status.OK, score=score, metrics={"cost": -score}, instance_scores=(score,),
                          descriptors=(0.5,), duration_s=0.1)

    with DuckDBArchive(sys.argv[2] + "/archive.duckdb") as archive:
        archive.create_run("r1", {"run": {"name": "t"}}, "")
        archive.write("r1", pairs=[(cand("a", (), 0), ok("a", -1.0))], events=[("started", {"pid": 1})],
                      snapshot=b"islands")
        call = {c: None for c in CALL_COLUMNS} | {"call_id": "c1", "run_id": "r1", "program_id": "b",
                                                  "tokens_in": 3, "tokens_out": 4}
        archive.write("r1", pairs=[(cand("b", ("a",)), ok("b", -0.5))], evaluations=[ok("a", -1.1, "heldout")],
                      also=lambda: insert_calls(archive, [call], {"part-1": "a prompt part"}))
        archive.write("r1", evaluations=[EvalResult("b", "search", Status.FAILED, error="rerun failed")])
    uses = [{"run_id": "r1", "program_id": "b", "skill_id": "s", "parent_id": "a", "status": "OK",
             "success": True, "gain": 0.5}]
    variants = [{"run_id": "r1", "program_id": "b", "variant_id": "v", "success": True}]
    Library(sys.argv[2] + "/library.duckdb").transaction(
        lambda con: (records.add_skill_uses(con, uses), records.add_variant_uses(con, variants)))
    written = "pandas" in sys.modules
    from store.arrow import pa
    frame = pa.table({"x": pa.array([1], pa.int64())}).to_pandas()  # pandas itself, when asked for
    print(json.dumps({"pandas imported by the writes": written, "asked for": type(frame).__name__}))
""")


def test_the_write_path_never_imports_pandas_and_pandas_is_there_when_asked_for(tmp_path):
    """pyarrow imports pandas (0.25 s of CPU) to look for pandas objects among Python values, and to
    guess a column's type; every column names its type and the look is answered once (store.arrow)."""
    proc = subprocess.run([sys.executable, "-c", _WRITES, str(ROOT), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"pandas imported by the writes": False,
                                                        "asked for": "DataFrame"}
