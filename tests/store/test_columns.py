"""The write path's column builders keep what the archive stored before: JSON values, statuses, floats."""
import dataclasses
import datetime
import json

import numpy as np
import pytest

from store.columns import finite_lists, floats, json_column, statuses, to_json
from store.records import Status


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
