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
