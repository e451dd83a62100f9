"""PARAMS parsing and rewriting, on program text only."""
import pytest

from evaluators.params import (ParamSpec, ProgramFormatError, add_param, entry_point_ok,
                               read_params, unique_param_name, write_params)

PROGRAM = '''import numpy as np

# the order-up-to level
PARAMS = {"S": (12.0, 0.0, 60.0), "k": (1, 0, 2)}

def policy(state, params):
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    return np.maximum(params["S"] - position, 0.0)
'''


def test_read_params_gives_specs_in_order():
    specs = read_params(PROGRAM)
    assert list(specs) == ["S", "k"]
    assert specs["S"] == ParamSpec("S", 12.0, 0.0, 60.0)
    assert read_params("def policy(state, params):\n    return 1\n") == {}


def test_write_params_round_trips_and_keeps_the_rest():
    child = write_params(PROGRAM, {"S": 30.5})
    assert read_params(child)["S"] == ParamSpec("S", 30.5, 0.0, 60.0)
    assert read_params(child)["k"] == read_params(PROGRAM)["k"]
    assert "# the order-up-to level" in child
    assert child.split("PARAMS")[0] == PROGRAM.split("PARAMS")[0]
    assert child.split("\ndef ")[1] == PROGRAM.split("\ndef ")[1]


def test_write_params_clips_and_rounds():
    assert read_params(write_params(PROGRAM, {"S": 99.0}))["S"].default == 60.0
    assert read_params(write_params(PROGRAM, {"S": -5.0}))["S"].default == 0.0
    assert read_params(write_params(PROGRAM, {"S": 12.3456789}))["S"].default == 12.3457


def test_write_params_rejects_unknown_names():
    with pytest.raises(KeyError, match="nope"):
        write_params(PROGRAM, {"nope": 1.0})


def test_default_outside_range_is_clipped_on_read():
    code = 'PARAMS = {"a": (5.0, 0.0, 1.0)}\n'
    assert read_params(code)["a"].default == 1.0


@pytest.mark.parametrize("bad", [
    "PARAMS = dict(a=(1, 0, 2))",
    'PARAMS = {"a": (1, 2, 0)}',
    'PARAMS = {"a": ("x", 0, 2)}',
    'PARAMS = {"a": (1, 0)}',
    'PARAMS = {"a": (1, 0, x)}',
    'PARAMS = {"a": (True, 0, 2)}',
    "PARAMS = {1: (1, 0, 2)}",
    "def broken(:",
])
def test_malformed_params_raise(bad):
    with pytest.raises(ProgramFormatError):
        read_params(bad)


def test_add_param_extends_or_creates_params():
    grown = add_param(PROGRAM, "cap", 20.0, 0.0, 80.0)
    assert read_params(grown)["cap"] == ParamSpec("cap", 20.0, 0.0, 80.0)
    assert list(read_params(grown)) == ["S", "k", "cap"]
    bare = "import numpy as np\n\ndef policy(state, params):\n    return state['x']\n"
    created = add_param(bare, "a", 3.0, 0.0, 1.0)
    assert read_params(created) == {"a": ParamSpec("a", 1.0, 0.0, 1.0)}
    assert entry_point_ok(created, "policy")
    assert created.index("import numpy") < created.index("PARAMS") < created.index("def policy")


def test_add_param_refuses_duplicates_and_bad_ranges():
    with pytest.raises(ValueError):
        add_param(PROGRAM, "S", 1.0, 0.0, 2.0)
    with pytest.raises(ProgramFormatError):
        add_param(PROGRAM, "z", 1.0, 3.0, 2.0)


def test_unique_param_name_avoids_existing():
    assert unique_param_name(PROGRAM, "cap") == "cap"
    assert unique_param_name(PROGRAM, "S") == "S_2"
    assert unique_param_name(add_param(PROGRAM, "S_2", 1, 0, 2), "S") == "S_3"


def test_entry_point_ok():
    assert entry_point_ok(PROGRAM, "policy")
    assert not entry_point_ok(PROGRAM, "act")
    assert not entry_point_ok("def policy(:\n", "policy")
    assert not entry_point_ok("class A:\n    def policy(self):\n        pass\n", "policy")
