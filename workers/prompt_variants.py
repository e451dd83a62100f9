"""Prompt variants: the instruction part of an LLM mutation prompt, as a small population.

Each variant's success is measured (edits made with it that beat their parent) and kept
in the library, so the population carries across runs. `select_variant` picks one per
request by Thompson sampling (a new variant has the prior's chance), and
`rewrite_variant` asks an LLM for a new variant from the measured ones; the LLM is any
callable from prompt text to reply text, so this module needs no client of its own.
The reply is untrusted text: it is only parsed, checked for length and stored.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import jinja2
import numpy as np

MAX_CHARS = 2000
_TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
                                autoescape=False, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
_ANSWER = re.compile(r"<instruction>\s*(.*?)\s*(?:</instruction>|\Z)", re.S)


@dataclass(frozen=True)
class PromptVariant:
    """One instruction text with its measured success over every run."""

    variant_id: str
    domain: str
    text: str
    parent_id: str | None = None
    origin: str = "default"  # "default", "user" or "rewrite:<model>"
    uses: int = 0
    successes: int = 0


def variant_id(domain: str, text: str) -> str:
    """The same text for the same domain is one variant."""
    return "pv-" + hashlib.sha256(f"{domain}\n{text.strip()}".encode()).hexdigest()[:12]


def new_variant(domain: str, text: str, origin: str = "default", parent_id: str | None = None) -> PromptVariant:
    return PromptVariant(variant_id(domain, text), domain, text.strip(), parent_id, origin)


def select_variant(variants: Sequence[PromptVariant], rng: np.random.Generator) -> PromptVariant:
    """Thompson sampling: the variant with the highest draw from Beta(successes + 1, failures + 1)."""
    if not variants:
        raise ValueError("no prompt variants to choose from")
    draws = [rng.beta(v.successes + 1.0, v.uses - v.successes + 1.0) for v in variants]
    return variants[int(np.argmax(draws))]


def rewrite_prompt(domain: str, variants: Sequence[PromptVariant]) -> str:
    """The prompt asking an LLM for a new variant, the measured ones best first."""
    ranked = sorted(variants, key=lambda v: -(v.successes + 1.0) / (v.uses + 2.0))
    return _TEMPLATES.get_template("rewrite_prompt_variant.j2").render(domain=domain, variants=ranked,
                                                                        max_chars=MAX_CHARS)


def new_instruction(reply: str | None, known: Sequence[str]) -> str:
    """The usable instruction a rewrite reply holds: what its <instruction> tags enclose, else all
    of it, stripped; '' when that is empty, too long, or one of the `known` texts."""
    match = _ANSWER.search(reply or "")
    text = (match.group(1) if match else (reply or "")).strip()
    return "" if len(text) > MAX_CHARS or text in known else text


def rewrite_variant(domain: str, variants: Sequence[PromptVariant], client: Callable[[str], str],
                    model: str = "llm") -> PromptVariant | None:
    """A new variant written by `client` from the measured ones, or None when the reply holds
    no usable instruction (`new_instruction`)."""
    text = new_instruction(client(rewrite_prompt(domain, variants)), [v.text for v in variants])
    if not text:
        return None
    best = max(variants, key=lambda v: (v.successes + 1.0) / (v.uses + 2.0)) if variants else None
    return new_variant(domain, text, f"rewrite:{model}", best.variant_id if best else None)
