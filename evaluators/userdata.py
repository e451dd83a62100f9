"""A user's own data for a built-in domain: a file or folder named in `[domain.options]`.

A data option is written as a path (`prices = "prices.csv"`) or as a table with
the path and the option's own settings. When the config loads, the path is
resolved against the config's folder and the content's SHA-256 is computed;
both go into the run's stored config (`pinned`), so the run's archive records
exactly what it was scored on. Whoever validates the option again (an evaluator
on any node, a resume) reads the file again and refuses, with one line, if its
content no longer matches what the run recorded.

The data stay on the trusted side: a domain reads them and sends candidates only
states. A candidate's root is an allow-list, so a user's file is out of its sight
wherever it lies; `hidden` also covers a folder that happens to lie inside one of
the allowed module folders.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import ClassVar, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

TABLE_SUFFIXES = (".csv", ".csv.gz", ".parquet", ".pq")


class UserData(BaseModel):
    """A file (or, for `folder = True` subclasses, a folder) of the user's, pinned by its content."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    folder: ClassVar[bool] = False

    path: str = Field(description="The file (or folder), relative to the config file; stored resolved.")
    sha256: str | None = Field(None, description="SHA-256 of the content, filled in when the config loads (for a "
                                                  "folder: of its files' names and contents). A run refuses to "
                                                  "continue on content that differs from what it recorded.")

    @model_validator(mode="before")
    @classmethod
    def _resolve_and_pin(cls, data, info: ValidationInfo):
        data = {"path": data} if isinstance(data, (str, os.PathLike)) else data
        if not isinstance(data, dict) or not isinstance(data.get("path"), (str, os.PathLike)):
            return data  # the field validators say what is missing
        base = Path((info.context or {}).get("config_dir") or os.getcwd())
        path = (base / Path(data["path"]).expanduser()).resolve()
        digest = content_digest(path, cls.folder)
        recorded = data.get("sha256")
        if recorded and recorded != digest:
            raise ValueError(f"{path} changed since the run recorded it (its content's sha256 is now "
                             f"{digest[:12]}..., the run's is {str(recorded)[:12]}...): restore it, or start "
                             "a new run on the new data")
        return dict(data, path=str(path), sha256=digest)


def distinct(values: list) -> list:
    """`values` (a list option: instances, assets, items, lead times, penalties) if no entry is
    there twice: a repeat counted twice in the score, as a heavier weight nobody asked for.
    For a pydantic list's `AfterValidator`."""
    seen = set()
    for value in values:
        key = repr(value.model_dump()) if isinstance(value, BaseModel) else value
        if key in seen:
            raise ValueError(f"{getattr(value, 'key', value)!r} is listed twice; each entry counts once in the "
                             "score, so remove the repeat")
        seen.add(key)
    return values


def content_digest(path: Path, folder: bool) -> str:
    """SHA-256 of a file's bytes, or of a folder's regular files (names and contents, sorted by name)."""
    kind = "folder" if folder else "file"
    if not path.exists():
        raise ValueError(f"{kind} {path} does not exist")
    if folder != path.is_dir():
        raise ValueError(f"{path} is {'a file' if path.is_file() else 'a folder'}; expected a {kind}")
    if not folder:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    total = hashlib.sha256()
    for child in sorted(p for p in path.iterdir() if p.is_file()):
        total.update(f"{child.name}\0{content_digest(child, False)}\n".encode())
    return total.hexdigest()


def pinned(options: dict, validated: BaseModel) -> dict:
    """`options` with each data option replaced by its resolved path and content digest (for the stored config)."""
    out = dict(options)
    for key, value in validated:
        if isinstance(value, UserData) and key in options:
            raw = options[key] if isinstance(options[key], dict) else {}
            out[key] = dict(raw, path=value.path, sha256=value.sha256)
    return out


def data_options(model: type[BaseModel]) -> dict[str, type[UserData]]:
    """The options of a domain's config model that name a user's data, each with its UserData class."""
    found = {name: _data_class(field.annotation) for name, field in model.model_fields.items()}
    return {name: cls for name, cls in found.items() if cls is not None}


def _data_class(annotation) -> type[UserData] | None:
    if isinstance(annotation, type) and issubclass(annotation, UserData):
        return annotation
    return next((cls for arg in get_args(annotation) if (cls := _data_class(arg)) is not None), None)


def hidden(path: str) -> tuple[str, ...]:
    """`path` for `Domain.sandbox_hide`, unless it holds the interpreter (then hiding it would hide Python;
    the candidate's allow-list root shows nothing of that folder but the allowed modules anyway)."""
    inside = [os.path.normpath(p) for p in (sys.prefix, sys.base_prefix, sys.executable)]
    top = os.path.normpath(path)
    if any(p == top or p.startswith(top.rstrip("/") + "/") for p in inside):
        return ()
    return (top,)


def read_table(path: str):
    """A CSV or Parquet file as a pyarrow Table; a file that is neither, or unreadable, is one clear line."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    name = path.lower()
    if not name.endswith(TABLE_SUFFIXES):
        raise ValueError(f"{path}: expected a CSV or Parquet file (a name ending in {', '.join(TABLE_SUFFIXES)})")
    parquet = name.endswith((".parquet", ".pq"))
    try:
        table = pq.read_table(path) if parquet else pcsv.read_csv(
            path, convert_options=pcsv.ConvertOptions(strings_can_be_null=True))
    except (pa.ArrowInvalid, OSError) as exc:
        raise ValueError(f"{path}: cannot read it as {'Parquet' if parquet else 'CSV'}: "
                         f"{str(exc).splitlines()[0]}") from None
    return _named(table, path, parquet)


def _named(table, path: str, parquet: bool):
    """`table` if its column names are text, each once; and, in a CSV, if every text column is UTF-8."""
    import pyarrow as pa

    try:
        names = table.column_names
    except UnicodeDecodeError:
        raise ValueError(f"{path}: its header is not UTF-8 text; save the file as UTF-8") from None
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{path}: the column {twice[0]!r} appears {names.count(twice[0])} times in its header; "
                         "give each column its own name")
    if not parquet:  # the CSV reader keeps text that is not UTF-8 as raw bytes
        raw = [n for n in names if pa.types.is_binary(table.schema.field(n).type)]
        if raw:
            raise ValueError(f"{path}: column {raw[0]!r} holds text that is not UTF-8; save the file as UTF-8")
    return table


def column(table, name: str, path: str, what: str, option: str):
    """The column `name` of `table`, or one line naming the columns there are and the option that names it."""
    if name not in table.column_names:
        raise ValueError(f"{path} has no {what} column {name!r} (its columns: {', '.join(table.column_names)}); "
                         f"name it with {option}")
    return table.column(name)


def labels(values, path: str, label: str) -> list[str]:
    """A pyarrow column of names (assets, items) as text; an empty cell is one line naming its row."""
    texts = values.to_pylist()
    if None in texts:
        raise ValueError(f"{path}: {label} is empty in data row {texts.index(None) + 1}")
    return [str(v) for v in texts]


def numbers(values, path: str, label: str) -> np.ndarray:
    """A pyarrow column as float64 (nulls as NaN); a value that is not a number is one line naming it."""
    import pyarrow as pa

    if pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_null(values.type):
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=float)
    for row, value in enumerate(values.to_pylist()):
        try:
            float(value) if value is not None else None
        except (TypeError, ValueError):
            raise ValueError(f"{path}: {label} holds a value that is not a number ({value!r} in data row "
                             f"{row + 1})") from None
    return np.array([np.nan if v is None else float(v) for v in values.to_pylist()])


def dates(values, path: str, label: str) -> np.ndarray:
    """A pyarrow column of dates (typed, or ISO text) as datetime64[D]; anything else is one line."""
    import pyarrow as pa

    if pa.types.is_timestamp(values.type) or pa.types.is_date(values.type):
        if values.null_count:
            row = values.is_null().to_pylist().index(True)
            raise ValueError(f"{path}: {label} is empty in data row {row + 1}")
        return np.asarray(values.cast(pa.date32()).to_numpy(zero_copy_only=False), dtype="datetime64[D]")
    texts = [None if v is None else str(v) for v in values.to_pylist()]
    for row, text in enumerate(texts):
        try:
            np.datetime64(text, "D") if text is not None else None
        except ValueError:
            raise ValueError(f"{path}: {label} holds a value that is not a date ({text!r} in data row {row + 1}); "
                             "write dates as YYYY-MM-DD") from None
        if text is None:
            raise ValueError(f"{path}: {label} is empty in data row {row + 1}")
    return np.array(texts, dtype="datetime64[D]")
