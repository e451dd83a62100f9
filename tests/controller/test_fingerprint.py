"""The library's key for a domain and its options: a user's data counts by its content, not its path;
keys without a data option are those existing libraries hold; a library that keyed runs by their
data's path finds them again for a warm start on the same data, moved. Real files, a real DuckDB library."""
import hashlib
import json
import shutil

from controller.config import load_config
from controller.fingerprint import fingerprint
from controller.warm_start import plan_warm_start
from store import library_records as records
from store.library import Library
from tests.userdata_files import INVENTORY, write_demand


def test_a_fingerprint_without_a_data_option_is_the_one_libraries_already_hold():
    """Values the code before content fingerprints gave: libraries hold them, so they never change."""
    assert {name: fingerprint(name, {}) for name in ("inventory", "trading", "milp", "control")} == {
        "inventory": "f0ed6b391298", "trading": "37bb70712dca", "milp": "7d7ad5a5f914", "control": "fe1c4fa589d4"}
    tiny_then = {"search_periods": 300, "heldout_periods": 300, "warmup": 50, "search_trajectories": 2,
                 "heldout_trajectories": 2, "tune_trials": 8, "tune_batch": 4, "heldout_tune_trials": 8}
    assert fingerprint("inventory", tiny_then) == "c5150cf28e68"
    # an option of the held-out measurement alone (added later) changes no key
    assert fingerprint("inventory", {"heldout_tune_trials": 256}) == "f0ed6b391298"


def test_the_same_data_at_two_paths_is_one_fingerprint_and_other_data_or_settings_another(tmp_path):
    first = write_demand(tmp_path / "demand.csv")
    (tmp_path / "moved").mkdir()
    moved = shutil.copy(first, tmp_path / "moved" / "history.csv")
    other = write_demand(tmp_path / "other.csv", seed=4)

    def key(path, **settings):
        return fingerprint("inventory", {"demand_history": {"path": str(path), **settings}})
    assert key(first) == key(moved) == key(moved, block=7)  # 7: the default
    assert len({key(first), key(other), key(first, block=5), fingerprint("inventory", {})}) == 4


def _path_keyed(domain) -> str:
    """The fingerprint as Atoll computed it before content fingerprints (the data's path counted)."""
    from evaluators.registry import get_domain_class

    cls = get_domain_class(domain)
    dumped = cls.config_model.model_validate(domain.options).model_dump(mode="json")
    for added in ("heldout_tune_trials", "validation_periods"):  # options added since, which that code did not have
        dumped.pop(added)
    return hashlib.sha256(json.dumps([cls.name, dumped, ""], sort_keys=True).encode()).hexdigest()[:12]


def _catalogue(con, run_id, config, key, code):
    records.upsert_run(con, {"run_id": run_id, "run_dir": f"/runs/{run_id}", "domain": "inventory",
                             "fingerprint": key, "config": config.model_dump(mode="json"), "status": "completed"})
    records.replace_elites(con, run_id, [{"program_id": f"{run_id}-best", "domain": "inventory", "fingerprint": key,
                                          "search_score": -1.0, "code": code, "code_hash": run_id}])
    records.add_skills(con, [{"skill_id": f"sk-{run_id}", "domain": "inventory", "fingerprint": key,
                              "title": "t", "applies_when": "any", "edit": {}, "search_gain": 0.1,
                              "validation_gain": 0.1, "parent_code": "p", "child_code": "c", "run_id": run_id,
                              "parent_id": "p", "child_id": "c"}])


def test_a_warm_start_on_moved_data_finds_the_runs_an_older_library_keyed_by_its_old_path(tmp_path,
                                                                                         temporary_library):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_demand(old / "demand.csv")
    (old / "inventory.toml").write_text(INVENTORY)
    before, _ = load_config(old / "inventory.toml")
    other, _ = load_config(old / "inventory.toml", ["domain.options.demand_history.block=5"])
    old_keys = {"before": _path_keyed(before.domain), "other": _path_keyed(other.domain)}
    library = Library(temporary_library)
    library.transaction(lambda con: [_catalogue(con, run_id, config, old_keys[run_id], f"x = {i}")
                                     for i, (run_id, config) in enumerate([("before", before), ("other", other)])])
    shutil.move(old, new)  # the data moved, then Atoll was upgraded: the stored config's path holds nothing now

    config, _ = load_config(new / "inventory.toml", ["memory.warm_start=true"])
    key = fingerprint(config.domain)
    plan = library.transaction(lambda con: plan_warm_start(con, config, key))
    assert [e["program_id"] for e in plan["elites"]] == ["before-best"]  # not the run with other settings
    keys = library.transaction(lambda con: con.execute(
        "SELECT 'runs', run_id, fingerprint FROM runs UNION ALL SELECT 'elites', run_id, fingerprint FROM elites "
        "UNION ALL SELECT 'skills', run_id, fingerprint FROM skills ORDER BY ALL").fetchall())
    assert keys == sorted((table, run_id, key if run_id == "before" else old_keys[run_id])
                          for table in ("runs", "elites", "skills") for run_id in ("before", "other"))
