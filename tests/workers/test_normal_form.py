"""The normal form: the duplicate check's key, computed on programs nobody checked yet."""
from controller.dedup import Dedup
from workers.normal_form import normal_form

PROGRAM = "def policy(state, params):\n    return {}state['on_hand']\n"


def test_a_program_nested_deeper_than_the_walk_reaches_has_no_form_and_the_duplicate_check_goes_on():
    deep = PROGRAM.format("-" * 600)  # parses, but its normalising walk passes Python's recursion limit
    assert normal_form(deep) is None
    assert normal_form(PROGRAM.format("-" * 5)) == normal_form(PROGRAM.format("-" * 5) + "\n# a comment\n")
    dedup = Dedup()
    assert dedup.check(deep) is None  # new: checked by its exact text alone
    dedup.add(deep)
    assert dedup.check(deep) is not None  # the same text again is a duplicate


TUNED = 'PARAMS = {{"a": ({}, 0.0, 2.0)}}\n\ndef policy(state, params):\n    return {}\n'


def test_only_defaults_that_tuning_sets_are_left_out_of_the_form():
    assert normal_form(TUNED.format(1.0, 'params["a"]')) == normal_form(TUNED.format(1.5, 'params["a"]'))
    # read by name, the written default runs whatever tuning tries: two defaults, two programs
    assert normal_form(TUNED.format(1.0, 'PARAMS["a"][0]')) != normal_form(TUNED.format(1.5, 'PARAMS["a"][0]'))
    local = 'def policy(state, params):\n    PARAMS = {{"a": ({}, 0.0, 2.0)}}\n    return state["x"] * PARAMS["a"][0]\n'
    assert normal_form(local.format(1.0)) != normal_form(local.format(1.5))  # a local dict, never tuned
