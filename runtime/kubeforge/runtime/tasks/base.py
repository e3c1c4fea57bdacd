"""The prompt-stream Protocol and the deterministic per-item random source every stream draws from.

Neighbours: ``arithmetic``, ``copy``, ``jsonl`` implement ``PromptStream``; ``registry`` picks one per TaskSpec.
Invariant: ``rng_for(seed, k, salt)`` depends on nothing but its arguments (no hash randomisation, no global RNG).
"""
from __future__ import annotations

import hashlib
import random
from typing import Protocol

from kubeforge.runtime import types


class TaskError(ValueError):
    """A task spec or its data cannot produce prompts; the message names the field (and file/line)."""


class PromptStream(Protocol):
    """An infinite, indexable stream of prompts."""

    def prompt_at(self, k: int) -> types.Prompt:
        """Prompt number ``k`` (k >= 0); a pure function of the stream's spec, seed and k."""


def rng_for(seed: int, k: int, salt: str) -> random.Random:
    """A random source for item ``k`` of a stream: a pure function of (seed, k, salt)."""
    if k < 0:
        raise TaskError(f"prompt index must be >= 0, got {k}")
    digest = hashlib.blake2b(f"{salt}\x00{seed}\x00{k}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))
