"""Prompts render from the template files to pinned text; held-out results cannot enter them."""
import pytest

from workers.llm.feedback import from_result
from workers.llm.prompts import PromptInput, diagnosis_prompt, edit_prompt, part_id
from workers.normal_form import normal_form

CODE = 'import numpy as np\n\nPARAMS = {"level": (12.5, 0.0, 80.0)}\n\n\ndef policy(state, params):\n    return params["level"]\n'
RESULT = {"split": "search", "status": "OK", "score": -0.975, "error": None,
          "metrics": {"mean_cost": 5.25, "note": "x", "trajectory_costs": [1.0, 2.0],
                      "instances": {"A": {"cost": 4.0, "fill_rate": 0.9, "trajectory_costs": [1.0]},
                                    "B": {"cost": 6.5, "fill_rate": 0.8}}},
          "instance_scores": [-0.95, -1.0]}

PINNED_USER = '''
## Current program
```python
import numpy as np

PARAMS = {"level": (12.5, 0.0, 80.0)}


def policy(state, params):
    return params["level"]
```
Search score: -0.975 (status OK)
Tuned PARAMS: level = 12.5 in [0, 80]
Metrics: mean_cost 5.25; note x
Per-instance scores: A -0.95; B -1
Worst instances:
- B: score -1 (cost 6.5, fill_rate 0.8)

## Other programs on this island
Score -0.99:
```python
def policy(state, params):
    return 1
```

## Recent failed attempts on this program (avoid these)
- INVALID: unparseable: no code block

## Task
Change the program to raise its score. Answer with the whole new program in one ```python block.
'''


def _input(**changes):
    values = dict(domain="toy", description="A toy task.", contract="Define policy(state, params).",
                  entry_point="policy", parent_code=CODE, feedback=from_result(RESULT, CODE, worst=1),
                  inspirations=(("def policy(state, params):\n    return 1\n", -0.99),),
                  failures=(("INVALID", "unparseable: no code block"),), edit_format="rewrite")
    return PromptInput(**{**values, **changes})


def test_edit_prompt_renders_the_pinned_text():
    prompt = edit_prompt(_input())
    system, user = prompt.messages
    assert system["content"].startswith('You improve a Python policy program for the "toy" domain')
    assert "Domain: A toy task.\n\nContract: Define policy(state, params).\n" in system["content"]
    assert user["content"] == PINNED_USER
    assert [name for name, _ in prompt.parts] == ["system", "parent", "inspirations", "failures", "task"]


def test_shared_parts_have_the_same_id_across_calls_on_one_parent():
    one, two = edit_prompt(_input()), edit_prompt(_input(failures=()))
    ids = lambda p: {name: part_id(text) for name, text in p.parts}  # noqa: E731
    assert ids(one)["system"] == ids(two)["system"] and ids(one)["parent"] == ids(two)["parent"]
    assert "failures" not in ids(two)


def test_diagnosis_prompt_and_diff_format():
    diag = diagnosis_prompt(_input())
    assert "Do not write code" in diag.messages[1]["content"]
    edit = edit_prompt(_input(edit_format="diff"), diagnosis="Orders too much on B.")
    text = edit.messages[1]["content"]
    assert "## Diagnosis of the current program\nOrders too much on B." in text and "<<<<<<< SEARCH" in text


def test_held_out_results_are_refused():
    with pytest.raises(ValueError, match="search-split results only"):
        from_result(dict(RESULT, split="heldout"), CODE)


def test_normal_form_ignores_layout_comments_docstrings_and_params_defaults():
    other = ('import numpy as np\nPARAMS = {"level": (40.0, 0.0, 80.0)}  # tuned\n'
             'def policy(state, params):\n    """Doc."""\n    return params["level"]\n')
    assert normal_form(other) == normal_form(CODE)
    assert normal_form(other.replace("0.0, 80.0", "0.0, 90.0")) != normal_form(CODE)  # ranges matter
    assert normal_form(other.replace('return params["level"]', 'return params["level"] + 1')) != normal_form(CODE)
    assert normal_form("def (") is None


def test_library_skills_and_a_prompt_variant_reach_the_edit_prompt():
    skills = "Skill 1: wrap the returned value as np.minimum(…, cap)\n  applies to: any policy that returns a value"
    prompt = edit_prompt(_input(skills=skills, instruction="Make one small change to the ordering rule."))
    text = prompt.messages[1]["content"]
    assert [name for name, _ in prompt.parts] == ["system", "parent", "inspirations", "failures", "skills", "task"]
    assert "## Edits that helped on this domain before" in text and skills in text
    assert "## Task\nMake one small change to the ordering rule. Answer with the whole new program" in text
    assert "Change the program to raise its score." not in text
    assert "Edits that helped" not in diagnosis_prompt(_input(skills=skills)).messages[1]["content"]


LONG_TRACEBACK = ("the policy raised:\nTraceback (most recent call last):\n"
                  + "".join(f'  File "<candidate>", line {i}, in step{i}\n    return step{i + 1}(x)\n'
                            for i in range(40))
                  + "IndexError: index 284 is out of bounds for axis 1 with size 260\n")


def test_a_long_failure_keeps_how_it_failed_and_the_error_itself():
    """A traceback longer than a prompt holds keeps its first line and its end (the error),
    in the parent's feedback and in the list of recent failures, not its first frames."""
    failed = {"split": "search", "status": "FAILED", "score": None, "error": LONG_TRACEBACK}
    prompt = edit_prompt(_input(feedback=from_result(failed, CODE),
                                failures=(("FAILED", LONG_TRACEBACK), ("INVALID", "unparseable: no code block"))))
    parts = dict(prompt.parts)
    for part in (parts["parent"], parts["failures"]):
        assert "the policy raised:\n[" in part and "characters cut]\n" in part
        assert "IndexError: index 284 is out of bounds for axis 1 with size 260" in part
        assert "step0(x)" not in part and "step39(x)" in part
    assert "- INVALID: unparseable: no code block" in parts["failures"]
    assert len(parts["failures"]) < 1000 and len(LONG_TRACEBACK) > 2000


def test_a_program_with_many_params_keeps_its_prompt_within_the_code_limit():
    """The tuned PARAMS line lists the first few: the code, cut at max_code_chars, holds them all,
    so a program of a thousand PARAMS does not make a prompt five times that limit."""
    entries = "".join(f'    "w{i}": (0.125, -1.0, 1.0),\n' for i in range(1000))
    code = f"PARAMS = {{\n{entries}}}\n\n\ndef policy(state, params):\n    return params['w0']\n"
    part = dict(edit_prompt(_input(parent_code=code, feedback=from_result(RESULT, code))).parts)["parent"]
    assert len(code) > 30000 and len(part) < 8000
    assert "w23 = 0.125 in [-1, 1]; and 976 more (in the code)" in part and "w24 =" not in part


def test_the_drivers_duplicate_check_hashes_are_not_shown_as_metrics():
    """The driver adds the program's hashes to its stored metrics (`form_hash`, `proposed_hash`): they
    mean nothing to a model and are not the domain's figures, so a prompt lists the domain's own."""
    own = {f"m{i}": float(i) for i in range(12)}
    stored = dict(RESULT, metrics={"proposed_hash": "6eaa4b959fade921", **own, "form_hash": "9b77b298eb420e4c"})
    part = dict(edit_prompt(_input(feedback=from_result(stored, CODE))).parts)["parent"]
    assert "Metrics: m0 0; m1 1;" in part and "m11 11\n" in part
    assert "_hash" not in part and "6eaa4b959fade921" not in part
