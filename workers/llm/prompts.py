"""Prompts from template files (jinja2); the parts most calls share are stored once.

A prompt is a list of chat messages built from named parts: the system part
(domain description, policy contract, output format) is the same for every call
of a run; the parent part is shared by every call on that parent. The archive
stores each part once, keyed by its hash, and each call lists its parts.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from workers.llm.feedback import Feedback, clip_reason

TEMPLATES = Path(__file__).with_name("templates")
DEFAULT_INSTRUCTION = "Change the program to raise its score."  # the task's instruction, the first prompt variant
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                          trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False,
                          auto_reload=False)  # the templates ship with the package: no stat of each file per prompt


@dataclass(frozen=True)
class PromptInput:
    """Everything a prompt shows about one request (built on the driver, search split only)."""

    domain: str
    description: str
    contract: str
    entry_point: str
    parent_code: str
    feedback: Feedback | None
    inspirations: tuple[tuple[str, float | None], ...] = ()  # (code, search score)
    failures: tuple[tuple[str, str], ...] = ()  # (how the attempt ended, reason)
    edit_format: str = "diff"
    max_code_chars: int = 6000
    skills: str = ""  # the library's skills ranked for this parent, as text (`workers.skills.render_skills`)
    instruction: str = ""  # the prompt variant's instruction for the task; "" keeps the template's own
    tuned: bool = True  # the domain tunes PARAMS (`Domain.tunes_params`): the child's normal form leaves their defaults out


@dataclass(frozen=True)
class Prompt:
    """Chat messages and the parts they were built from (name, text), in order."""

    parts: tuple[tuple[str, str], ...]
    messages: tuple[dict, ...] = field(default=())

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.parts)


def part_id(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _render(name: str, **values) -> str:
    return _ENV.get_template(name).render(DEFAULT_INSTRUCTION=DEFAULT_INSTRUCTION, **values)


def _code(code: str, limit: int) -> str:
    return code if len(code) <= limit else code[:limit] + "\n# ... (cut)\n"


def _failures(p: PromptInput) -> str:
    return _render("failures.j2", failures=[(outcome, clip_reason(reason)) for outcome, reason in p.failures])


def _user_parts(p: PromptInput, diagnosis: str) -> list[tuple[str, str]]:
    parts = [("parent", _render("parent.j2", p=p, code=_code(p.parent_code, p.max_code_chars), fb=p.feedback))]
    if p.inspirations:
        shown = [(_code(code, p.max_code_chars), score) for code, score in p.inspirations]
        parts.append(("inspirations", _render("inspirations.j2", inspirations=shown)))
    if p.failures:
        parts.append(("failures", _failures(p)))
    if p.skills:
        parts.append(("skills", _render("skills.j2", skills=p.skills)))
    if diagnosis:
        parts.append(("diagnosis", _render("diagnosis_in.j2", diagnosis=diagnosis)))
    parts.append(("task", _render(f"task_{p.edit_format}.j2", p=p)))
    return parts


def edit_prompt(p: PromptInput, diagnosis: str = "") -> Prompt:
    """The prompt asking for an edit of the parent (with an earlier diagnosis, if any)."""
    system = ("system", _render("system.j2", p=p))
    user = _user_parts(p, diagnosis)
    return Prompt((system, *user), ({"role": "system", "content": system[1]},
                                    {"role": "user", "content": "".join(t for _, t in user)}))


def diagnosis_prompt(p: PromptInput) -> Prompt:
    """The prompt asking what fails in the parent and why, before any edit."""
    system = ("system", _render("system.j2", p=p))
    user = [("parent", _render("parent.j2", p=p, code=_code(p.parent_code, p.max_code_chars), fb=p.feedback))]
    if p.failures:
        user.append(("failures", _failures(p)))
    user.append(("task", _render("task_diagnose.j2", p=p)))
    return Prompt((system, *user), ({"role": "system", "content": system[1]},
                                    {"role": "user", "content": "".join(t for _, t in user)}))
