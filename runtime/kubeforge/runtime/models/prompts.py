"""Prompt encoding: the token ids a policy sees for a task prompt, shared by sampling and evaluation.

Role: the one place that decides how a prompt's text becomes token ids (the tokenizer's chat template, when asked
and present, with the generation prompt appended; otherwise the plain encoding with special tokens), so the
generator samples and the trainer's held-out evaluation scores exactly the same inputs.
"""
from __future__ import annotations

from typing import Any


def encode(tokenizer: Any, text: str, *, chat_template: bool) -> list[int]:
    """Token ids of ``text`` as a user turn (chat template) or as plain text."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        ids: Any = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # a BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return [int(x) for x in ids]
    return [int(x) for x in tokenizer.encode(text, add_special_tokens=True)]
