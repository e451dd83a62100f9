"""Length-prefixed msgpack frames with numpy arrays, for the sandbox channel.

This module is imported by the trusted evaluator and, by file, by the sandboxed
child: it must depend on nothing but numpy, msgpack and the standard library.

The child reads the evaluator's messages with `unpack` (they are trusted). The
evaluator reads a candidate's replies with `sandbox.replies`, strictly, and bounds
each frame with `frame_length(header, limit)` from the same request.
"""
import math
import operator
import struct

import msgpack
import numpy as np

ARRAY_EXT = 1
MAX_DIMS = 4
_DTYPES = {"<f8", "<f4", "<i8", "<i4", "|b1", "<u1", "|u1", "|i1", "<i2"}
_ITEMSIZE = {d: np.dtype(d).itemsize for d in _DTYPES}
_PLAIN = {int, float, bool}
_SCALARS = _PLAIN | {np.float64, np.float32, np.int64, np.int32, np.bool_}


class WireError(Exception):
    """The peer sent something that is not a well-formed reply; the text is a short reason."""


_HEADERS: dict = {}  # (dtype, shape) -> its packed header: a frame repeats the same few shapes
UINT = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q"}


def _default(obj):
    if isinstance(obj, np.ndarray):
        arr = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
        key = (arr.dtype.str, arr.shape)
        header = _HEADERS.get(key)
        if header is None:
            header = msgpack.packb([arr.dtype.str, list(arr.shape)])
            if len(_HEADERS) < 4096:
                _HEADERS[key] = header
        return msgpack.ExtType(ARRAY_EXT, header + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send {type(obj).__name__}")


def _header(data: bytes) -> tuple[str, list, int]:
    """(dtype, shape, where the bytes start) of an array's payload: a msgpack [str, [int, ...]], read by hand.

    Only the forms a packer writes are accepted (a fixarray of two, a fixstr of at most 8
    bytes, a fixarray of at most four non-negative integers); anything else is malformed.
    """
    try:
        if data[0] != 0x92 or not 0xA0 <= data[1] <= 0xA8:
            raise WireError("an array's header is malformed")
        end = 2 + data[1] - 0xA0
        dtype = data[2:end].decode("ascii")
        dims = data[end] - 0x90
        if not 0 <= dims <= MAX_DIMS:
            raise WireError("an array's header is malformed")
        pos, shape = end + 1, []
        for _ in range(dims):
            byte = data[pos]
            if byte <= 0x7F:
                shape.append(byte)
                pos += 1
            elif byte in UINT:
                fmt = UINT[byte]
                shape.append(struct.unpack_from(fmt, data, pos + 1)[0])
                pos += 1 + struct.calcsize(fmt)
            else:
                raise WireError(f"an array of dtype {dtype[:8]!r} and shape {data[end:end + 40]!r} is not allowed")
    except (IndexError, UnicodeDecodeError, struct.error):
        raise WireError("an array's header is malformed") from None
    return dtype, shape, pos


def read_array(data: bytes, max_items: int) -> np.ndarray:
    """An array from its extension payload: [dtype, shape] then the raw bytes, all checked first."""
    dtype, shape, start = _header(data)
    if dtype not in _DTYPES:
        raise WireError(f"an array of dtype {str(dtype)[:8]!r} and shape {str(shape)[:40]} is not allowed")
    count = math.prod(shape)
    if count > max_items:
        raise WireError(f"an array of {count} numbers where this request allows at most {max_items}")
    itemsize = _ITEMSIZE.get(dtype) or np.dtype(dtype).itemsize
    if count * itemsize != len(data) - start:
        raise WireError("an array's bytes do not match its shape")
    try:
        return np.frombuffer(data, dtype=dtype, offset=start).reshape(shape)
    except ValueError:  # no numbers, but a dimension numpy cannot hold
        raise WireError(f"an array of shape {str(shape)[:40]} is not allowed") from None


def _ext_hook(code, data):
    if code != ARRAY_EXT:
        raise WireError(f"unknown extension type {code}")
    return read_array(data, len(data))


def pack(obj) -> bytes:
    body = msgpack.packb(obj, default=_default, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


_REPLY_HEADS: dict = {}  # (dtype, shapes, count) -> a flat reply's frame up to its data


def pack_reply(reply: dict) -> bytes:
    """`pack` for the candidate's side: a flat reply's frame up to its data is kept by its layout
    (dtype, shapes, count), so a policy that answers alike each period costs one copy of its data."""
    flat = reply.get("flat")
    if flat is None or len(reply) != 1:
        return pack(reply)
    shapes, data = flat
    key = (data.dtype.str, tuple(map(tuple, shapes)), data.size)
    head = _REPLY_HEADS.get(key)
    if head is None:
        frame = pack(reply)
        if len(_REPLY_HEADS) < 256:
            _REPLY_HEADS[key] = frame[:len(frame) - data.nbytes]
        return frame
    return head + data.tobytes()


def unpack(body: bytes):
    """Decode a trusted message (the evaluator's request, in the child)."""
    try:
        return msgpack.unpackb(body, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"malformed message: {exc}") from None


# --- one frame per request: every batch's arrays of a key in one flat array ---------------
def flat_batches(batches: list) -> dict | None:
    """A request of (state, params) batches as columns: each key's arrays concatenated into one
    array with their shapes, or its scalars as one list. None when the batches do not share one
    layout (then they go as they are)."""
    request = flat_request(batches)
    return request[0] if request is not None else None


def flat_request(batches: list, area=None) -> tuple[dict, list[int]] | None:
    """`flat_batches`, with each array column placed in `area` (a `StateArea`) when it fits there
    (the frame then says where: offset, dtype, shapes); also how many numbers each batch's state holds."""
    sizes: list = []
    states = _columns([s for s, _ in batches], area, sizes)
    params = _columns([p for _, p in batches], area, None) if states is not None else None
    if params is None:
        return None
    flat = {"n": len(batches), "state": states, "params": params}
    if area is not None and area.used:
        flat["used"] = area.used  # the bytes of the area this request filled
    scalars = len(states) - len(sizes)
    numbers = [sum(per_batch) + scalars for per_batch in zip(*sizes)] if sizes else [scalars] * len(batches)
    return {"flat": flat}, numbers


_DICT, _STR, _ARRAY = {dict}, {str}, {np.ndarray}
_DTYPE, _SIZE, _SHAPE = (operator.attrgetter(name) for name in ("dtype", "size", "shape"))


def _columns(dicts: list, area, sizes: list | None) -> dict | None:
    """Each key's values across `dicts` as one column (C-level maps: this runs every period)."""
    if not dicts or set(map(type, dicts)) != _DICT:
        return None
    keys = tuple(dicts[0])
    if len(set(map(tuple, dicts))) != 1 or set(map(type, keys)) - _STR:
        return None
    out = {}
    for key, values in zip(keys, zip(*map(dict.values, dicts))):
        kinds = set(map(type, values))
        if kinds == _ARRAY:
            column = out[key] = _array_column(values, area, sizes)
            if column is None:
                return None
        elif kinds <= _PLAIN:
            out[key] = values
        elif kinds <= _SCALARS:
            out[key] = [v.item() if isinstance(v, np.generic) else v for v in values]
        else:
            return None
    return out


def _array_column(values: tuple, area, sizes: list | None) -> dict | None:
    dtypes = set(map(_DTYPE, values))
    dtype = dtypes.pop()
    if dtypes or dtype.str not in _DTYPES:
        return None
    counts, shapes = list(map(_SIZE, values)), list(map(_SHAPE, values))
    if sizes is not None:
        sizes.append(counts)
    count = sum(counts)
    at = area.place(values, dtype, count) if area is not None else None
    column = {"shape": shapes[0]} if len(set(shapes)) == 1 and shapes[0] else {"shapes": shapes}
    if at is not None:
        column.update(at=at, dtype=dtype.str, count=count)
    else:
        column["data"] = np.concatenate(values, axis=None)
    return column


def unflatten(flat: dict, area=None) -> list:
    """The (state, params) batches of a flat request (trusted input; in the candidate's process).

    What the request placed in the shared `area` is copied out first, in one piece (so the
    arrays are read-only, like those of a frame, and what the policy keeps from one period
    does not change under it in the next).
    """
    n, used = flat["n"], flat.get("used")
    blob = area[:used] if used else None
    return list(zip(_rows(flat["state"], n, blob), _rows(flat["params"], n, blob)))


def _rows(columns: dict, n: int, blob) -> list[dict]:
    """Each row's dict, its keys in the request's order (scalars zipped in, arrays cut from their data)."""
    keys = list(columns)
    values = [_arrays(c, n, blob) if type(c) is dict else c for c in columns.values()]
    return [dict(zip(keys, row)) for row in zip(*values)] if keys else [{} for _ in range(n)]


def _arrays(column: dict, n: int, blob) -> list:
    """One array column's arrays: views of its data, in the frame or in the area's copy."""
    data = np.frombuffer(blob, column["dtype"], column["count"], column["at"]) if "at" in column else column["data"]
    if "shape" in column:  # every batch's array has this shape: one reshape, and numpy hands out the rows
        return list(data.reshape([n] + column["shape"]))
    out, start = [], 0
    for shape in column["shapes"]:
        size = math.prod(shape)
        out.append(data[start:start + size].reshape(shape))
        start += size
    return out


def flat_actions(actions: list) -> dict:
    """A reply's action arrays as one array and their shapes, when they share an allowed dtype."""
    dtypes = set(map(_DTYPE, actions))
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    if dtype is None or dtype.str not in _DTYPES:
        return {"actions": actions}
    return {"flat": [list(map(_SHAPE, actions)), np.concatenate(actions, axis=None)]}


def frame_length(header: bytes, limit: int) -> int:
    (length,) = struct.unpack(">I", header)
    if length > limit:
        raise WireError(f"a reply of {length} bytes where this request allows at most {limit}")
    return length
