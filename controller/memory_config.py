"""The memory branch of the run's config: the library, skills and warm starts."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class MemoryConfig(BaseModel):
    """How a run uses the library shared by runs (see store/library.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Use the library: catalog this run, keep its elites and the skills "
                                            "it learns. False: the run neither reads nor writes it.")
    library: str = Field("", description="Path of the library file; empty: $ATOLL_LIBRARY, else "
                                         "library.duckdb in the user's data directory.")
    learn_skills: bool = Field(True, description="Check children that beat their parent on the validation "
                                                 "split and keep the edits whose gain holds there as skills.")
    validate_every: int = Field(10, ge=1, le=100_000, description="At most one validation check (the child, "
                                "and its parent if not yet scored there) per this many search evaluations.")
    min_gain: float = Field(0.0, ge=0, description="Search-score gain over its parent a child needs to be "
                                                   "checked on the validation split.")
    warm_start: bool = Field(False, description="Start from earlier runs' elites (chosen by search score) and "
                                                "replay their skills as the 'skill' operator.")
    warm_from: list[str] = Field(default_factory=list, description="Run ids or run directories to warm-start "
                                 "from; empty: the whole library (elites of runs with this domain and the same "
                                 "options, every skill of the domain).")
    warm_elites: int = Field(4, ge=0, le=64, description="Elites a warm start evaluates first, best search "
                                                         "scores first (they count in run.max_evals).")
    elites_per_run: int = Field(4, ge=0, le=64, description="Best programs (by search score) a run leaves "
                                                            "in the library when it ends.")
    skills_per_request: int = Field(3, ge=1, le=16, description="Top-ranked skills sent with each mutation "
                                    "request: the 'skill' operator replays one, LLM prompts show them.")
    variant_rewrite_chance: float = Field(0.2, ge=0, le=1, description="Chance that a run with LLM sources, "
                                          "when its search ends, asks a model for a new prompt variant (the "
                                          "task's instruction) written from the measured ones.")
    flush_every_s: float = Field(30.0, gt=0, description="Longest time between the run's writes to the "
                                 "library (catalog, skills, uses), at commit points. Each write opens the shared "
                                 "library file (tens of ms); nothing is lost between writes, because the run's "
                                 "end and every resume send its whole contribution again from its archive.")
    backup_every_s: float = Field(3600.0, ge=0, description="Longest age of the library's backup "
                                  "(library.backup.duckdb beside it): a run copies the library whole there at a "
                                  "write to it, and at its end, once the backup is older. 0: no backups.")
    busy_timeout_s: float = Field(30.0, gt=0, description="How long one write waits while other runs hold the "
                                  "library; what it could not write is sent at the next commit point.")

    @model_validator(mode="after")
    def _warm_needs_library(self):
        if self.warm_start and not self.enabled:
            raise ValueError("warm_start needs the library: set memory.enabled = true")
        if self.warm_from and not self.warm_start:
            raise ValueError("warm_from is set but warm_start is false; set memory.warm_start = true")
        return self
