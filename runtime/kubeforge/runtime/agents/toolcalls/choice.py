"""``tool_choice`` and what a policy turn becomes for the agent or environment that offered tools.

Neighbours: the endpoint's ``request`` builds a :class:`Choice` from a body, its ``server`` and the episode runner
call :func:`reply` on the text of every sampled turn. The token ids are never touched: a reply is a view over the
text vLLM's ids decode to.

What each choice does (nothing constrains the sampling: a masked or forced decoding would change the distribution
the trainer's logprobs assume, docs/runtime.md, "Logprob convention"):

=============  ==================================================================================================
``none``       the tools are rendered (the prompt stays the episode's), the turn is not parsed: content only
``auto``       parsed: calls -> ``tool_calls`` (outcome ``tool_calls``), none -> content (``text``), markup that
               does not parse or names a function not offered -> the whole text as content (``malformed``)
``required``   as ``auto``, but a turn without calls is ``unmet`` (content; the model was asked, not forced)
a function     as ``required``, and a call of any other function makes the turn ``unmet`` (content)
=============  ==================================================================================================
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import Any

from kubeforge.runtime.agents.toolcalls import base

AUTO, NONE, REQUIRED, FUNCTION = "auto", "none", "required", "function"
TOOL_CALLS, TEXT, MALFORMED, UNMET = "tool_calls", "text", "malformed", "unmet"
OUTCOMES = (TOOL_CALLS, TEXT, MALFORMED, UNMET)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    mode: str = AUTO              # auto | none | required | function
    name: str | None = None       # the function, for mode "function"

    @property
    def parses(self) -> bool:
        return self.mode != NONE


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reply:
    """The assistant message a turn becomes: ``content`` (None when calls alone), ``calls``, the parse's
    ``outcome`` ("" when not parsed) and ``problem`` (why markup was malformed)."""

    content: str | None
    calls: tuple[base.ToolCall, ...] = ()
    outcome: str = ""
    problem: str = ""

    def message(self) -> dict[str, Any]:
        """OpenAI's assistant message (``tool_calls`` only when there are calls)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.calls:
            out["tool_calls"] = [c.openai() for c in self.calls]
        return out

    def finish_reason(self, sampled: str) -> str:
        """OpenAI's ``tool_calls`` when the turn called tools, else the sampler's own reason."""
        return TOOL_CALLS if self.calls else sampled


def reply(fmt: base.Format, text: str, *, offered: Collection[str], choice: Choice,
          new_id: Callable[[], str] | None = None) -> Reply:
    """What ``text`` (one sampled turn) becomes, given the offered function names and the choice."""
    if not choice.parses:
        return Reply(content=text)
    parsed = fmt.parse(text, new_id=new_id)
    if parsed.problem:
        return Reply(content=text, outcome=MALFORMED, problem=parsed.problem)
    unknown = sorted({c.name for c in parsed.calls} - set(offered))
    if unknown:
        return Reply(content=text, outcome=MALFORMED, problem=f"calls a function not offered: {', '.join(unknown)}")
    if not parsed.calls:
        return Reply(content=text, outcome=UNMET if choice.mode in (REQUIRED, FUNCTION) else TEXT)
    if choice.mode == FUNCTION and any(c.name != choice.name for c in parsed.calls):
        return Reply(content=text, outcome=UNMET)
    return Reply(content=parsed.content if parsed.content.strip() else None, calls=parsed.calls,
                 outcome=TOOL_CALLS)
