"""Model family -> tool-call format, and the family of a chat template.

Neighbours: the endpoint's ``chat.ChatTemplate`` and the episode runner ask :func:`for_template` with the model's
own chat template; the API (``spec.environment.toolFormat``) refuses Native for the built-in models that have
none. Order matters: SmolLM2's shipped template is ChatML, which a looser rule could also take; it is asked first.
"""
from __future__ import annotations

from typing import Any

from kubeforge.runtime.agents.toolcalls import base, hermes, smollm2

FORMATS: dict[str, base.Format] = {smollm2.FAMILY: smollm2.FORMAT, hermes.FAMILY: hermes.FORMAT}


def for_template(template: str | None) -> base.Format | None:
    """The format a model with this chat template writes; None when no known family's (or no template)."""
    if not template:
        return None
    return next((f for f in FORMATS.values() if f.supports(template)), None)


def for_tokenizer(tokenizer: Any) -> base.Format | None:
    own = getattr(tokenizer, "chat_template", None)
    return for_template(own if isinstance(own, str) else None)


def families() -> str:
    """The known families, for error messages."""
    return ", ".join(FORMATS)
