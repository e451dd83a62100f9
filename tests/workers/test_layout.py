"""A child of the embedded mutator keeps its parent's text (comments, blank lines, quotes) wherever
the two agree, and is exactly the child's program (its syntax tree) everywhere."""
import ast

import numpy as np
import pytest

from store.records import MutationRequest
from workers.ast_ops import OPERATORS, OpContext
from workers.config import EmbeddedMutatorConfig
from workers.embedded import EmbeddedMutator
from workers.layout import keep_layout

PARENT = '''import numpy as np

# how much to keep on hand: the search tunes it
PARAMS = {"level": (17.0, 0.0, 80.0)}


def policy(state, params):
    """Base-stock on the inventory position."""
    # what is here plus what is on its way
    position = state["on_hand"] + state["pipeline"].sum(axis=1)
    if position.mean() > 3:  # plenty
        # order less
        order = params["level"] - position
    else:
        order = params["level"]  # nothing here
    for _ in range(2):  # twice, to be sure
        order = order * 1.0
    return np.maximum(order, 0)  # never negative
'''


def _tree(code: str) -> str:
    return ast.dump(ast.parse(code))


def test_only_the_changed_statements_take_the_childs_text():
    tree = ast.parse(PARENT)
    fn = tree.body[2]
    fn.body[2].body[0].value.left = ast.Constant(1.5)  # inside the if's body
    fn.body[-1].value.args[1] = ast.Constant(2)  # the return
    child = ast.unparse(tree)
    kept = keep_layout(PARENT, child)
    assert _tree(kept) == _tree(child)
    want = (PARENT.replace('        order = params["level"] - position\n', "        order = 1.5 - position\n")
            .replace("    return np.maximum(order, 0)  # never negative\n", "    return np.maximum(order, 2)\n"))
    assert kept == want, kept
    # a PARAMS the child writes in its own layout keeps that layout; the comment above it stays
    child = child.replace("PARAMS = {'level': (17.0, 0.0, 80.0)}",
                          'PARAMS = {\n    "level": (17.0, 0.0, 80.0),\n    "cap": (9.0, 0.0, 40.0),\n}')
    kept = keep_layout(PARENT, child)
    assert _tree(kept) == _tree(child)
    assert '# how much to keep on hand: the search tunes it\nPARAMS = {\n    "level"' in kept, kept


def test_a_body_and_its_else_both_changed_take_the_childs_text_and_the_rest_stays():
    tree = ast.parse(PARENT)
    branch = tree.body[2].body[2]
    branch.body[0].value.left = ast.Constant(1.5)
    branch.orelse[0].value = ast.Constant(0.0)
    child = ast.unparse(tree)
    kept = keep_layout(PARENT, child)
    assert _tree(kept) == _tree(child)
    assert "# plenty" not in kept and "# twice, to be sure" in kept and "# never negative" in kept, kept


@pytest.mark.parametrize("parent, child", [
    ("a = 1; b = 2\n", "a = 1\nb = 3\n"),  # two statements on one line: cannot be cut between them
    ("x = (1 +\n", "x = 2\n"),  # a parent that does not parse
])
def test_what_cannot_be_kept_is_the_child_itself(parent, child):
    assert keep_layout(parent, child) == child


def _shipped_programs():
    """Every seed and baseline program of the shipped domains, with its entry point."""
    import importlib

    for domain in ("control", "inventory", "milp", "trading"):
        module = importlib.import_module(f"evaluators.domains.{domain}.programs")
        texts = [v for v in vars(module).values() if isinstance(v, str)]
        texts += [v for d in vars(module).values() if isinstance(d, dict) for v in d.values() if isinstance(v, str)]
        for text in texts:
            for entry in ("policy", "act"):
                if f"def {entry}(" in text and "{" + "rate!r}" not in text:
                    yield f"{domain}:{text[:40]!r}", text, entry


def test_every_operator_on_every_shipped_program_keeps_the_childs_program():
    """Real children, as the mutator's operators make them from the shipped domains' seeds and
    baselines: each kept text is the child's program, and keeps at least as many of the parent's
    lines as the unparsed child does."""
    checked = 0
    for name, seed, entry in _shipped_programs():
        ctx = OpContext(entry, np.random.default_rng(0), inspirations=(seed,))
        for op_name, op in OPERATORS.items():
            for _ in range(5):
                try:
                    child = op(seed, ctx)
                except (ValueError, LookupError, SyntaxError):
                    continue
                if child is None:
                    continue
                kept = keep_layout(seed, child)
                assert _tree(kept) == _tree(child), (name, op_name)
                lines = set(seed.splitlines())
                assert sum(line in lines for line in kept.splitlines()) >= sum(
                    line in lines for line in child.splitlines()), (name, op_name, kept)
                checked += 1
    assert checked > 50


def test_the_embedded_mutator_keeps_a_users_comments():
    mutator = EmbeddedMutator(EmbeddedMutatorConfig(), "policy")
    kept = 0
    for seed in range(20):
        proposal = mutator.propose(MutationRequest("run", 0, 1, "p0", PARENT, seed=seed))
        assert ast.parse(proposal.code)
        kept += "# what is here plus what is on its way" in proposal.code
    assert kept >= 15, kept  # only an edit of that very statement, or the lines around it, drops it


def test_a_changed_statement_takes_the_parents_quotes():
    """`ast.unparse` writes strings in single quotes; in a parent that writes them in double ones, a
    changed statement does too (a string holding a quote or a backslash stays as it is)."""
    tree = ast.parse(PARENT)
    tree.body[2].body[1].value.left.slice = ast.Constant("stock")
    tree.body[2].body[-1].value.args[1] = ast.Constant('a"b')
    child = ast.unparse(tree)
    assert "state['stock']" in child
    kept = keep_layout(PARENT, child)
    assert _tree(kept) == _tree(child)
    assert '    position = state["stock"] + state["pipeline"].sum(axis=1)\n' in kept, kept
    assert "    return np.maximum(order, 'a\"b')\n" in kept, kept
    single = PARENT.replace('"', "'").replace("'''", '"""')  # a parent that prefers single quotes keeps them
    kept = keep_layout(single, ast.unparse(ast.parse(single)).replace("'on_hand'", "'stock'"))
    assert "    position = state['stock'] + state['pipeline'].sum(axis=1)\n" in kept, kept
