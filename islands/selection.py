"""Parent and inspiration sampling on one island (FunSearch-style).

A parent is drawn in two steps: a niche by a softmax over niche best scores
(normalised to [0, 1], so the temperature means the same on any score scale),
then a member of that niche favouring shorter code.
"""
from __future__ import annotations

import numpy as np

from islands.population import Island, Member


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax: a tiny temperature gives a one-hot, not NaN."""
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def normalise(values: np.ndarray) -> np.ndarray:
    """Map values onto [0, 1]; all equal maps to zeros."""
    span = values.max() - values.min()
    return (values - values.min()) / span if span > 0 else np.zeros_like(values)


def _require_members(island: Island) -> None:
    if len(island) == 0:
        raise ValueError(f"island {island.island_id} is empty; add a member (the seed program) "
                         "before asking it for a parent")


def select_parent(island: Island, rng: np.random.Generator, temperature: float) -> Member:
    """Draw a parent: a niche by softmax(best score / temperature), then a short member of it."""
    _require_members(island)
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    scores = island.niche_scores()
    chosen = island.niche_at(int(rng.choice(len(scores), p=softmax(normalise(scores) / temperature))))
    return _shortest_favoured(chosen, rng)


def _shortest_favoured(niche: list[Member], rng: np.random.Generator) -> Member:
    """FunSearch's within-cluster draw: softmax over negated normalised code length."""
    if len(niche) == 1:
        return niche[0]
    lengths = np.array([len(m.code) for m in niche], dtype=float)
    scaled = (lengths - lengths.min()) / (lengths.max() + 1e-6)
    return niche[rng.choice(len(niche), p=softmax(-scaled))]


def select_inspirations(island: Island, rng: np.random.Generator, k: int,
                        exclude_id: str | None = None) -> list[Member]:
    """Up to `k` distinct members other than `exclude_id`, other niches' bests first.

    Showing the mutator programs that behave differently from the parent is the
    point, so the bests of the other niches come first, in random order; only
    when there are too few does it fill up with the remaining members.
    """
    if k <= 0:
        return []
    own = island.slot_of(exclude_id) if exclude_id is not None else None
    others = island.niche_count() - (own is not None)
    # the same draws as shuffling the list of the other niches' bests, without building it
    order = rng.permutation(others)[:k]
    picked = [island.niche_at(int(i) + (own is not None and i >= own))[0] for i in order]
    rest = len(island) - others - (own is not None)  # members neither shown above nor the parent
    order = rng.permutation(rest)[:k - len(picked)]
    if len(order):  # fewer other niches than k, all picked: walk the members (there are few niches then)
        shown = {m.program_id for m in picked} | {exclude_id}
        remaining = [m for m in island.members() if m.program_id not in shown]
        picked += [remaining[int(i)] for i in order]
    return picked
