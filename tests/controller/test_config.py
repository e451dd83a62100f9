"""Bad configuration stops with one line naming the key; good configs load."""
from pathlib import Path

import pytest

from controller.config import ConfigError, load_config

BASE = '[run]\nmax_evals = 10\n\n[domain]\nname = "inventory"\n'


def write(tmp_path, text):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_shipped_config_loads():
    config, text = load_config("configs/inventory.toml")
    assert config.domain.name == "inventory" and "max_evals" in text


@pytest.mark.parametrize("text, needle", [
    (BASE + "[islands]\ncuont = 3\n", "islands.cuont: unknown key"),
    (BASE.replace("10", '"ten"'), "run.max_evals"),
    (BASE.replace("10", "0"), "run.max_evals: Input should be greater than or equal to 1"),
    (BASE + "[evaluator.sandbox]\nwall_s = -1\n", "evaluator.sandbox.wall_s"),
    (BASE.replace('"inventory"', '"nope"'), "unknown domain 'nope'"),
    (BASE + "[domain.options]\nbogus = 1\n", "domain.options.bogus: unknown key"),
    ("[run\n", "not valid TOML"),
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


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml")


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_every_shipped_config_loads_with_its_domain_options(path):
    config, _ = load_config(path)  # validates the domain's options too
    assert config.run.max_wall_s and config.run.max_wall_s <= 900  # each main job fits in 15 minutes
