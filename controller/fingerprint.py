"""The library's key for a domain and its options: what a run is scored on, not where it reads it from.

Runs with one fingerprint share elites (a warm start takes the library's best of its fingerprint),
and a resume refuses to change it (controller.resume_config). A data option of the user's
(evaluators.userdata) counts by its content's SHA-256 and its own settings, never by its path, so
a run on a moved or copied file warm-starts from the runs on the original.

Libraries written before hold runs on a user's data keyed by the path too. `rekey_path_keyed`
gives those the content key when a warm start looks for elites: their old key is a hash of the same
options with their own paths, which this run's options give again without reading those paths. (A
schema migration could not: the data models read the files when they validate a stored config,
and the files there may be gone.)
"""
from __future__ import annotations

import hashlib
import json

from store import library_records as records


def fingerprint(domain, options: dict | None = None) -> str:
    """A short hash of the domain (a registered name, or the run's `[domain]` branch; a file
    domain's text counts) and its validated options, defaults filled in; a data option counts by
    its content's sha256 and its settings, not by its path."""
    name, dumped, data, source = _validated(domain, options)
    return _hashed(name, _with_paths(dumped, data, None), source)


def rekey_path_keyed(con, domain, key: str) -> list[str]:
    """Give `key`, the fingerprint of a loaded config's `[domain]` branch, to the library's runs (their
    catalog rows, elites and the skills they learned first) keyed, before content fingerprints, by the
    paths of this data with these options; returns their ids. The options are validated again (the
    data read) only when some run of the domain holds this data under another key."""
    from evaluators.registry import get_domain_class

    digests = [v["sha256"] for v in domain.options.values() if isinstance(v, dict) and v.get("sha256")]
    runs = records.runs_holding(con, get_domain_class(domain).name, digests[0], key) if digests else []
    if not runs:
        return []
    name, dumped, data, source = _validated(domain)
    rekeyed = []
    for run in runs:
        options = (run["config"].get("domain") or {}).get("options") or {}
        paths = {k: options[k].get("path") if isinstance(options.get(k), dict) else None for k in data}
        if _hashed(name, _with_paths(dumped, data, paths), source) == run["fingerprint"]:
            records.rekey_run(con, run["run_id"], key)
            rekeyed.append(run["run_id"])
    return rekeyed


def _validated(domain, options: dict | None = None) -> tuple[str, dict, list[str], str]:
    """(the domain's name, its options validated and dumped as JSON, the data options given, its file's text)."""
    from evaluators.registry import get_domain_class
    from evaluators.userdata import data_options

    cls = get_domain_class(domain)
    options = getattr(domain, "options", {}) if options is None else options
    dumped = cls.config_model.model_validate(options).model_dump(mode="json")
    dumped = {key: value for key, value in dumped.items() if not _held_out_only(cls.config_model, key)}
    data = [key for key in data_options(cls.config_model) if isinstance(dumped.get(key), dict)]
    return cls.name, dumped, data, getattr(domain, "source", None) or ""


def _held_out_only(model, name: str) -> bool:
    """An option marked `json_schema_extra={"fingerprint": False}` shapes no search score (only the
    held-out measurement, or the validation split's horizon): runs that differ in it share elites, and
    keys stay as they were before it existed."""
    field = model.model_fields.get(name)
    extra = field.json_schema_extra if field is not None else None
    return isinstance(extra, dict) and extra.get("fingerprint") is False


def _with_paths(dumped: dict, data: list[str], paths: dict | None) -> dict:
    """`dumped` with each data option's path left out (`paths` None), or set to `paths[option]`."""
    def one(value: dict, key: str) -> dict:
        rest = {k: v for k, v in value.items() if k != "path"}
        return rest if paths is None else dict(rest, path=paths[key])
    return {**dumped, **{key: one(dumped[key], key) for key in data}}


def _hashed(name: str, dumped: dict, source: str) -> str:
    text = json.dumps([name, dumped, hashlib.sha256(source.encode()).hexdigest() if source else ""],
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
