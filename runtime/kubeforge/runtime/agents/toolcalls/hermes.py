"""The Hermes / Qwen2.5 family's tool calls: one ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
block per call, written by templates that render ``tools`` themselves (Qwen2.5, Qwen3, Hermes 2 Pro and 3): their
own template is used as it is; results come back as ``tool`` messages the template wraps (``<tool_response>``).

A template is of this family when it renders ``tools`` and names the ``<tool_call>`` tag.
"""
from __future__ import annotations

from collections.abc import Callable

from kubeforge.runtime.agents.toolcalls import base, tagged

FAMILY = "hermes"


class Hermes:
    family: str = FAMILY
    stop: tuple[str, ...] = (tagged.CLOSE,)
    opens: tuple[str, ...] = (tagged.OPEN,)

    def supports(self, template: str) -> bool:
        return tagged.OPEN in template and "tools" in template

    def template(self, own: str) -> str | None:
        return None

    def parse(self, text: str, *, new_id: Callable[[], str] | None = None) -> base.Parsed:
        return tagged.parse(text, new_id=new_id)


FORMAT = Hermes()
