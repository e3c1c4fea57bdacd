"""RewardModel: a Hugging Face sequence classifier from a folder scores (prompt, completion) pairs.

Neighbours: ``registry`` builds it for ``type: RewardModel`` (importing torch only then). One label: the score is
``sigmoid(logit)``; several labels: the softmax probability of the last label (``1`` = good, by convention). The
group is scored in batches of ``batchSize``, prompt and completion as a text pair truncated to ``maxLength``
tokens, on CPU (a reward model that needs a GPU belongs in its own role; future work).
"""
from __future__ import annotations

import pathlib
from typing import Sequence

import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import types


class RewardModel:
    def __init__(self, settings: rljob.RewardModelVerifier, *, field: str = "rewardModel.path") -> None:
        path = pathlib.Path(settings.path)
        if not (path / "config.json").is_file():
            raise ValueError(f"{field}: {path} is not a Hugging Face model folder (no config.json)")
        self.settings = settings
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.model = transformers.AutoModelForSequenceClassification.from_pretrained(path).eval()
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id

    @torch.inference_mode()
    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        out: list[float] = []
        bs = self.settings.batch_size
        for i in range(0, len(completions), bs):
            batch = list(completions[i:i + bs])
            enc = self.tokenizer([prompt.text] * len(batch), batch, truncation=True,
                                 max_length=self.settings.max_length, padding=True, return_tensors="pt")
            logits = self.model(**enc).logits.float()
            probs = torch.sigmoid(logits[:, 0]) if logits.shape[-1] == 1 else torch.softmax(logits, -1)[:, -1]
            out.extend(float(p) for p in probs)
        return out
