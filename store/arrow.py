"""pyarrow as the archive uses it: without pyarrow's look for pandas at the first table.

The first `pa.array` or `pa.table` built from Python values in a process asks whether the
values are pandas objects, and to answer, pyarrow imports pandas wherever it is installed; so
does its guess of a column's type (hence every column the archive builds names its type,
`store/columns.py: strings`). Together they cost a driver's first commit 152 ms of CPU
instead of 23 (`python3 benchmarks/first_commit.py --against DIR`). The archive hands pyarrow
lists and numpy arrays only, so the look is answered here, once, as if pandas were absent.
pyarrow tries again when pandas itself is asked for (`to_pandas()`), so nothing that needs
pandas loses it.
"""
from __future__ import annotations

import sys

import pyarrow as pa

__all__ = ["pa"]


class _NoPandas:
    """A finder that says pandas is not installed (for pyarrow's look only); None for anything else."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pandas":
            raise ModuleNotFoundError("pandas is not looked for by the archive", name="pandas")


def _look_without_pandas() -> None:
    if "pandas" in sys.modules:  # imported already: the look costs nothing more
        return
    sys.meta_path.insert(0, _NoPandas)
    try:
        pa.array([], pa.int8())
    finally:
        sys.meta_path.remove(_NoPandas)


_look_without_pandas()
