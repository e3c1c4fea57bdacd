"""Procedural copying: the prompt shows a short string, the answer is that string.

Neighbours: ``registry`` builds it from ``TaskSpec.copy``; the ``tiny`` model (character tokenizer, no chat
template) learns it with the ExactAnswer verifier, whose extraction takes the first word of the completion, so
``"ab"``, ``"ab\\n..."``, ``"ab."`` and ``"ab<eos>"`` all count. ExactAnswer's partial-credit mode (see
``verifiers.exact``) rewards a correct prefix too, which makes the first reward reachable by a random model.

Format: ``copy: <s>\\n`` -> ``<s>``, with ``s`` of ``length`` characters drawn from ``alphabet``.
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
    """``copy: abca\\n`` -> ``abca``."""

    spec: rljob.CopyTask
    seed: int

    def prompt_at(self, k: int) -> types.Prompt:
        rng = base.rng_for(self.seed, k, "copy")
        s = "".join(rng.choice(self.spec.alphabet) for _ in range(self.spec.length))
        return types.Prompt(index=k, text=f"{PREFIX}{s}\n", answer=s)
