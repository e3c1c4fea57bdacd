"""Chat rendering for episodes: the first prompt's ids, then only the new messages' delta ids.

The previous tokens are never re-tokenised: an environment turn is rendered as the text the chat template puts
after the assistant's turn (its end-of-turn marker when the policy's tokens did not already end with the EOS
token, the new messages, the next assistant header) and only that text is tokenised and appended. Without a chat
template (the tiny model) the messages are plain lines. With native tool calls (``native``) every rendering gets
the tools and the format's template (``template``: None, the model's own).
"""
from __future__ import annotations

from typing import Any

SENTINEL = "\x00kubeforge-turn\x00"


def has_template(tokenizer: Any, chat_template: bool) -> bool:
    return bool(chat_template and getattr(tokenizer, "chat_template", None))


def _extra(tools: list[dict[str, Any]] | None, template: str | None) -> dict[str, Any]:
    return {**({"tools": tools} if tools else {}), **({"chat_template": template} if template else {})}


def start_ids(tokenizer: Any, messages: list[dict[str, Any]], *, chat_template: bool,
              tools: list[dict[str, Any]] | None = None, template: str | None = None) -> list[int]:
    """The episode's first prompt: the messages with the generation prompt (or their contents, one per line)."""
    if has_template(tokenizer, chat_template):
        ids: Any = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 **_extra(tools, template))
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(x) for x in ids]
    text = "\n".join(m["content"] for m in messages)
    return [int(x) for x in tokenizer.encode(text, add_special_tokens=True)]


def delta(tokenizer: Any, start: list[dict[str, Any]], observation: list[dict[str, Any]], *, ended_with_eos: bool,
          chat_template: bool, tools: list[dict[str, Any]] | None = None,
          template: str | None = None) -> tuple[list[int], str]:
    """(ids, text) to append after a policy turn for ``observation`` (``ended_with_eos``: the turn's last sampled
    token was the EOS token, so the template's end-of-turn marker is there already)."""
    if has_template(tokenizer, chat_template):
        convo = [*start, {"role": "assistant", "content": SENTINEL}, *observation]
        full = tokenizer.apply_chat_template(convo, add_generation_prompt=True, tokenize=False,
                                             **_extra(tools, template))
        text = str(full)[str(full).index(SENTINEL) + len(SENTINEL):]
        eos = getattr(tokenizer, "eos_token", None) or ""
        if ended_with_eos and eos and text.startswith(eos):
            text = text[len(eos):]
    else:
        text = "\n" + "\n".join(m["content"] for m in observation) + "\n"
    return [int(x) for x in tokenizer.encode(text, add_special_tokens=False)], text
