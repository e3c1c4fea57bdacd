"""Work out to the generators: rank 0's issue window, and any rank's prompts sent again, round robin.

Role: ``trainer.loop.Loop`` owns one on every rank. Rank 0 hands out each step's prompts, split over the
generators taking work, up to ``ahead`` steps early (:meth:`Dispatch.issue_window`); any rank sends a single prompt
straight to the next generator (:meth:`Dispatch.to_next`: its missing prompts after ``reissue_after``, the buffer's
dropped-but-needed ones, dynamic sampling's refills), never through rank 0. Neighbours: ``trainer.membership`` (rank
0's elastic generators: who takes work, what each holds) records every hand-off and may send work again itself.

Invariants:
- The prompts of step s are ``[s*P, (s+1)*P)`` (:func:`prompt_indices`): a pure function of the task and seed.
- Work goes to the live generators only (rank 0 leaves out a member silent for ``peer_silence``).
- No hand-off waits past ``min(deadline, answer_within, peer_silence)``: a generator gone without a word must not
  hold the trainer. Rank 0 then counts it as silent (dropped at the top after ``answer_within``, its outstanding work
  re-issued); for any rank the stall timer re-issues what did not go out.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from kubeforge.runtime import transport, types, wire


class Knobs(Protocol):
    """The loop's settings this needs (``trainer.loop.Settings``)."""

    @property
    def rank(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def prompts_per_step(self) -> int: ...
    @property
    def deadline(self) -> float: ...
    @property
    def answer_within(self) -> float: ...
    @property
    def peer_silence(self) -> float: ...


class Versioned(Protocol):
    policy_version: int


class Taking(Protocol):
    """Rank 0's membership (``trainer.membership.Membership``), as far as hand-offs go."""

    members: int

    def live(self) -> list[int]: ...
    def quiet(self, g: int) -> bool: ...
    def handed(self, g: int, work: wire.Work) -> None: ...
    def undelivered(self, g: int) -> None: ...


def prompt_indices(*, step: int, prompts_per_step: int) -> range:
    return range(step * prompts_per_step, (step + 1) * prompts_per_step)


def split(items: Sequence[types.Prompt], parts: int) -> list[list[types.Prompt]]:
    """Contiguous, nearly equal chunks (some empty when there are fewer items than parts)."""
    n = len(items)
    return [list(items[i * n // parts:(i + 1) * n // parts]) for i in range(parts)]


class Dispatch:
    """This rank's hand-offs (see the module docstring); ``settings`` is read at each use (the loop's may change)."""

    def __init__(self, *, settings: Callable[[], Knobs], generators: transport.Sender,
                 prompt_at: Callable[[int], types.Prompt], learner: Versioned) -> None:
        self.settings = settings
        self.generators = generators
        self.prompt_at = prompt_at
        self.learner = learner
        self.membership: Taking | None = None     # rank 0: set by the loop once it has one
        self.issued = 0                   # rank 0: next step whose work has not been handed out
        self._next_generator = settings().rank

    @property
    def members(self) -> int:
        """Generators taking work now (indexes ``0..members-1``): elastic on rank 0, every generator elsewhere."""
        return self.membership.members if self.membership is not None else self.generators.peers

    def live(self) -> list[int]:
        """The generators taking work now: rank 0's live members (those silent too long are left out), every
        generator elsewhere (other ranks do not hear the beats)."""
        return self.membership.live() if self.membership is not None else list(range(self.generators.peers))

    def issue_window(self, *, current: int, ahead: int) -> None:
        """Rank 0: every step up to ``current + ahead`` (and the last step) has its work out."""
        s = self.settings()
        last = min(current + ahead, s.steps - 1)
        while self.issued <= last:
            step = self.issued
            prompts = [self.prompt_at(k) for k in prompt_indices(step=step, prompts_per_step=s.prompts_per_step)]
            live = self.live()
            for g, chunk in zip(live, split(prompts, len(live))):
                if chunk:
                    self.send(g, self.work(step, chunk))
            self.issued += 1

    def to_next(self, step: int, prompt: types.Prompt) -> None:
        """One prompt of ``step`` to the next generator, round robin."""
        live = self.live()
        k = self._next_generator % len(live)
        self._next_generator = k + 1
        self.send(live[k], self.work(step, [prompt]))

    def send(self, g: int, work: wire.Work) -> None:
        """Hand ``work`` to generator ``g``, bounded (the module's invariants)."""
        s = self.settings()
        if self.membership is not None:
            self.membership.handed(g, work)
            if self.membership.quiet(g):    # silent too long: no send to wait out; re-routed when it is left out
                self.membership.undelivered(g)
                return
        try:
            self.generators.send(work, to=g, timeout=self.send_timeout(s))
        except transport.TransportError as exc:
            print(f"trainer-{s.rank}: work of step {work.step} not delivered to generator-{g} ({exc})", flush=True)
            if self.membership is not None:
                self.membership.undelivered(g)

    @staticmethod
    def send_timeout(s: Knobs) -> float:
        """A hand-off's bound: the progress deadline, ``answer_within`` and, when beats are judged, the peer-silence
        deadline (a generator that cannot take a frame for that long is left out anyway)."""
        silence = s.peer_silence if s.peer_silence > 0 else s.answer_within
        return min(s.deadline, s.answer_within, silence)

    def work(self, step: int, prompts: Sequence[types.Prompt]) -> wire.Work:
        return wire.Work(step=step, policy_version=self.learner.policy_version, prompts=tuple(prompts))
