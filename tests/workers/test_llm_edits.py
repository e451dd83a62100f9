"""Replies to child programs: the usual variants parse, every failure has its status and reason."""
import pytest

from workers.llm.edits import DID_NOT_APPLY, INVALID_PROGRAM, UNPARSEABLE, EditError, child_from_reply

PARENT = '''import numpy as np

PARAMS = {"level": (15.0, 0.0, 80.0)}


def policy(state, params):
    """Base-stock."""
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    return np.maximum(params["level"] - position, 0)
'''

DIFF = '''<<<<<<< SEARCH
    return np.maximum(params["level"] - position, 0)
=======
    return np.minimum(np.maximum(params["level"] - position, 0), params["cap"])
>>>>>>> REPLACE
<<<<<<< SEARCH
PARAMS = {"level": (15.0, 0.0, 80.0)}
=======
PARAMS = {"level": (15.0, 0.0, 80.0), "cap": (8.0, 0.0, 20.0)}
>>>>>>> REPLACE
'''
WANT = PARENT.replace('return np.maximum(params["level"] - position, 0)',
                      'return np.minimum(np.maximum(params["level"] - position, 0), params["cap"])').replace(
    'PARAMS = {"level": (15.0, 0.0, 80.0)}', 'PARAMS = {"level": (15.0, 0.0, 80.0), "cap": (8.0, 0.0, 20.0)}')


@pytest.mark.parametrize("reply", [
    DIFF,
    "Here is my change:\n```diff\n" + DIFF + "```\nThis caps the order.",  # fenced, with prose
    DIFF.replace("<<<<<<< SEARCH", "<<<<<<<  SEARCH  ").replace(">>>>>>> REPLACE", ">>>>>>>"),  # spacing, bare end
    DIFF.replace("=======", "=====   ").replace("<<<<<<<", "<<<<"),  # fewer marker characters
    DIFF.rsplit(">>>>>>> REPLACE", 1)[0],  # the last closing marker missing
    "```\n" + DIFF.rsplit(">>>>>>> REPLACE", 1)[0] + "```\n",  # ... inside a fence that closes it
    DIFF.replace('    return np.maximum(params["level"] - position, 0)\n=======',  # search indented differently
                 'return np.maximum(params["level"] - position, 0)   \n======='),
    DIFF.replace("\n    return", "\nreturn"),  # search and replacement both lost their indentation
])
def test_diff_variants_apply(reply):
    child, kind = child_from_reply(reply, PARENT, "policy")
    assert kind == "diff" and child == WANT


@pytest.mark.parametrize("reply", [
    "```python\n" + WANT + "```",
    "Sure! The new program:\n\n```py\n" + WANT + "```\n\nIt caps each order.",
    WANT,  # bare code, no fence
    # a fence in a markdown list item: the whole block is indented (it was 'not valid Python: unexpected indent')
    "1. Cap each order:\n   ```python\n   " + WANT.replace("\n", "\n   ") + "```\n2. Keep the level.",
])
def test_full_rewrites_are_accepted(reply):
    child, kind = child_from_reply(reply, PARENT, "policy")
    assert kind == "rewrite" and child.strip() == WANT.strip()


@pytest.mark.parametrize("reply", [
    "The current program:\n```python\n" + PARENT + "```\nWith a cap:\n```python\n" + WANT + "```",
    "A first try:\n```python\n" + PARENT.replace("- position", "- 2 * position") + "```\nNo, better:\n```python\n"
    + WANT + "```\nUsage:\n```python\norder = policy(state, params)\n```",
    "```python\n" + WANT + "```\nOr, shorter:\n```python\n" + WANT[:-30],  # the last cut off at max_tokens
], ids=["current-then-new", "draft-then-answer", "answer-then-cut-off"])
def test_of_several_programs_in_a_reply_the_last_whole_one_is_the_child(reply):
    """A reply that quoted the current program (or a draft) before its own took the first block: the
    parent unchanged, 'did_not_apply', and the model's program never evaluated. A block that never
    closed (the reply was cut off) is no answer while a closed one is there."""
    child, kind = child_from_reply(reply, PARENT, "policy")
    assert kind == "rewrite" and child.strip() == WANT.strip()


DRAFT = "<<<<<<< SEARCH\n    return level\n=======\n    return 0\n>>>>>>> REPLACE"  # would not apply


@pytest.mark.parametrize("reply, want_kind", [
    ("<think>\nFirst try:\n" + DRAFT + "\nNo, that line is not there.\n</think>\n\n" + DIFF, "diff"),
    ("<think>A draft:\n```python\n" + PARENT + "```\nBetter to cap it.</think>\n```python\n" + WANT + "```", "rewrite"),
    # the chat template opened the section in the prompt: only its end is in the reply
    ("Capping the order helps with lost sales.\n```python\ndef policy(s, p):\n    pass\n```\n</think>\n" + DIFF, "diff"),
    ("<THINK>x</THINK>" + DIFF, "diff"),
])
def test_a_reasoning_models_drafts_before_its_answer_are_left_out(reply, want_kind):
    child, kind = child_from_reply(reply, PARENT, "policy")
    assert kind == want_kind and child.strip() == WANT.strip()


def test_a_reply_that_never_leaves_its_reasoning_is_unparseable_with_that_reason():
    with pytest.raises(EditError) as caught:
        child_from_reply("<think>\nThe level is too low. " + DRAFT, PARENT, "policy")
    assert caught.value.status == UNPARSEABLE
    assert caught.value.reason == "the reply ended inside its <think> section, before any answer"


@pytest.mark.parametrize("reply, status, reason", [
    ("I would raise the level a little to cut lost sales.", UNPARSEABLE, "no SEARCH/REPLACE block"),
    ("```python\nprint('hello')\n```", UNPARSEABLE, "no SEARCH/REPLACE block"),
    ("<<<<<<< SEARCH\n    return 0\n>>>>>>> REPLACE", UNPARSEABLE, "no ======= line"),
    ("<<<<<<< SEARCH\n    return level\n=======\n    return 0\n>>>>>>> REPLACE", DID_NOT_APPLY, "does not match"),
    ("<<<<<<< SEARCH\n\n=======\nx = 1\n>>>>>>> REPLACE", DID_NOT_APPLY, "is empty"),
    ("<<<<<<< SEARCH\n    position = state[\"on_hand\"] + state[\"pipeline\"].sum(axis=1)\n=======\n"
     "    position = (state[\"on_hand\"]\n>>>>>>> REPLACE", INVALID_PROGRAM, "not valid Python"),
    ("```python\nimport numpy as np\n\ndef act(obs, params):\n    return 0\n```\n```python\ndef policy(state):\n"
     "    return 0\n```", INVALID_PROGRAM, "2 positional arguments, not 1"),
    ("<<<<<<< SEARCH\n    return np.maximum(params[\"level\"] - position, 0)\n=======\n"
     "    np.maximum(params[\"level\"] - position, 0)\n>>>>>>> REPLACE", INVALID_PROGRAM, "returns nothing"),
    ("<<<<<<< SEARCH\nPARAMS = {\"level\": (15.0, 0.0, 80.0)}\n=======\nPARAMS = {\"level\": (15.0, 90.0, 80.0)}\n"
     ">>>>>>> REPLACE", INVALID_PROGRAM, "low 90.0 > high 80.0"),
    ("<<<<<<< SEARCH\ndef policy(state, params):\n=======\ndef act(state, params):\n>>>>>>> REPLACE",
     INVALID_PROGRAM, "no top-level def policy"),
    ("<<<<<<< SEARCH\n    return np.maximum(params[\"level\"] - position, 0)\n=======\n"
     "    return np.maximum(params[\"level\"] - position, params[\"floor\"])\n>>>>>>> REPLACE",
     INVALID_PROGRAM, "reads params['floor'] but PARAMS does not declare them"),
    ("```python\n" + PARENT + "\ndef test():\n    policy(None, None)\n\ntest()\n```", INVALID_PROGRAM,
     "a call at the top level (line 14)"),
    ("<<<<<<< SEARCH\n    \"\"\"Base-stock.\"\"\"\n=======\n    # base stock\n>>>>>>> REPLACE", DID_NOT_APPLY,
     "unchanged"),
    # terminal control sequences in a comment or a string: `atoll best` would show other lines than those stored
    (DIFF.replace(', params["cap"])\n>>>>>>> REPLACE', ', params["cap"])  # \x1b[1A\x1b[2K\n>>>>>>> REPLACE', 1),
     INVALID_PROGRAM, "a control character (\\x1b) on line 9"),
    ("```python\n" + WANT.replace('"""Base-stock."""', '"""Base-stock.\x9b2J"""') + "```", INVALID_PROGRAM,
     "a control character (\\x9b) on line 7"),
    # deep enough for the parser, too deep for the recursive walks after it (a RecursionError escaped the worker)
    pytest.param("<<<<<<< SEARCH\n    return np.maximum(params[\"level\"] - position, 0)\n=======\n    return "
                 + "-" * 2000 + "position\n>>>>>>> REPLACE", INVALID_PROGRAM, "nested too deeply to check",
                 id="nested-too-deeply"),
])
def test_bad_replies_end_with_their_status_and_reason(reply, status, reason):
    with pytest.raises(EditError) as caught:
        child_from_reply(reply, PARENT, "policy")
    assert caught.value.status == status and reason in caught.value.reason


def test_a_reply_with_crlf_line_ends_gives_the_same_child():
    """A server that ends its lines with CR LF (or CR) gives the child those lines would make, with no CR
    left in it: a CR would be refused as a control character, and a lone one can hide text on a terminal."""
    for reply in (DIFF, "```python\n" + WANT + "```"):
        for end in ("\r\n", "\r"):
            child, _ = child_from_reply(reply.replace("\n", end), PARENT, "policy")
            assert child.strip() == WANT.strip(), (end, child)


def test_the_checked_childs_normal_form_is_the_one_the_driver_would_compute():
    from controller.dedup import Dedup, form_hash
    from workers.llm.edits import check_child
    from workers.normal_form import normal_form

    form = check_child(WANT, PARENT, "policy")
    assert form == normal_form(WANT) and form != normal_form(PARENT)
    assert check_child(WANT, PARENT, "policy") == form  # the parent's part is cached: the same answer
    other = PARENT.replace("def policy(state, params)", "def act(state, params)")  # same text, other entry point
    with pytest.raises(EditError, match="no top-level def act"):
        check_child(WANT, other, "act")
    dedup = Dedup()
    assert dedup.check(WANT, form) is None and dedup.add(WANT) == form_hash(WANT)
    layout = WANT.replace("import numpy as np\n", "import numpy as np\n\n# a comment\n")
    assert dedup.check(layout) == "normal_form"  # computed by the driver: the same key as the worker's


def test_a_degenerate_reply_of_blank_lines_is_read_in_linear_time():
    """A small model that runs on in newlines and spaces until max_tokens: the markers' `^\\s*` tried
    every run of blank lines from each of its starts, over a minute for these three replies of 64,000
    characters (quadratic: far longer for a longer reply), holding the GIL from the worker's other calls."""
    import time

    blank = " \n" * 32000
    start = time.monotonic()
    for reply in (blank, "<<<<<<< SEARCH\n" + blank):
        with pytest.raises(EditError, match="no SEARCH/REPLACE block|no ======= line"):
            child_from_reply(reply, PARENT, "policy")
    assert child_from_reply(DIFF.replace("=======", blank + "======="), PARENT, "policy")[0] == WANT
    assert time.monotonic() - start < 2.0  # linear: milliseconds
    child, _ = child_from_reply(DIFF.replace("<<<<<<< SEARCH\n", "<<<<<<< SEARCH\n\n  \n"), PARENT, "policy")
    assert child == WANT  # blank lines after a marker are still left out of the search text


def test_a_new_default_alone_applies_only_where_the_domain_runs_the_defaults_as_written():
    from workers.llm.edits import check_child

    child = PARENT.replace("(15.0, 0.0, 80.0)", "(20.0, 0.0, 80.0)")
    with pytest.raises(EditError) as caught:  # tuning sets the default: the same program
        check_child(child, PARENT, "policy")
    assert caught.value.status == DID_NOT_APPLY and "tuning resets" in caught.value.reason
    assert check_child(child, PARENT, "policy", tuned=False)  # MILP's tune_trials = 0: another program
