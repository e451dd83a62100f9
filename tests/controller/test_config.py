"""Bad configuration stops with one line naming the key; good configs load."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from controller.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
BASE = '[run]\nmax_evals = 10\n\n[domain]\nname = "inventory"\n'


def write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_shipped_config_loads():
    config, text = load_config("configs/inventory.toml")
    assert config.domain.name == "inventory" and "max_evals" in text


@pytest.mark.parametrize("text, needle", [
    (BASE + "[islands]\ncuont = 3\n", "islands.cuont: unknown key (did you mean count?)"),
    (BASE.replace("10", '"ten"'), "run.max_evals"),
    (BASE.replace("10", "0"), "run.max_evals: Input should be greater than or equal to 1"),
    (BASE + "[evaluator.sandbox]\nwall_s = -1\n", "evaluator.sandbox.wall_s"),
    (BASE.replace('"inventory"', '"nope"'), "unknown domain 'nope'"),
    (BASE + "[domain.options]\nbogus = 1\n", "domain.options.bogus: unknown key; its section knows "),
    (BASE + "[domain.options]\ntune_trails = 1\n", "domain.options.tune_trails: unknown key (did you mean tune_trials?)"),
    (BASE.replace("max_evals", "max_evls"), "run.max_evls: unknown key (did you mean max_evals?)"),
    (BASE + "[run.extra]\nx = 1\n", "run.extra: unknown key; its section knows name, seed, "),
    ("[run\n", "not valid TOML"),
    # at 0 an operator whose first child did not improve weighed 0 for good: a run stalled at 5 evaluations
    (BASE + "[mutator.embedded]\nsuccess_prior = 0\n", "mutator.embedded.success_prior: Input should be greater than 0"),
])
def test_bad_config_names_the_key(tmp_path, text, needle):
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert needle in str(caught.value)
    assert "\n" not in str(caught.value)


def test_overrides_are_typed_and_validated(tmp_path):
    config, _ = load_config(write(tmp_path, BASE), ["run.seed=7", "islands.count=2"])
    assert config.run.seed == 7 and config.islands.count == 2
    with pytest.raises(ConfigError, match="islands.count"):
        load_config(write(tmp_path, BASE), ["islands.count=many"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(write(tmp_path, BASE), ["islands.count"])


def test_true_or_false_given_for_a_number_is_refused_where_pydantic_took_it_as_1_or_0(tmp_path):
    """`wall_s = true` made every sandbox limit 1 s (the seed then failed on a timeout, with no word of
    the typo), `run.max_evals=true` a budget of 1; a true given where a flag is expected stands."""
    api = str(Path(__file__).resolve().parents[2] / "configs" / "inventory_api.toml")
    wall = tmp_path / "wall.toml"
    wall.write_text(BASE + "[evaluator.sandbox]\nwall_s = true\n")
    for path, override, needle in [
            (wall, None, "evaluator.sandbox.wall_s: true"),
            (write(tmp_path, BASE), "run.max_evals=true", "run.max_evals: true"),
            (write(tmp_path, BASE), "domain.options.heldout_tune_trials=true", "domain.options.heldout_tune_trials: true"),
            (api, "mutator.llm.models.hosted.temperature=true", "mutator.llm.models[0].temperature: true")]:
        with pytest.raises(ConfigError, match=re.escape(needle + " given where a number is expected")):
            load_config(path, [override] if override else [])
    config, _ = load_config(api, ["mutator.llm.models.hosted.diagnose=true"])
    assert config.mutator.llm.models[0].diagnose is True


def test_an_override_reaches_one_model_by_its_name_or_place():
    """A shipped LLM config pointed at one's own server without editing it."""
    api = str(Path(__file__).resolve().parents[2] / "configs" / "inventory_api.toml")
    config, _ = load_config(api, ["mutator.llm.models.hosted.base_url=http://127.0.0.1:8000/v1",
                                  "mutator.llm.models.0.max_in_flight=2"])
    (model,) = config.mutator.llm.models
    assert model.base_url == "http://127.0.0.1:8000/v1" and model.max_in_flight == 2
    for item, needle in [("mutator.llm.models.other.base_url=x",
                          "mutator.llm.models has no entry 'other' (its names: hosted; or a place from 0 to 0)"),
                         ("mutator.llm.models.1.base_url=x", "has no entry '1'"),
                         ("mutator.llm.models.base_url=x",
                          "models is a list of tables; name one of them: mutator.llm.models.NAME.base_url")]:
        with pytest.raises(ConfigError, match=re.escape(needle)):
            load_config(api, [item])


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml")


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_every_shipped_config_loads_with_its_domain_options(path):
    config, _ = load_config(path)  # validates the domain's options too
    assert config.run.max_wall_s and config.run.max_wall_s <= 900  # each main job fits in 15 minutes


def test_an_unknown_key_in_one_model_of_a_list_names_that_model_s_keys():
    """The list of models is a union tagged by backend: the keys offered are the entry's own backend's."""
    local = str(Path(__file__).resolve().parents[2] / "configs" / "inventory_llm.toml")
    with pytest.raises(ConfigError) as caught:
        load_config(local, ["mutator.llm.models.0.treads=2"])
    assert "mutator.llm.models.0.local.treads: unknown key (did you mean threads?)" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_config(local, ["mutator.llm.models.0.base_url=http://127.0.0.1:1/v1"])
    assert "unknown key; its section knows name, " in str(caught.value) and "gguf" in str(caught.value)


@pytest.mark.parametrize("content, needle", [
    ("[run]\nname = 'café'\n".encode("utf-16"),  # as Windows editors save "Unicode"
     "c.toml is not UTF-8 text (byte 0: invalid start byte); TOML files are UTF-8: save it as UTF-8"),
    ("# café\n".encode("latin-1") + BASE.encode(), "c.toml is not UTF-8 text (byte 5: invalid continuation byte)"),
    (None, "config file c.toml is not a file; give a TOML file"),
], ids=["utf-16", "latin-1", "a folder"])
def test_a_config_file_that_cannot_be_read_as_text_is_one_line_and_exit_2(tmp_path, content, needle):
    """A file in another encoding, or a folder, given as the config: one line, no traceback."""
    if content is None:
        (tmp_path / "c.toml").mkdir()
    else:
        (tmp_path / "c.toml").write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "controller", "check", "c.toml"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr


def test_a_config_saved_with_a_byte_order_mark_loads(tmp_path):
    path = tmp_path / "c.toml"
    path.write_bytes(b"\xef\xbb\xbf" + BASE.encode())
    config, text = load_config(path)
    assert config.run.max_evals == 10 and text.startswith("[run]")
