"""Shared memory that a candidate's process can read but never write: where each request's states go.

The evaluator makes one `StateArea` per candidate's process (a sealed memfd,
mapped read-write here), passes its descriptor to the process at spawn, and
the process maps it read-only before any candidate code runs (`_child`). A
request then carries its arrays in the area and only their place (offset,
dtype, shapes) and its scalars on the pipe, which stays the doorbell and the
only way back: the evaluator never reads the area, so nothing a candidate
does to it can reach the trusted side.

The seals hold against the candidate whatever descriptor or mapping it finds:
`F_SEAL_FUTURE_WRITE` refuses every write, writable shared mapping and
`mprotect` to writing made after it (only the evaluator's mapping, made
before, writes), `F_SEAL_SHRINK` and `F_SEAL_GROW` keep its size (a shrunken
file would fault the evaluator's writes), `F_SEAL_SEAL` keeps the seals.
Pages cost memory only once written; a request larger than the area goes on
the pipe as before.
"""
from __future__ import annotations

import fcntl
import mmap
import os

import numpy as np

CAPACITY = 4 << 20  # bytes; the default inventory evaluation writes about 27 KiB a period
F_SEAL_FUTURE_WRITE = 0x0010  # Linux 5.1; Python's fcntl does not name it before 3.12
SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE
_ALIGN = 64


class StateArea:
    """One candidate's read-only window on its requests' arrays; `fd` goes to its process, once."""

    def __init__(self, size: int = CAPACITY):
        self.fd = os.memfd_create("atoll-states", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size)  # shared, read-write: ours alone once sealed
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size
        self._bytes = np.frombuffer(self._map, np.uint8)
        self.used = 0

    def reset(self) -> None:
        """A new request: its arrays go from the start again (the last one has been answered)."""
        self.used = 0

    def place(self, arrays, dtype: np.dtype, count: int) -> int | None:
        """Copy `arrays` (of `dtype`, `count` numbers in all) one after another, flattened; their
        offset, or None if the area is full."""
        start = -(-self.used // _ALIGN) * _ALIGN
        end = start + count * dtype.itemsize
        if end > self.size:
            return None
        np.concatenate(arrays, axis=None, out=self._bytes[start:end].view(dtype))  # each array flattened
        self.used = end
        return start

    def close_fd(self) -> None:
        """Our copy of the descriptor, once the process has its own (the mapping stays)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self) -> None:
        self.close_fd()
        self._bytes = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view of it is still alive: unmapped when the last one goes
                pass
            self._map = None
