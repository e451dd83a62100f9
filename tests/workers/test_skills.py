"""Skills: edits extracted from a parent and its child, replayed on other programs, ranked, and
replayed by the embedded mutator's 'skill' operator."""
import ast
from collections import Counter

import numpy as np
import pytest

from evaluators.domains.inventory.programs import BASELINES, MOTIFS, SEED_PROGRAM
from evaluators.params import read_params
from store.records import MutationRequest
from workers.ast_ops import OPERATORS, Motif, OpContext
from workers.config import EmbeddedMutatorConfig
from workers.embedded import EmbeddedMutator
from workers.skill_edits import SkillEdit, applies, extract_edit, replay
from workers.skills import Skill, describe, efficacy, rank_skills, render_skills, skill_id

MOTIF_LIST = tuple(Motif(name, template, tuple(params)) for name, template, params in MOTIFS)
CAPPED = MOTIF_LIST[0]  # np.minimum({expr}, params["cap"])


def _same(a: str, b: str) -> bool:
    return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))


def _child(code, operator, seed):
    ctx = OpContext("policy", np.random.default_rng(seed), 0.3, (BASELINES["capped base-stock"],), MOTIF_LIST)
    return OPERATORS[operator](code, ctx)


@pytest.mark.parametrize("operator", ["swap_operator", "wrap_clip", "add_branch", "remove_branch", "crossover",
                                      "insert_motif"])
def test_every_structural_operator_edit_replays_on_its_parent(operator):
    outcomes = Counter()
    parent = _child(SEED_PROGRAM, "add_branch", 3)  # a parent with a branch, so remove_branch applies
    for seed in range(12):
        child = _child(parent, operator, seed)
        if child is None:
            continue
        edit = extract_edit(parent, child, "policy")
        assert edit is not None and applies(edit, parent, "policy")
        replayed = replay(edit, parent, "policy", np.random.default_rng(0))
        outcomes["same" if _same(replayed, child) else "elsewhere"] += 1
        assert read_params(replayed).keys() == read_params(child).keys()
    assert outcomes["same"] >= max(1, sum(outcomes.values()) // 2), outcomes


def test_a_params_only_change_is_no_skill():
    child = SEED_PROGRAM.replace("(15.0, 0.0, 80.0)", "(21.0, 0.0, 80.0)")
    assert extract_edit(SEED_PROGRAM, child, "policy") is None


def test_a_wrapped_return_value_replays_on_another_program_with_other_names():
    ctx = OpContext("policy", np.random.default_rng(0), motifs=(CAPPED,))
    child = OPERATORS["insert_motif"](SEED_PROGRAM, ctx)
    edit = extract_edit(SEED_PROGRAM, child, "policy")
    assert edit.wraps and edit.anchor == "return" and [p[0] for p in edit.new_params] == ["cap"]
    other = BASELINES["capped base-stock"].replace("state", "s").replace("params", "p").replace(
        "import numpy as np", "import numpy as xp").replace("np.", "xp.")
    replayed = replay(edit, other, "policy", np.random.default_rng(1))  # where the same expression stands
    assert "xp.minimum(xp.minimum(xp.maximum(p['level'] - position, 0), p['cap_2']), p['cap'])" in replayed
    myopic = replay(edit, BASELINES["myopic"], "policy", np.random.default_rng(1))  # else, any return value
    assert "np.minimum(np.maximum(target - stock, 0.0), params['cap'])" in myopic
    assert read_params(replayed)["cap_2"].default == read_params(child)["cap"].default  # a fresh name, the same spec
    title, when = describe(edit)
    assert title == "wrap the returned value as np.minimum(…, cap) (new parameters: cap)"
    assert when == "any policy that returns a value"


def test_a_rewritten_return_value_goes_to_any_return_value_whose_parameters_exist():
    crossed = SEED_PROGRAM.replace('np.maximum(params["level"] - position, 0)',
                                   'np.where(position < params["gate"], np.maximum(params["level"] - position, 0), 0.0)')
    crossed = crossed.replace('PARAMS = {"level": (15.0, 0.0, 80.0)}',
                              'PARAMS = {"level": (15.0, 0.0, 80.0), "gate": (40.0, 0.0, 80.0)}')
    edit = extract_edit(SEED_PROGRAM, crossed, "policy")
    assert edit.anchor == "return" and edit.wraps and [p[0] for p in edit.new_params] == ["gate"]
    rewrite = SkillEdit("expr", "__params__['x']", "__np__.maximum(__params__['level'] - position, 0)", "return")
    capped = BASELINES["capped base-stock"]
    assert "return np.maximum(params['level'] - position, 0)" in replay(rewrite, capped, "policy",
                                                                         np.random.default_rng(0))
    assert not applies(rewrite, BASELINES["myopic"], "policy")  # it has no params["level"]
    same_change_other_run = SkillEdit("expr", "x", edit.after, "return", (("gate", 12.5, 0.0, 80.0),))
    assert skill_id("inventory", same_change_other_run) == skill_id("inventory", edit)


def test_an_edit_of_a_part_another_program_lacks_does_not_apply():
    edit = SkillEdit("expr", "__state__['on_hand'] * 2", "__state__['on_hand'] * 3")
    assert not applies(edit, SEED_PROGRAM, "policy")
    assert replay(edit, SEED_PROGRAM, "policy", np.random.default_rng(0)) is None
    assert SkillEdit.from_record(edit.to_record()) == edit


def _skill(edit, uses=0, successes=0, parent=SEED_PROGRAM, name="x"):
    return Skill(skill_id("inventory", edit) + name, "inventory", "t", "w", edit, 0.1, 0.05, uses, successes, parent)


def test_ranking_prefers_applicable_similar_and_effective_skills_and_tries_new_ones():
    wrap = extract_edit(SEED_PROGRAM, OPERATORS["insert_motif"](
        SEED_PROGRAM, OpContext("policy", np.random.default_rng(0), motifs=(CAPPED,))), "policy")
    foreign = SkillEdit("expr", "__state__['on_hand'] * 2", "__state__['on_hand'] * 3")
    proven, failing, new = _skill(wrap, 10, 8, name="a"), _skill(wrap, 10, 0, name="b"), _skill(wrap, name="c")
    unplaceable = _skill(foreign, 10, 10, name="d")
    ranked = rank_skills([failing, unplaceable, new, proven], SEED_PROGRAM, "policy", k=4)
    assert [s.skill_id for s in ranked] == [proven.skill_id, new.skill_id, unplaceable.skill_id, failing.skill_id]
    assert efficacy(0, 0) == 0.5 and new.counted(True).efficacy == pytest.approx(2 / 3)
    text = render_skills(ranked[:2])
    assert "Skill 1: t" in text and "helped 8 of 10 uses" in text and "np.minimum(…, cap)" in text


def test_the_embedded_mutator_replays_skills_only_when_the_request_carries_some():
    wrap = extract_edit(SEED_PROGRAM, OPERATORS["insert_motif"](
        SEED_PROGRAM, OpContext("policy", np.random.default_rng(0), motifs=(CAPPED,))), "policy")
    skill = _skill(wrap)
    mutator = EmbeddedMutator(EmbeddedMutatorConfig(), "policy", list(MOTIF_LIST))
    only_skill = [(name, 0.0) for name in OPERATORS]
    with_skill = [mutator.propose(MutationRequest("r", 0, 1, "p", SEED_PROGRAM, operator_weights=tuple(only_skill),
                                                  seed=s, skills=(skill,))) for s in range(5)]
    assert {(p.operator, p.skill_id) for p in with_skill} == {("embedded:skill", skill.skill_id)}
    # in the seed's own quotes (workers.layout)
    assert all('np.minimum(np.maximum(params["level"] - position, 0), params["cap"])' in p.code for p in with_skill)
    plain = [mutator.propose(MutationRequest("r", 0, 1, "p", SEED_PROGRAM, seed=s)) for s in range(30)]
    assert all(p.operator != "embedded:skill" and p.skill_id == "" for p in plain)
    assert "skill" not in EmbeddedMutatorConfig(operators=("perturb_const",)).operators
