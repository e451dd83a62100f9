"""The islands branch of the run's config: population, niches, selection, migration."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class IslandsConfig(BaseModel):
    """How the island-model population is shaped, sampled, mixed and reset."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    count: int = Field(4, ge=1, le=256, description="Number of islands evolving side by side.")
    niche: Literal["signature", "map_elites"] = Field(
        "signature",
        description="'signature' clusters members by their rounded per-instance scores (FunSearch); "
                    "'map_elites' bins their behaviour descriptors into a grid of cells.")
    descriptor_bins: int = Field(6, ge=1, le=1000, description="MAP-Elites cells per descriptor dimension.")
    descriptor_bounds: list[tuple[float, float]] = Field(
        default_factory=list,
        description="[low, high] per descriptor dimension; descriptors are clipped into them. "
                    "Empty means learn the range from the descriptors seen so far.")
    max_niches: int = Field(
        1000, ge=1, le=1_000_000,
        description="Niches an island keeps: a new niche past it replaces the one with the worst best score, "
                    "or is not kept if it scores below that. Nearly every new signature opens a niche, so "
                    "without a bound a long run's islands would grow with every evaluation.")
    max_members_per_niche: int = Field(
        1, ge=1, le=1000, description="Members kept per niche, best first; 1 means the niche keeps only its best.")
    parent_temperature: float = Field(
        0.1, gt=0, description="Softmax temperature over niche best scores (normalised to [0, 1]); lower is greedier.")
    temperature_decay_evals: int = Field(
        1000, ge=1, description="Period of the temperature's annealing: T * (1 - (n % period) / period) after n results.")
    inspirations: int = Field(2, ge=0, le=64, description="Extra members shown to the mutator beside the parent.")
    migration: Literal["ring", "random", "none"] = Field(
        "ring", description="'ring' sends each island's best to the next island, 'random' to a random other one.")
    migrate_every: int = Field(10, ge=1, description="Global generations between migrations.")
    migrants: int = Field(1, ge=0, le=1000, description="Best members each island sends per migration.")
    reset_every: int = Field(
        40, ge=0, description="Global generations between resets of the weaker half of the islands; 0 disables.")
    signature_decimals: int = Field(
        3, ge=0, le=12, description="Decimals the per-instance scores are rounded to before they form a signature.")

    @field_validator("descriptor_bounds")
    @classmethod
    def _bounds_are_ordered(cls, bounds: list[tuple[float, float]]) -> list[tuple[float, float]]:
        """Each pair must be a real interval, otherwise every descriptor lands in one cell."""
        for i, (low, high) in enumerate(bounds):
            if not low < high:
                raise ValueError(f"descriptor_bounds[{i}] = [{low}, {high}]: low must be below high")
        return bounds
