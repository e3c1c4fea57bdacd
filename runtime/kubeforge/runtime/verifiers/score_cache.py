"""The score cache: a bounded LRU of (verifier name, completion key) -> score.

Neighbours: ``score.Scorer`` looks every (verifier, completion) up before calling a verifier and stores fresh
scores; ``key`` hashes (prompt text, reference answer, completion text) once per completion, shared by every
verifier. Invariant: a cached score is exactly what the verifier returned for that key (fallbacks are never cached).
"""
from __future__ import annotations

import collections
import hashlib

from kubeforge.runtime import types


def key(prompt: types.Prompt, text: str) -> bytes:
    """A 16-byte digest of (prompt text, reference answer, completion), length-prefixed so parts cannot blur."""
    h = hashlib.blake2b(digest_size=16)
    for part in (prompt.text, prompt.answer, text):
        b = part.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.digest()


class ScoreCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self.hits = 0
        self.misses = 0
        self._data: collections.OrderedDict[tuple[str, bytes], float] = collections.OrderedDict()

    def get(self, name: str, k: bytes) -> float | None:
        s = self._data.get((name, k))
        if s is None:
            self.misses += 1
            return None
        self._data.move_to_end((name, k))
        self.hits += 1
        return s

    def put(self, name: str, k: bytes, score: float) -> None:
        if self.size <= 0:
            return
        self._data[(name, k)] = score
        if len(self._data) > self.size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)
