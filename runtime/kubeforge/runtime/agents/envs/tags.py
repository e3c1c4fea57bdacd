"""The tool-call tag protocol of the built-in environments (docs/agents.md, "Tool calls").

SmolLM2's chat template (and the tiny model's plain text) has no native tool-call format, so tools use tags any
model can learn: the policy writes ``<tool>EXPRESSION</tool>`` (its turn stops at ``</tool>``: ``STOP``) and the
environment answers ``<result>VALUE</result>`` (or ``<error>WHY</error>``) as the next user turn. A turn without a
tool call is the policy's final answer.
"""
from __future__ import annotations

import re

OPEN, CLOSE = "<tool>", "</tool>"
STOP = (CLOSE,)
_CALL = re.compile(r"<tool>(.*?)</tool>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def tool_call(text: str) -> str | None:
    """The first tool call's argument in a policy turn, or None."""
    m = _CALL.search(text)
    return m.group(1).strip() if m else None


def result(value: str) -> str:
    return f"<result>{value}</result>"


def error(why: str) -> str:
    return f"<error>{why}</error>"


def last_number(text: str) -> str | None:
    """The last number in ``text`` (a final answer), or None."""
    found = _NUMBER.findall(text.replace(",", ""))
    return found[-1] if found else None
