"""Procedural copying: the prompt shows a short string, the answer is that string.

Neighbours: ``registry`` builds it from ``TaskSpec.copy``; the ``tiny`` model (character tokenizer, no chat
template) learns it with the ExactAnswer verifier, whose extraction takes the completion's first word (letters,
digits and the answer's own characters), so ``ab``, ``ab\\n...``, ``ab.`` and ``ab<eos>`` all answer ``ab``.

Format: ``copy: <s>`` -> ``<s>``, ``s`` of ``length`` characters drawn from ``alphabet``. No trailing newline: a random
model with tied embeddings leans towards repeating the last prompt token, so ending on the string makes the first
reward likelier. Measured on the random ``tiny`` model (length 1, alphabet abcd, 4 new tokens, temperature 1,
4096 samples): ExactAnswer hits 0.93% of samples with this format, 0.59% with ``copy: <s>\\n``. That is about 0.6
hits per step at 64 completions per step: sparse. ExactAnswer's partial-credit mode (``verifiers.exact``) adds
reward for a correct first character.

Invariant: item k depends only on (spec, seed, k).
"""
from __future__ import annotations

import dataclasses

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.tasks import base

PREFIX = "copy: "


@dataclasses.dataclass(frozen=True, kw_only=True)
class CopyStream:
    """``copy: abca`` -> ``abca``."""

    spec: rljob.CopyTask
    seed: int

    def prompt_at(self, k: int) -> types.Prompt:
        rng = base.rng_for(self.seed, k, "copy")
        s = "".join(rng.choice(self.spec.alphabet) for _ in range(self.spec.length))
        return types.Prompt(index=k, text=f"{PREFIX}{s}", answer=s)
