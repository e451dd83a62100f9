"""Columns for the archive's Arrow tables, built a whole column at a time.

A batch of a thousand programs is turned into a few dozen columns; each helper
here takes one column's Python values and does its per-value work in C where it
can (orjson for JSON text, pyarrow for finiteness), so the write path's cost per
row stays a small multiple of a list comprehension.
"""
from __future__ import annotations

import json
import math

import orjson
import pyarrow.compute as pc

from store.arrow import pa
from store.records import Status

FLOATS = pa.list_(pa.float64())
# orjson's own handling of dataclasses and datetimes differs from the standard library's:
# `default` below gets them (and numpy values), as json.JSONEncoder's did, so the text holds
# the same values as before.
_ORJSON = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
_STATUS = {**{s: s.value for s in Status}, **{s.value: s.value for s in Status}}
_NULLABLE_STATUS = {**_STATUS, None: None}


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "value"):
        return value.value
    return str(value)


def _clean(obj):
    """Replace non-finite floats (not valid JSON) with None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _clean(obj.tolist())
    return obj


_ENCODER = json.JSONEncoder(default=_jsonable, allow_nan=False)


def to_json(value) -> str:
    """JSON text; non-finite floats become null (they are not JSON).

    orjson writes it (it writes NaN and infinities as null itself); what orjson refuses
    (keys that are no strings, integers past 64 bits, nesting past 254) goes through the
    standard library's encoder, then a second pass that cleans non-finite floats out.
    """
    try:
        return orjson.dumps(value, default=_jsonable, option=_ORJSON).decode()
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        pass
    try:
        return _ENCODER.encode(value)
    except (ValueError, TypeError):
        return _ENCODER.encode(_clean(value))


def json_column(values: list) -> pa.Array:
    """JSON text of each value, as a string column (see `to_json`)."""
    dumps, option = orjson.dumps, _ORJSON
    try:
        return pa.array([dumps(v, default=_jsonable, option=option) for v in values], pa.binary()).cast(pa.string())
    except TypeError:
        return pa.array([to_json(v) for v in values], pa.string())


def statuses(values: list, nullable: bool = False) -> list[str | None]:
    """Status values as stored; a value that is no Status is a caller's bug (ValueError).
    With `nullable`, None stays None (a program without a search evaluation)."""
    table = _NULLABLE_STATUS if nullable else _STATUS
    try:
        return [table[s] for s in values]
    except (KeyError, TypeError):
        return [None if s is None and nullable else Status(s).value for s in values]


def strings(values) -> pa.Array:
    """A string column (None is null). Every column the archive builds names its type: pyarrow
    guessing one imports pandas to recognize its missing values (see `store.arrow`)."""
    return pa.array(values, pa.string())


def floats(values: list) -> pa.Array:
    """A float column; None and non-finite values become nulls."""
    try:
        array = pa.array(values, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        array = pa.array([None if v is None else float(v) for v in values], pa.float64())
    return _finite_only(array)


def plain_floats(values: list) -> pa.Array:
    """A float column as `float()` makes each value (non-finite values kept)."""
    try:
        return pa.array(values, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.array([float(v) for v in values], pa.float64())


def finite_lists(values: list) -> pa.Array:
    """Lists of floats as an Arrow column, non-finite values as nulls (vectorised)."""
    array = pa.array(values, FLOATS)
    finite = pc.is_finite(array.values)
    if pc.all(finite).as_py() is False:
        array = pa.ListArray.from_arrays(array.offsets, pc.if_else(finite, array.values, None))
    return array


def _finite_only(array: pa.Array) -> pa.Array:
    finite = pc.is_finite(array)
    if pc.all(finite).as_py() is False:  # a NaN or infinity: null (a null is no False here)
        array = pc.if_else(finite, array, None)
    return array
