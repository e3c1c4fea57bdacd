"""ExactAnswer: 1 when the completion's extracted final answer equals the reference (normalised), else 0.

Neighbours: ``extract`` (extraction and normalisation rules); ``registry`` builds it for ``type: ExactAnswer``.
Partial credit (constructor option, off by default): a completion whose answer is not exact but starts with a
correct prefix of the reference scores ``0.5 * prefix / len(reference)``; it gives a random model (the ``tiny``
copy job) a reachable first reward. Numeric references never get partial credit.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from kubeforge.runtime import types
from kubeforge.runtime.verifiers import extract


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExactAnswer:
    partial_credit: bool = False

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        ref_num = extract.number(prompt.answer)
        if ref_num is not None:
            return [1.0 if extract.last_number(extract.region(c)) == ref_num else 0.0 for c in completions]
        ref = extract.normalise(prompt.answer)
        return [self._text_score(extract.text_answer(c, reference=ref), ref) for c in completions]

    def _text_score(self, got: str, ref: str) -> float:
        if got == ref:
            return 1.0
        if not self.partial_credit or not ref:
            return 0.0
        n = 0
        while n < min(len(got), len(ref)) and got[n] == ref[n]:
            n += 1
        return 0.5 * n / len(ref)
