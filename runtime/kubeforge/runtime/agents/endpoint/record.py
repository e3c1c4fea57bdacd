"""What the endpoint records per episode: branches of calls, each call's exact prompt ids, sampled ids, logprobs.

Neighbours: ``endpoint`` appends one :class:`Call` per answered ``/v1/chat/completions`` request; the episode's
owner (the ``Verifiers`` adapter, an agent test) takes the :class:`Recording` when it closes the episode and hands
it to an episode record with :meth:`Branch.replay` (the generator's ``agents.episode.Episode``, or anything with its
two append methods: :class:`EpisodeSink`).

Invariants (checked by :meth:`Branch.append`):
- Within a branch, every call after the first extends the one before: its prompt ids are the previous prompt ids +
  the previous sampled ids + its own ``delta_ids``. So the branch is one token sequence, ``prompt_ids`` then the
  calls' (sampled, delta) turns in order, and replaying it gives policy spans that cover exactly the sampled ids.
- A call that does not extend (``chat.Plan.reason``) opens a new branch; the old one is kept whole.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Protocol

from kubeforge.runtime.agents.endpoint import chat


class EpisodeSink(Protocol):
    """The two append methods of the episode record (docs/agents.md): a policy turn with its behaviour logprobs,
    an environment turn (logprob 0.0, masked out of the loss)."""

    def add_policy_turn(self, token_ids: Any, logprobs: Any, text: str) -> None: ...

    def add_environment_turn(self, token_ids: Any, text: str) -> None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Call:
    """One answered call: the prompt vLLM was given, the ids and logprobs it sampled, their text (cut at a stop
    string) and, when the text held tool calls, the assistant message returned instead of it (``reply``)."""

    prompt_ids: tuple[int, ...]
    delta_ids: tuple[int, ...]        # empty for a branch's first call
    delta_text: str
    sampled_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    content: str
    finish_reason: str
    reason: str                       # chat.EXTENDS,, or why a branch started
    reply: dict[str, Any] | None = None   # OpenAI's assistant message with tool_calls, when the text held calls
    tool_outcome: str = ""            # the tool-call parse's outcome (toolcalls.choice.OUTCOMES; "": not parsed)

    def message(self) -> dict[str, Any]:
        """The assistant message the endpoint returned."""
        return self.reply or {"role": "assistant", "content": self.content}


@dataclasses.dataclass(kw_only=True)
class Branch:
    """A run of calls that extend one another: one token sequence."""

    calls: list[Call] = dataclasses.field(default_factory=list)
    last: chat.Turn | None = None

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """The branch's first prompt: what a GRPO group's ``prompt_token_ids`` are."""
        return self.calls[0].prompt_ids if self.calls else ()

    @property
    def reason(self) -> str:
        return self.calls[0].reason if self.calls else ""

    def append(self, call: Call, messages: tuple[dict[str, Any], ...]) -> None:
        if self.calls:
            prev = self.calls[-1]
            expected = prev.prompt_ids + prev.sampled_ids + call.delta_ids
            if call.prompt_ids != expected:
                raise ValueError("a call that does not extend its branch's token sequence")
        if len(call.sampled_ids) != len(call.logprobs):
            raise ValueError(f"{len(call.sampled_ids)} sampled ids with {len(call.logprobs)} logprobs")
        self.calls.append(call)
        self.last = chat.Turn(messages=messages, prompt_ids=call.prompt_ids, sampled_ids=call.sampled_ids,
                              content=call.content, reply=chat.normalise(call.reply) if call.reply else None)

    def token_ids(self) -> tuple[int, ...]:
        """Every token after the first prompt, as the trainer will see it."""
        out: tuple[int, ...] = ()
        for call in self.calls:
            out += call.delta_ids + call.sampled_ids
        return out

    def policy_spans(self) -> tuple[tuple[int, int], ...]:
        spans, pos = [], 0
        for call in self.calls:
            pos += len(call.delta_ids)
            if call.sampled_ids:
                spans.append((pos, pos + len(call.sampled_ids)))
            pos += len(call.sampled_ids)
        return tuple(spans)

    def replay(self, sink: EpisodeSink) -> None:
        """Fill an episode record: per call, its delta as an environment turn, then its sample as a policy turn."""
        for call in self.calls:
            if call.delta_ids:
                sink.add_environment_turn(call.delta_ids, call.delta_text)
            sink.add_policy_turn(call.sampled_ids, call.logprobs, call.content)


@dataclasses.dataclass(kw_only=True)
class Recording:
    """Everything one episode's calls left, in order. ``final`` is the branch the trainer gets by default (the
    last: the conversation the agent ended with); earlier branches stay readable (docs/agents-endpoint.md)."""

    episode_id: str
    branches: list[Branch] = dataclasses.field(default_factory=list)
    refused: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)   # by error code
    # streamed calls whose client left before the end: what vLLM sampled for them (finish_reason "cancelled" when
    # the engine was stopped early). In no branch: the agent never received them whole, so nothing extends them.
    disconnected: list[Call] = dataclasses.field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(len(b.calls) for b in self.branches)

    @property
    def final(self) -> Branch | None:
        return self.branches[-1] if self.branches else None

    def previous(self) -> chat.Turn | None:
        return self.branches[-1].last if self.branches else None

    def add(self, call: Call, messages: tuple[dict[str, Any], ...]) -> None:
        if call.reason != chat.EXTENDS or not self.branches:
            self.branches.append(Branch())
        self.branches[-1].append(call, messages)
