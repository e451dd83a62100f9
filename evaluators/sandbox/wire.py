"""Length-prefixed msgpack frames with numpy arrays, for the sandbox channel.

This module is imported by the trusted evaluator and, as a copy of its source,
by the sandboxed child: it must depend on nothing but numpy, msgpack and the
standard library. Decoding is strict on the trusted side: only plain numeric
dtypes, bounded sizes, and a shape that matches the bytes.
"""
import struct

import msgpack
import numpy as np

ARRAY_EXT = 1
MAX_FRAME = 256 * 1024 * 1024
_DTYPES = {"<f8", "<f4", "<i8", "<i4", "|b1", "<u1", "|u1", "|i1", "<i2"}


class WireError(Exception):
    """The peer sent something that is not a well-formed frame."""


def _default(obj):
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        header = msgpack.packb([arr.dtype.str, list(arr.shape)])
        return msgpack.ExtType(ARRAY_EXT, header + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send {type(obj).__name__}")


def _ext_hook(code, data):
    if code != ARRAY_EXT:
        raise WireError(f"unknown extension type {code}")
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data))
    unpacker.feed(data)
    dtype, shape = next(unpacker)
    if dtype not in _DTYPES or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise WireError(f"array of dtype {dtype!r} and shape {shape!r} is not allowed")
    body = data[unpacker.tell():]
    count = int(np.prod(shape)) if shape else 1
    if count * np.dtype(dtype).itemsize != len(body):
        raise WireError("array bytes do not match its shape")
    return np.frombuffer(body, dtype=dtype).reshape(shape)


def pack(obj) -> bytes:
    body = msgpack.packb(obj, default=_default, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def unpack(body: bytes):
    try:
        return msgpack.unpackb(body, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"malformed message: {exc}") from None


def frame_length(header: bytes) -> int:
    (length,) = struct.unpack(">I", header)
    if length > MAX_FRAME:
        raise WireError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    return length
