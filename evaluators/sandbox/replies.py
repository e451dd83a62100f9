"""Reading a candidate's replies strictly: the trusted side of the sandbox channel.

`read_reply` never builds an object it has not checked first: it walks the frame's
msgpack headers and refuses, before anything is allocated, a container or string
longer than the reply may hold, a field of the wrong type, an array of more numbers
than the request asked for and any byte left over. The frame itself is bounded by
the caller (`wire.frame_length(header, limit)`) from the same request. `Replies`
reads one candidate's replies in turn. The sandboxed child never imports this module.
"""
import math
import struct

import numpy as np

from evaluators.sandbox.wire import ARRAY_EXT, MAX_DIMS, UINT, WireError, read_array

TEXT_BYTES = 4096  # a candidate's error text is cut to this many bytes
_NAME_BYTES = 64  # a protection's name
_NAMES = 16  # protections in a start-up reply
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_EXT_SIZES = {0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}


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

    def uint(self, what: str) -> int:
        byte = self._take(1)[0]
        if byte <= 0x7F:
            return byte
        if byte not in UINT:
            raise WireError(f"{what} is not a non-negative integer")
        fmt = UINT[byte]
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

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
        return read_array(self._take(n), max_items)

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
    if "flat" in reply:  # the same arrays, sent as one
        reply["actions"] = reply.pop("flat")
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
    if key == "flat" and max_items is not None:
        return _flat_field(reader, max_items)
    if key == "ready":
        return [reader.text(_NAME_BYTES, "a protection's name") for _ in range(reader.array(_NAMES, "'ready'"))]
    if key in ("missing", "unsafe"):
        return {reader.text(_NAME_BYTES, "a protection's name"): reader.text(400, "a reason")
                for _ in range(reader.map(_NAMES, f"{key!r}"))}
    raise WireError(f"unexpected field {key[:16]!r}")


def _flat_field(reader: _Reader, max_items: list[int]) -> list[np.ndarray]:
    """[[shape, ...], array]: each shape within its batch's bound, the array exactly their numbers."""
    if reader.array(2, "'flat'") != 2:
        raise WireError("'flat' is not [shapes, array]")
    shapes, sizes = [], []
    for i in range(reader.array(len(max_items), "'flat' shapes")):
        shape = [reader.uint(f"action array {i}'s shape") for _ in range(reader.array(MAX_DIMS, f"action array {i}'s shape"))]
        size = math.prod(shape)
        if size > max_items[i]:
            raise WireError(f"an array of {size} numbers where this request allows at most {max_items[i]}")
        shapes.append(shape)
        sizes.append(size)
    data = reader.ext(sum(sizes), "'flat' actions")
    if data.ndim != 1 or data.size != sum(sizes):
        raise WireError("the flat actions do not match their shapes")
    return _split(data, shapes, sizes)


def _split(data: np.ndarray, shapes: list, sizes: list[int]) -> list[np.ndarray]:
    """The flat data cut into its arrays; a shape of no numbers but a dimension numpy cannot hold is malformed."""
    out, start = [], 0
    for shape, size in zip(shapes, sizes):
        try:
            out.append(data[start:start + size].reshape(shape))
        except ValueError:
            raise WireError(f"an array of shape {str(shape)[:40]} is not allowed") from None
        start += size
    return out


_FLAT_KEY = b"\x81\xa4flat"  # a reply of one field, "flat"


class Replies:
    """One candidate's replies to requests, read with `read_reply`; a flat reply that repeats the
    last one's bytes up to its actions' data, under the same bounds and at the same length, is
    read from the layout learned then instead of being walked again: the same bytes read the
    same way, and the data (any bytes are numbers) are exactly as long."""

    def __init__(self):
        self._last = None  # (bounds, length, prefix, dtype, shapes, sizes, one shape for all) of the last flat reply

    def read(self, body: bytes, max_items: list[int]) -> dict:
        last = self._last
        if last is not None and len(body) == last[1] and max_items == last[0] and body.startswith(last[2]):
            data = np.frombuffer(body, last[3], offset=len(last[2]))
            if last[6] is not None:  # every array has one shape: one reshape, and numpy hands out the rows
                return {"actions": list(data.reshape(last[6]))}
            return {"actions": _split(data, last[4], last[5])}
        reply = read_reply(body, max_items)
        actions = reply.get("actions")
        if body.startswith(_FLAT_KEY) and actions:
            sizes = [a.size for a in actions]
            data_bytes = sum(sizes) * actions[0].dtype.itemsize
            shapes = [a.shape for a in actions]
            rows = (len(shapes),) + shapes[0] if len(set(shapes)) == 1 and shapes[0] else None
            self._last = (list(max_items), len(body), body[:len(body) - data_bytes], actions[0].dtype,
                          shapes, sizes, rows)
        return reply
