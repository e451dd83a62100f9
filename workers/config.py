"""Configuration of the embedded (no-LLM) mutator, validated strictly."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from workers.ast_ops import OPERATORS

SKILL = "skill"  # replays a library skill's edit; chosen only when the request carries skills
KNOWN_OPERATORS = (*OPERATORS, SKILL)


class EmbeddedMutatorConfig(BaseModel):
    """Which AST operators the embedded mutator may use, and how boldly."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operators: tuple[str, ...] = Field(
        default=KNOWN_OPERATORS,
        min_length=1,
        description="Names of the enabled operators (default: all of them). 'skill' replays an edit "
                    "from the library's skills, when the run uses them (memory.warm_start).",
    )
    const_scale: float = Field(
        default=0.3, gt=0.0, le=10.0,
        description="Relative size of a constant perturbation (standard deviation of the factor).",
    )
    max_attempts: int = Field(
        default=8, ge=1, le=1000,
        description="Tries before giving up, when an operator cannot apply or yields an "
                    "identical or invalid child.",
    )
    success_prior: float = Field(
        default=1.0, gt=0.0,
        description="Pseudo-count added to each operator's successes when its weight is "
                    "derived from measured success, so every operator keeps a chance (at 0, an "
                    "operator whose first child did not improve was never drawn again).",
    )

    @field_validator("operators")
    @classmethod
    def _known_operators(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in names if name not in KNOWN_OPERATORS]
        if unknown:
            raise ValueError(f"unknown operators {unknown}; choose from {sorted(KNOWN_OPERATORS)}")
        return tuple(dict.fromkeys(names))
