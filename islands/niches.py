"""Niche keys: FunSearch score signatures and MAP-Elites descriptor cells.

A niche key is a tuple. Members with the same key compete for the same slots,
so the key decides what counts as "different behaviour" on an island.
"""
from __future__ import annotations

import math
from typing import Sequence


def signature_key(instance_scores: Sequence[float], score: float, decimals: int) -> tuple:
    """Per-instance scores rounded to `decimals`; the total score when there are none.

    Programs that score every instance alike behave alike, so they share a cluster.
    """
    values = instance_scores if len(instance_scores) else (score,)
    return tuple(round(float(v), decimals) for v in values)


class DescriptorGrid:
    """Bins descriptors into `bins` cells per dimension, within fixed or learned bounds.

    With no fixed bounds the grid widens its range to cover every descriptor it has
    seen; `observe` says when that happened so the island can re-bin its members.
    """

    def __init__(self, bins: int, bounds: Sequence[Sequence[float]] = ()):
        self.bins = bins
        self.fixed = bool(bounds)
        self.low = [float(lo) for lo, _ in bounds]
        self.high = [float(hi) for _, hi in bounds]

    def observe(self, descriptors: Sequence[float]) -> bool:
        """Check `descriptors` and widen learned bounds; True if the range changed."""
        self._check(descriptors)
        if self.fixed:
            return False
        if not self.low:
            self.low, self.high = list(map(float, descriptors)), list(map(float, descriptors))
            return True
        changed = False
        for d, x in enumerate(descriptors):
            if x < self.low[d] or x > self.high[d]:
                self.low[d], self.high[d] = min(self.low[d], x), max(self.high[d], x)
                changed = True
        return changed

    def key(self, descriptors: Sequence[float]) -> tuple:
        """The cell of `descriptors`: one bin index per dimension, clipped into the grid."""
        return tuple(self._bin(d, float(x)) for d, x in enumerate(descriptors))

    def _bin(self, d: int, x: float) -> int:
        width = self.high[d] - self.low[d]
        if width <= 0:
            return 0
        return min(self.bins - 1, max(0, math.floor((x - self.low[d]) / width * self.bins)))

    def _check(self, descriptors: Sequence[float]) -> None:
        """A clear error for missing, mismatched or non-finite descriptors."""
        if not len(descriptors):
            raise ValueError("niche='map_elites' needs descriptors, but a member has none; "
                             "use niche='signature' or a domain that reports descriptors")
        if self.low and len(descriptors) != len(self.low):
            raise ValueError(f"member has {len(descriptors)} descriptors but the grid has "
                             f"{len(self.low)} dimensions (check descriptor_bounds)")
        if not all(math.isfinite(float(x)) for x in descriptors):
            raise ValueError(f"descriptors must be finite numbers, got {tuple(descriptors)}")

    def state(self) -> dict:
        """Plain data for snapshots; learned bounds cannot be recomputed from kept members."""
        return {"low": self.low, "high": self.high}

    def restore(self, state: dict) -> None:
        """Learned bounds go on from the saved ones; fixed bounds stay the config's (a resume may set them)."""
        if not self.fixed:
            self.low, self.high = list(state["low"]), list(state["high"])
