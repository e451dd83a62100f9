"""Prompt variants in the library: loaded at a run's start, chosen per request, their uses sent back.

The LLM mutation path calls this from the driver (which owns the library connection):
`choose` per request, `record` when the child's search result is in, `flush` at commit
points, and now and then `maybe_rewrite` with an LLM client callable. Uses are kept per
(run, program), so counts over every run add up and a re-sent batch counts once.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from store import library_records as records
from store.library import Library, LibraryError
from workers.prompt_variants import PromptVariant, new_variant, rewrite_variant, select_variant


class VariantMemory:
    """A domain's prompt variants for one run, with the run's uses not yet sent."""

    def __init__(self, library: Library, domain: str, run_id: str, defaults: Sequence[str] = ()):
        self.library, self.domain, self.run_id = library, domain, run_id
        self.pending: list[dict] = []
        self.variants = self._load([new_variant(domain, text) for text in defaults])

    def _load(self, defaults: list[PromptVariant]) -> dict[str, PromptVariant]:
        def work(con):
            for v in defaults:
                records.add_variant(con, {"variant_id": v.variant_id, "domain": v.domain, "text": v.text,
                                          "parent_id": v.parent_id, "origin": v.origin})
            return records.variants(con, self.domain)
        rows = self.library.transaction(work)
        return {r["variant_id"]: PromptVariant(r["variant_id"], r["domain"], r["text"], r["parent_id"], r["origin"],
                                               int(r["uses"]), int(r["successes"])) for r in rows}

    def choose(self, rng: np.random.Generator) -> PromptVariant:
        """The variant for the next request (Thompson sampling over the measured ones)."""
        return select_variant(sorted(self.variants.values(), key=lambda v: v.variant_id), rng)

    def record(self, program_id: str, variant_id: str, success: bool) -> None:
        """One use: the child `program_id` was asked for with `variant_id`; success: it beat its parent."""
        self.pending.append({"run_id": self.run_id, "program_id": program_id, "variant_id": variant_id,
                             "success": success})
        v = self.variants.get(variant_id)
        if v is not None:
            self.variants[variant_id] = PromptVariant(v.variant_id, v.domain, v.text, v.parent_id, v.origin,
                                                      v.uses + 1, v.successes + int(success))

    def flush(self) -> bool:
        """Send the uses recorded since the last flush; False (kept for the next) if the library is busy."""
        uses = list(self.pending)
        if not uses:
            return True
        try:
            self.library.transaction(lambda con: records.add_variant_uses(con, uses))
        except LibraryError:
            return False
        del self.pending[:len(uses)]
        return True

    def maybe_rewrite(self, client: Callable[[str], str], rng: np.random.Generator, chance: float = 0.05,
                      model: str = "llm") -> PromptVariant | None:
        """With probability `chance`, ask `client` for a new variant and add it to the population."""
        if rng.random() >= chance:
            return None
        variant = rewrite_variant(self.domain, list(self.variants.values()), client, model)
        if variant is None:
            return None
        self.library.transaction(lambda con: records.add_variant(con, {
            "variant_id": variant.variant_id, "domain": variant.domain, "text": variant.text,
            "parent_id": variant.parent_id, "origin": variant.origin}))
        self.variants[variant.variant_id] = variant
        return variant
