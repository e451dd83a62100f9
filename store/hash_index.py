"""Compact in-memory maps keyed by 64-bit hashes, for archives of millions of programs.

A Python dict or set of a million string keys costs about 100 bytes a key; these
keep sorted numpy arrays (8 bytes a key, 8 a value) plus a small dict of the keys
added since the last merge, merged in linear time once it grows.
"""
from __future__ import annotations

import hashlib
from collections.abc import Set
from typing import Iterable, Iterator, Sequence

import numpy as np

_MERGE_AT = 1 << 16


def id_hash(program_id: str) -> int:
    """The program id's 64-bit hash as the archive stores it (programs.id_hash).

    The first 8 bytes of its MD5, big-endian: `('0x' || md5(id)[1:16])::UBIGINT` in SQL.
    """
    return int.from_bytes(hashlib.md5(program_id.encode()).digest()[:8], "big")


def id_hashes(program_ids: Sequence[str]) -> list[int]:
    """`id_hash` of each id: the digests joined and read as one big-endian array."""
    md5 = hashlib.md5
    digests = b"".join([md5(p.encode()).digest()[:8] for p in program_ids])
    return np.frombuffer(digests, dtype=">u8").tolist()


class HashIndex:
    """64-bit key -> a tuple of numbers (the same arity for every key)."""

    def __init__(self, keys: np.ndarray, *columns: np.ndarray):
        order = np.argsort(keys, kind="stable")
        self._keys = np.asarray(keys, dtype=np.uint64)[order]
        self._columns = [np.asarray(c)[order] for c in columns]
        self._recent: dict[int, tuple] = {}

    def __len__(self) -> int:
        return len(self._keys) + len(self._recent)

    def __contains__(self, key: int) -> bool:
        return key in self._recent or self._position(key) is not None

    def get(self, key: int) -> tuple | None:
        if key in self._recent:
            return self._recent[key]
        i = self._position(key)
        return None if i is None else tuple(c[i].item() for c in self._columns)

    def get_many(self, keys: Sequence[int]) -> list[tuple | None]:
        """`get` for many keys at once (one vectorised search of the sorted arrays)."""
        found = [self._recent.get(k) for k in keys]
        missing = [i for i, value in enumerate(found) if value is None]
        if missing and len(self._keys):
            wanted = np.fromiter((keys[i] for i in missing), dtype=np.uint64, count=len(missing))
            pos = np.minimum(np.searchsorted(self._keys, wanted), len(self._keys) - 1)
            hit = self._keys[pos] == wanted
            rows = list(zip(*(c[pos].tolist() for c in self._columns))) if self._columns else [()] * len(pos)
            for i, h, row in zip(missing, hit.tolist(), rows):
                if h:
                    found[i] = row
        return found

    def put(self, key: int, *values) -> None:
        """Add `key`, or change its values."""
        i = self._position(key)
        if i is not None:
            for column, value in zip(self._columns, values):
                column[i] = value
            return
        self._recent[key] = tuple(values)
        if len(self._recent) >= _MERGE_AT:
            self._merge()

    def add_new(self, items: dict[int, tuple]) -> None:
        """Add keys known to be absent (looked up with `get_many` first), in bulk."""
        self._recent.update(items)
        if len(self._recent) >= _MERGE_AT:
            self._merge()

    def keys(self) -> Iterator[int]:
        yield from (int(k) for k in self._keys)
        yield from self._recent

    def nbytes(self) -> int:
        """Bytes held by the arrays (the recent dict is at most a few MB)."""
        return self._keys.nbytes + sum(c.nbytes for c in self._columns)

    def _position(self, key: int) -> int | None:
        if not len(self._keys):
            return None
        i = int(np.searchsorted(self._keys, np.uint64(key)))
        return i if i < len(self._keys) and int(self._keys[i]) == key else None

    def _merge(self) -> None:
        """Insert the recent keys into the sorted arrays in one linear pass."""
        recent = sorted(self._recent.items())
        new_keys = np.fromiter((k for k, _ in recent), dtype=np.uint64, count=len(recent))
        at = np.searchsorted(self._keys, new_keys)
        self._keys = np.insert(self._keys, at, new_keys)
        self._columns = [np.insert(c, at, np.array([v[j] for _, v in recent], dtype=c.dtype))
                         for j, c in enumerate(self._columns)]
        self._recent = {}


class HashSet(Set):
    """A set of 16-hex-digit hashes (`store.records.code_hash`), 8 bytes each.

    Behaves like the `set[str]` it replaces: `in`, `add`, `len`, iteration (as hex),
    comparisons. A string that is not 16 hex digits is simply not in the set.
    """

    @classmethod
    def _from_iterable(cls, values):
        return set(values)

    def __init__(self, values: np.ndarray | Iterable[int] = ()):
        keys = np.sort(np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.uint64))
        if len(keys):  # np.unique is ten times slower than this on a million 64-bit keys
            keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
        self._index = HashIndex(keys)

    @staticmethod
    def _key(value: str) -> int | None:
        if len(value) != 16:
            return None
        try:
            return int(value, 16)
        except ValueError:
            return None

    def __contains__(self, value: str) -> bool:
        key = self._key(value)
        return key is not None and key in self._index

    def add(self, value: str) -> None:
        key = self._key(value)
        if key is None:
            raise ValueError(f"not a 16-hex-digit hash: {value!r}")
        if key not in self._index:
            self._index.put(key)

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[str]:
        return (f"{k:016x}" for k in self._index.keys())

    def nbytes(self) -> int:
        return self._index.nbytes()
