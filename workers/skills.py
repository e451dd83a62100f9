"""Skills: edits that beat their parent on the search split and held on the validation split.

A `Skill` is what the library keeps of such an edit: a readable title, when it applies,
the replayable `SkillEdit` and the gains measured when it was learned, with its use
counts across runs. This module holds what every mutator shares:

- `describe(edit)`: the title and "applies when" line written from the edit itself (no LLM);
- `efficacy` and `rank_skills`: retrieval by similarity to the parent and measured
  success, with a prior so a new skill gets tried;
- `render_skills`: the text an LLM prompt shows (`request.skills` carries the ranked ones);
- `replay_skill`: the embedded mutator's "skill" operator;
- `abstract_skill`: with an LLM, its analysis, strategy and abstraction of a learned edit.

Nothing here runs a program or opens the library (the driver does, `controller/memory.py`).
"""
from __future__ import annotations

import hashlib
import io
import json
import re
import tokenize
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import jinja2
import numpy as np

from workers.skill_edits import HOLE, NUMPY, PARAMS, STATE, SkillEdit, applies, replay

PRIOR_SUCCESSES, PRIOR_FAILURES = 1.0, 1.0  # Beta(1, 1): an untried skill counts as a coin flip
_TITLE_WIDTH = 90
_ABSTRACTION_CHARS = 1500
_TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
                                autoescape=False, undefined=jinja2.StrictUndefined)


@dataclass(frozen=True)
class Skill:
    """A learned edit with its measured gains and its efficacy counts (over every run)."""

    skill_id: str
    domain: str
    title: str
    applies_when: str
    edit: SkillEdit
    search_gain: float
    validation_gain: float
    uses: int = 0
    successes: int = 0
    parent_code: str = ""  # the program it was learned on (for similarity, and as an example)
    child_code: str = ""
    abstraction: str = ""  # the LLM's analysis, strategy and abstraction, when one wrote them

    @property
    def efficacy(self) -> float:
        return efficacy(self.uses, self.successes)

    def counted(self, success: bool) -> "Skill":
        """This skill after one more use."""
        return replace(self, uses=self.uses + 1, successes=self.successes + int(success))


def skill_id(domain: str, edit: SkillEdit) -> str:
    """The same edit learned twice (in two runs) is one skill: the same change (and, unless it
    goes to any return value, the same place) with parameters of the same names; their
    defaults, tuned values of one run, do not count."""
    place = "" if edit.anchor == "return" else edit.before
    text = json.dumps([domain, edit.kind, edit.anchor, place, edit.after, [p[0] for p in edit.new_params]])
    return "sk-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def efficacy(uses: int, successes: int) -> float:
    """Posterior mean success rate under the Beta prior (0.5 for an untried skill)."""
    return (successes + PRIOR_SUCCESSES) / (uses + PRIOR_SUCCESSES + PRIOR_FAILURES)


# --- titles ----------------------------------------------------------------------------------

def _readable(text: str) -> str:
    """Placeholders back to their usual names; `params["cap"]` shortened to `cap`."""
    text = re.sub(rf"{PARAMS}\[['\"](\w+)['\"]\]", r"\1", text)
    text = text.replace(STATE, "state").replace(NUMPY, "np").replace(HOLE, "…")
    text = " ".join(text.split())
    return text if len(text) <= _TITLE_WIDTH else text[:_TITLE_WIDTH - 1] + "…"


def describe(edit: SkillEdit) -> tuple[str, str]:
    """(title, applies_when) written from the edit alone."""
    before, after = _readable(edit.before), _readable(edit.after)
    new = f" (new parameters: {', '.join(p[0] for p in edit.new_params)})" if edit.new_params else ""
    if edit.wraps and edit.anchor == "return":
        return f"wrap the returned value as {after}{new}", "any policy that returns a value"
    if edit.wraps:
        return f"wrap {before} as {after}{new}", f"policies that compute {before}"
    if edit.kind == "stmts" and not edit.after.strip():
        return f"drop {before}", f"policies with the statement {before}"
    verb = "rewrite the return value" if edit.anchor == "return" else "replace"
    return f"{verb} {before} with {after}{new}", f"policies that compute {before}"


# --- retrieval -------------------------------------------------------------------------------

def _tokens(code: str) -> set[str]:
    """Names, operators and literals of a program (comments and layout ignored)."""
    try:
        words = [t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
                 if t.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER)]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        words = code.split()
    return set(words)


def similarity(a: str, b: str) -> float:
    """Jaccard similarity of two programs' token sets, in [0, 1]."""
    ta, tb = _tokens(a), _tokens(b)
    return len(ta & tb) / len(ta | tb) if ta | tb else 0.0


def rank_skills(skills, parent_code: str, entry_point: str, k: int) -> list[Skill]:
    """The `k` skills most worth trying on `parent_code`, best first.

    Rank = efficacy x (0.5 + 0.5 x similarity to the program the skill was learned on),
    and a skill whose edit has no place in the parent counts a quarter (an LLM may still
    adapt it; the embedded operator cannot).
    """
    def rank(skill: Skill) -> float:
        fit = 1.0 if applies(skill.edit, parent_code, entry_point) else 0.25
        return skill.efficacy * (0.5 + 0.5 * similarity(parent_code, skill.parent_code)) * fit
    scored = sorted(skills, key=lambda s: (-rank(s), s.skill_id))
    return scored[:k]


def render_skills(skills) -> str:
    """The skills as prompt text: title, when it applies, the edit, its record."""
    blocks = []
    for i, s in enumerate(skills, 1):
        lines = [f"Skill {i}: {s.title}", f"  applies to: {s.applies_when}",
                 f"  edit: replace `{_readable(s.edit.before)}` with `{_readable(s.edit.after)}`",
                 f"  measured: search gain {s.search_gain:+.4g}, validation gain {s.validation_gain:+.4g}; "
                 f"helped {s.successes} of {s.uses} uses"]
        if s.abstraction:
            lines.append(f"  why: {s.abstraction}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


# --- the embedded operator -------------------------------------------------------------------

def replay_skill(code: str, skills, entry_point: str, rng: np.random.Generator) -> tuple[str, str] | None:
    """(child, skill_id): one of `skills` that has a place in `code`, chosen with probability
    proportional to its efficacy, replayed there; None when none of them applies."""
    usable = [s for s in skills if applies(s.edit, code, entry_point)]
    if not usable:
        return None
    weights = np.array([s.efficacy for s in usable])
    skill = usable[int(rng.choice(len(usable), p=weights / weights.sum()))]
    child = replay(skill.edit, code, entry_point, rng)
    return (child, skill.skill_id) if child is not None else None


# --- with an LLM -----------------------------------------------------------------------------

def abstract_skill(skill: dict, feedback: str, client: Callable[[str], str], max_words: int = 120) -> str:
    """The LLM's analysis (what the parent got wrong, from its evaluation `feedback`), strategy and
    abstraction of a learned skill record (`controller.skill_learning`), for its `abstraction`.
    `client` is any callable from prompt text to reply text; the reply is untrusted text, kept
    only as text (trimmed), and "" when empty."""
    edit = SkillEdit.from_record(skill["edit"])
    prompt = _TEMPLATES.get_template("abstract_skill.j2").render(
        domain=skill["domain"], parent_code=skill["parent_code"], feedback=feedback,
        before=_readable(edit.before), after=_readable(edit.after),
        new_params=", ".join(p[0] for p in edit.new_params), search_gain=skill["search_gain"],
        validation_gain=skill["validation_gain"], max_words=max_words)
    reply = " ".join(str(client(prompt) or "").split())
    return reply[:_ABSTRACTION_CHARS]
