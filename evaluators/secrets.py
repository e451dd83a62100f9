"""Per-run secret randomness: every random stream a score depends on derives from here.

A candidate must not be able to regenerate the data it is scored on. A seed that is
public (a default such as 0, or one written in a config) lets a program rebuild the
demand, the instance or the episode inside its own process and answer with
foresight. So a run draws its secrets from the operating system when it is created,
keeps them in its archive (on the trusted side, out of every sandbox's reach) and
hands them to its evaluators; each domain derives its streams from them with
`sequence`/`generator`/`seed`, keyed by what the stream is for. Within a run the
same key gives the same stream, so every candidate meets the same data (common
random numbers).

Each split has its own secret: knowing the search split's streams (say, from a
leaked log) tells nothing about the validation or held-out ones.

`RunSecrets.fixed(seed)` derives all three from a number the user chose, for
reproducible experiments and tests; such a run says that its scores can be
replayed by anyone who knows that number.
"""
from __future__ import annotations

import hashlib
import secrets as _os_secrets
from dataclasses import dataclass

import numpy as np

SECRET_SPLITS = ("search", "validation", "heldout")


def _word(part) -> int:
    """A stable non-negative integer for one part of a stream's key."""
    if isinstance(part, (bool, np.bool_)):
        return int(part)
    if isinstance(part, (int, np.integer)) and part >= 0:
        return int(part)
    digest = hashlib.sha256(repr(part).encode() if not isinstance(part, str) else part.encode()).digest()
    return int.from_bytes(digest[:8], "little")


@dataclass(frozen=True)
class RunSecrets:
    """The three secrets of one run (128-bit integers) and whether they were chosen by the user."""

    search: int
    validation: int
    heldout: int
    replayable: bool = False

    @classmethod
    def draw(cls) -> "RunSecrets":
        """Fresh secrets from the operating system's random source."""
        return cls(*(_os_secrets.randbits(128) for _ in SECRET_SPLITS))

    @classmethod
    def fixed(cls, seed: int) -> "RunSecrets":
        """Secrets derived from `seed`: reproducible, and therefore known to whoever knows `seed`."""
        words = np.random.SeedSequence(int(seed)).generate_state(3 * 4, dtype=np.uint32)
        values = [int.from_bytes(words[4 * i:4 * i + 4].tobytes(), "little") for i in range(3)]
        return cls(*values, replayable=True)

    def sequence(self, split: str, *key) -> np.random.SeedSequence:
        """The seed sequence of the stream named `key` on `split`."""
        if split not in SECRET_SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SECRET_SPLITS}")
        return np.random.SeedSequence(getattr(self, split), spawn_key=tuple(_word(k) for k in key))

    def generator(self, split: str, *key) -> np.random.Generator:
        return np.random.default_rng(self.sequence(split, *key))

    def seed(self, split: str, *key, bits: int = 31) -> int:
        """An integer seed below 2**bits, for libraries that take one (gymnasium, SCIP, optuna)."""
        words = self.sequence(split, *key).generate_state(max(2, -(-bits // 32)), dtype=np.uint32)
        return int.from_bytes(words.tobytes(), "little") % (1 << bits)

    def to_record(self) -> dict:
        """For the archive: the secrets as decimal strings (they exceed 64 bits)."""
        return {"search": str(self.search), "validation": str(self.validation),
                "heldout": str(self.heldout), "replayable": self.replayable}

    @classmethod
    def from_record(cls, record: dict) -> "RunSecrets":
        return cls(int(record["search"]), int(record["validation"]), int(record["heldout"]),
                   bool(record.get("replayable", False)))

    def __repr__(self) -> str:  # never print the secrets themselves into a log
        return f"RunSecrets(replayable={self.replayable})"


def replay_note(replay_seed: int | None) -> str | None:
    """What a run with a fixed replay seed must say plainly (None for drawn secrets)."""
    if replay_seed is None:
        return None
    return (f"Replayable run: its secrets derive from run.replay_seed = {replay_seed}, so anyone who knows that "
            "number can regenerate every demand, instance, episode seed and market it was scored on, and a "
            "program could be written to fit them. Its scores are reproducible, not protected.")
