"""Limits and required protections for the sandbox that runs candidate programs."""
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# What the sandbox can report as in force for a candidate's process (see `_isolate`).
Protection = Literal["no-network", "private-filesystem", "own-ipc", "own-pids", "no-capabilities",
                     "seccomp", "rlimits", "unprivileged-uid"]


class SandboxConfig(BaseModel):
    """Resource limits for one candidate's process (one evaluation), and what must hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    wall_s: float = Field(120.0, gt=0, description="Wall-clock limit for one whole evaluation; the process group is killed past it.")
    startup_s: float = Field(20.0, gt=0, description="Time allowed to start the process and load the program.")
    cpu_s: int = Field(300, gt=0, description="CPU-time limit (RLIMIT_CPU) of the candidate process.")
    memory_mb: int = Field(2048, ge=256, description="Address-space limit (RLIMIT_AS) in MiB.")
    file_mb: int = Field(8, ge=1, description="Largest file the candidate may write (RLIMIT_FSIZE), its output included, in MiB.")
    scratch_mb: int = Field(32, ge=1, description="Size of the private scratch tmpfs (/tmp, and /dev/shm apart) in MiB.")
    processes: int = Field(16, ge=1, description="Process-count limit (RLIMIT_NPROC) inside the candidate's own user namespace.")
    require: tuple[Protection, ...] = Field(
        ("no-network", "private-filesystem"),
        description="Protections that must hold: a run refuses to start where one cannot, and a candidate is never "
                    "run without them. Known: no-network, private-filesystem, own-ipc, own-pids, no-capabilities, "
                    "seccomp, rlimits, unprivileged-uid (root only).")
