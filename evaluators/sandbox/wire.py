"""Length-prefixed msgpack frames with numpy arrays, for the sandbox channel.

This module is imported by the trusted evaluator and, by file, by the sandboxed
child: it must depend on nothing but numpy, msgpack and the standard library.

The child reads the evaluator's messages with `unpack` (they are trusted). The
evaluator reads a candidate's reply with `read_reply`, which never builds an
object it has not checked first: it walks the frame's msgpack headers and
refuses, before anything is allocated, a container or string longer than the
reply may hold, a field of the wrong type, an array of more numbers than the
request asked for and any byte left over. The frame itself is bounded by the
caller (`frame_length(header, limit)`) from the same request.
"""
import math
import struct

import msgpack
import numpy as np

ARRAY_EXT = 1
TEXT_BYTES = 4096  # a candidate's error text is cut to this many bytes
_NAME_BYTES = 64  # a protection's name
_NAMES = 16  # protections in a start-up reply
_MAX_DIMS = 4
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_EXT_SIZES = {0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}
_DTYPES = {"<f8", "<f4", "<i8", "<i4", "|b1", "<u1", "|u1", "|i1", "<i2"}


class WireError(Exception):
    """The peer sent something that is not a well-formed reply; the text is a short reason."""


def _default(obj):
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        header = msgpack.packb([arr.dtype.str, list(arr.shape)])
        return msgpack.ExtType(ARRAY_EXT, header + arr.tobytes())
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot send {type(obj).__name__}")


def _array(data: bytes, max_items: int) -> np.ndarray:
    """An array from its extension payload: [dtype, shape] then the raw bytes, all checked first."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data) or 1, max_str_len=8,
                                max_array_len=_MAX_DIMS, max_map_len=0, max_bin_len=0, max_ext_len=0)
    unpacker.feed(data)
    try:
        dtype, shape = next(unpacker)
    except Exception:  # noqa: BLE001  msgpack raises several unrelated types
        raise WireError("an array's header is malformed") from None
    if dtype not in _DTYPES or not isinstance(shape, list) or \
            not all(type(s) is int and s >= 0 for s in shape):
        raise WireError(f"an array of dtype {str(dtype)[:8]!r} and shape {str(shape)[:40]} is not allowed")
    count = math.prod(shape)
    if count > max_items:
        raise WireError(f"an array of {count} numbers where this request allows at most {max_items}")
    body = data[unpacker.tell():]
    if count * np.dtype(dtype).itemsize != len(body):
        raise WireError("an array's bytes do not match its shape")
    return np.frombuffer(body, dtype=dtype).reshape(shape)


def _ext_hook(code, data):
    if code != ARRAY_EXT:
        raise WireError(f"unknown extension type {code}")
    return _array(data, len(data))


def pack(obj) -> bytes:
    body = msgpack.packb(obj, default=_default, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def unpack(body: bytes):
    """Decode a trusted message (the evaluator's request, in the child)."""
    try:
        return msgpack.unpackb(body, ext_hook=_ext_hook, raw=False, strict_map_key=True)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        raise WireError(f"malformed message: {exc}") from None


def frame_length(header: bytes, limit: int) -> int:
    (length,) = struct.unpack(">I", header)
    if length > limit:
        raise WireError(f"a reply of {length} bytes where this request allows at most {limit}")
    return length


class _Reader:
    """Walks msgpack headers in a frame without building anything it has not checked."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def _take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise WireError("the reply ends early")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def _size(self, fix_lo: int, fix_hi: int, wide: dict, what: str, kind: str) -> int:
        byte = self._take(1)[0]
        if fix_lo <= byte <= fix_hi:
            return byte - fix_lo
        if byte not in wide:
            raise WireError(f"{what} is not {kind}")
        fmt = wide[byte]
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def map(self, most: int, what: str) -> int:
        n = self._size(0x80, 0x8F, {0xDE: ">H", 0xDF: ">I"}, what, "a map")
        if n > most:
            raise WireError(f"{what} has {n} fields")
        return n

    def array(self, most: int, what: str) -> int:
        n = self._size(0x90, 0x9F, {0xDC: ">H", 0xDD: ">I"}, what, "a list")
        if n > most:
            raise WireError(f"{what} has {n} items where at most {most} are allowed")
        return n

    def text(self, most: int, what: str) -> str:
        """A string, cut to `most` bytes (the rest is skipped, never decoded)."""
        n = self._size(0xA0, 0xBF, {0xD9: ">B", 0xDA: ">H", 0xDB: ">I"}, what, "text")
        if self.pos + n > len(self.data):
            raise WireError("the reply ends early")
        self.pos += n
        return self.data[self.pos - n:self.pos - n + min(n, most)].decode("utf-8", errors="replace")

    def ext(self, max_items: int, what: str) -> np.ndarray:
        byte = self._take(1)[0]
        if byte in _FIXEXT:
            n = _FIXEXT[byte]
        elif byte in _EXT_SIZES:
            fmt = _EXT_SIZES[byte]
            n = struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]
        else:
            raise WireError(f"{what} is not an array of numbers")
        code = struct.unpack(">b", self._take(1))[0]
        if code != ARRAY_EXT:
            raise WireError(f"{what} is not an array of numbers")
        return _array(self._take(n), max_items)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise WireError("the reply has bytes after its end")


def read_reply(body: bytes, max_items: list[int] | None = None) -> dict:
    """A candidate's reply, every field checked; `max_items` is None at start-up, else per batch.

    Start-up replies: {"ready": [protection, ...], "missing": {protection: why}} or
    {"error": text} or {"unsafe": {protection: why}}. Replies to a request of n
    batches: {"actions": [array * n]} or {"error": text}. Anything else raises
    `WireError` with a short reason.
    """
    reader = _Reader(body)
    fields = reader.map(2, "the reply")
    if fields == 0:
        raise WireError("the reply is empty")
    reply = {}
    for _ in range(fields):
        key = reader.text(16, "a field name")
        if key in reply:
            raise WireError(f"the field {key!r} appears twice")
        reply[key] = _field(reader, key, max_items)
    reader.done()
    allowed = ({"error"}, {"actions"}) if max_items is not None else \
        ({"error"}, {"ready"}, {"ready", "missing"}, {"unsafe"})
    if set(reply) not in allowed:
        raise WireError(f"a reply with fields {sorted(reply)} is not expected here")
    return reply


def _field(reader: _Reader, key: str, max_items):
    if key == "error":
        return reader.text(TEXT_BYTES, "'error' text")
    if key == "actions" and max_items is not None:  # fewer arrays than batches is the caller's to report
        count = reader.array(len(max_items), "'actions'")
        return [reader.ext(max_items[i], f"action array {i}") for i in range(count)]
    if key == "ready":
        return [reader.text(_NAME_BYTES, "a protection's name") for _ in range(reader.array(_NAMES, "'ready'"))]
    if key in ("missing", "unsafe"):
        return {reader.text(_NAME_BYTES, "a protection's name"): reader.text(400, "a reason")
                for _ in range(reader.map(_NAMES, f"{key!r}"))}
    raise WireError(f"unexpected field {key[:16]!r}")
