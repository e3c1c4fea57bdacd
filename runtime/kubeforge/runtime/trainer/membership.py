"""Trainer rank 0's elastic view of the generators: which take work, which joined, left, went silent or are starting.

```
 control inbox ──READY──────────▶ seen before: rejoin (new epoch, current policy, its work again)
                                  beyond the members: join, lowest index first (grow)
               ──ACK STOP───────▶ leave notice: shrink past every left generator at the top
               ──ACK READY !ok──▶ starting (engine loading): the step being collected is not stalled
               ──ACK SYNC───────▶ answered: alive (a silent one joins again); the push in flight hears of it
               ──ACK READY ok "alive"▶ a beat: heard (every message of a generator is)
 failed push ──▶ members silent; still silent after ``answer_within`` at the top: dropped (shrink)
 no beat for ``peer_silence`` ──▶ left out: its prompts to the live members, weight-sync epoch without it
```

Neighbours: ``trainer.loop`` owns one on rank 0, hands every control message here (:meth:`Membership.drain`) and
records each WORK it hands out (:meth:`Membership.handed`); ``trainer.pushes`` asks it to settle before a push
(``drain``, ``check_silent``) and reports a failed one (:meth:`Membership.push_failed`); the weight pusher re-forms
the weight-sync group (a new epoch) for every change of membership.

Invariants:
- Elastic generators: a READY from a generator seen before means it restarted. A new epoch forms, the current policy
  is pushed (the new generator gets it before any WORK it samples) and the work handed to that generator for steps
  not yet trained goes to it again; the buffer drops any duplicate. A push that fails (a generator died mid-sync)
  abandons the epoch and training goes on; the generator's return triggers the next push.
- Scale-down: a generator's leave notice (sent at its SIGTERM, even from inside a weight receive) marks it as left;
  the membership shrinks past every left generator at the top (StatefulSet ordinals go from the top), a new epoch
  forms over the rest, and the leavers' work is re-issued. If the notice is lost (SIGKILL before it went out), a
  failed push finds it: every member that does not answer that SYNC (ACK or NACK) within ``answer_within`` and is at
  the top is dropped the same way; one that answers later, or says READY, joins again.
- Heartbeats (docs/recovery.md): a member that beats (``generator.join.AliveBeats``) and then is silent for
  ``peer_silence`` seconds is *left out*, wherever its index: it stays a member (indexes stay contiguous) but takes
  no work and is not in the weight-sync group (the live members are renumbered in it: ``Sync.rank_base``); the
  current policy is pushed to the live members and its outstanding work goes to them at once. Its READY (a
  restart) brings it back like any restart. At least one member is never left out (with none alive, the step's
  stall timer and deadline rule). Silence is judged only over what was heard: a hand-off first hears every control
  message waiting (:meth:`Membership.hear_waiting`), as a push does before it stops waiting for an ACK, so a train
  step or a bounded send longer than ``peer_silence`` does not make the live generators look silent.
- At least one member stays; members are always the indexes ``0..members-1`` (StatefulSet ordinals are contiguous).
- A sharded (FSDP) model's push needs every rank's gathers: after a change of membership it waits for the next step
  boundary, and the work sent meanwhile is skipped by the generator and re-issued by the stall timer.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from kubeforge.runtime import transport, types, wire
from kubeforge.runtime.trainer import buffer, liveness


class Deadlines(Protocol):
    """The loop's settings this needs (``trainer.loop.Settings``)."""

    @property
    def answer_within(self) -> float: ...
    @property
    def start_deadline(self) -> float: ...
    @property
    def peer_silence(self) -> float: ...


class Versioned(Protocol):
    """The learner's position (``step.Trainer``)."""

    step: int
    policy_version: int


class Reformer(Protocol):
    def reform(self, *, members: int | None = None, left_out: frozenset[int] = frozenset()) -> int:
        """Abandon the current weight-sync epoch; the next push forms a new one over the members not ``left_out``.
        Returns the new epoch."""


class Unexpected(Protocol):
    def unexpected(self, *, kind: str) -> None: ...


class Membership:
    """Rank 0's generators (see the module docstring). ``push`` pushes the current policy (``Pushes.push``);
    ``send_work`` hands a WORK to generator ``g`` and ``work`` makes one (the loop's)."""

    def __init__(self, *, settings: Deadlines, generators: transport.Sender, control: transport.Receiver,
                 pusher: Reformer, learner: Versioned, rollouts: buffer.RolloutBuffer, observer: Unexpected,
                 generator_address: Callable[[int], str | None], push: Callable[..., object],
                 send_work: Callable[[int, wire.Work], None],
                 work: Callable[[int, Sequence[types.Prompt]], wire.Work]) -> None:
        self.s = settings
        self.generators = generators
        self.control = control                # READY/ACK from generators
        self.pusher = pusher
        self.learner = learner
        self.rollouts = rollouts              # its next step: work of earlier steps is not handed out again
        self.observer = observer
        self.generator_address = generator_address   # data address of generator i (None: cannot grow)
        self.push = push
        self.send_work = send_work
        self.work = work
        self.ready_seen: set[int] = set()     # generators that announced themselves
        self.members = generators.peers       # generators taking work now: indexes 0..members-1 (elastic)
        self.joining: set[int] = set()        # generators beyond ``members`` that said READY
        self.left: set[int] = set()           # generators whose leave notice came (until their READY)
        self.dropped: set[int] = set()        # generators dropped for silence after a failed push
        self.silent: set[int] = set()         # members yet to answer the SYNC of a failed push
        self.silent_version = 0
        self.silent_since = 0.0
        # control messages read ahead of their handling (a push read past them, a judgment of silence heard them
        # first), each with whether it went to the push in flight already (an ACK of its SYNC)
        self._deferred: list[tuple[wire.Message, bool]] = []
        self.starting: dict[int, float] = {}  # generator -> its first "starting" beat (until its READY)
        self.start_beat_at = 0.0              # the last "starting" beat within its start deadline
        if hasattr(pusher, "on_other"):
            pusher.on_other = self._read_by_push
        self.outstanding: dict[int, list[wire.Work]] = {}   # work handed to each generator
        self.epochs = 0                       # weight-sync re-formations
        self.out: set[int] = set()            # members left out for silence (no beat for peer_silence)
        self.liveness = liveness.Liveness(after=lambda: self.s.peer_silence)
        self.left_out_at: dict[int, float] = {}   # when each was left out (wall clock; the recovery figures)
        if hasattr(pusher, "gone"):           # a push stops waiting for the ACK of a generator gone silent
            pusher.gone = self.liveness.silent
        if hasattr(pusher, "send_within"):    # ... and for a SYNC notice no longer than the silence that leaves out
            pusher.send_within = lambda: min(30.0, self.s.peer_silence) if self.s.peer_silence > 0 else 30.0

    # ------------------------------------------------------------ what the loop tells it

    def ready(self, g: int) -> None:
        """Generator ``g`` said READY while the loop waited for every generator's first."""
        self.ready_seen.add(g)
        self.starting.pop(g, None)

    def handed(self, g: int, work: wire.Work) -> None:
        """``work`` went (or is going) to generator ``g``: it is re-issued if ``g`` leaves or restarts."""
        self.outstanding.setdefault(g, []).append(work)

    def undelivered(self, g: int) -> None:
        """A WORK could not reach generator ``g`` in time: it counts as silent (dropped at the top after
        ``answer_within``, its outstanding work re-issued)."""
        if not self.silent:
            self.silent_version, self.silent_since = self.learner.policy_version, time.monotonic()
        self.silent.add(g)

    def forget(self, *, trained: int) -> None:
        """Forget the work of steps up to ``trained`` (trained now)."""
        for g in list(self.outstanding):
            self.outstanding[g] = [w for w in self.outstanding[g] if w.step > trained]

    def push_failed(self, exc: BaseException) -> None:
        """A push failed (a generator died mid-sync): abandon the epoch; the members that do not answer its SYNC
        are silent from now."""
        self.epochs = self.pusher.reform(members=self.members, left_out=frozenset(self.out))
        if not self.silent:     # members still silent since an earlier failed push keep their clock
            self.silent = set(self.live()) - self.left
            self.silent_version, self.silent_since = self.learner.policy_version, time.monotonic()
        print(f"trainer-0: weight sync v{self.learner.policy_version} failed ({exc}); weight-sync epoch "
              f"{self.epochs} forms when the generators are back", flush=True)

    # ------------------------------------------------------------ control messages

    def _read_by_push(self, msg: wire.Message) -> None:
        """A control message a push read past: heard now (the push asks who is silent), handled at the next drain."""
        self.liveness.heard(msg)
        self._deferred.append((msg, False))

    def hear_waiting(self) -> None:
        """Every control message waiting is heard now and handled at the next drain (an ACK of the push in flight
        goes to it at once: the push joins before that drain). Silence is judged only after this: a generator
        whose beats waited unread (the trainer trained, or a send to a dead peer ran out its bound, for longer than
        the silence) is alive."""
        while (msg := self.control.recv(timeout=0)) is not None:
            self.liveness.heard(msg)
            handed = isinstance(msg, wire.Ack) and msg.role == "generator" and msg.of == wire.Kind.SYNC
            if handed:
                getattr(self.pusher, "acked", lambda m: None)(msg)
            self._deferred.append((msg, handed))

    def drain(self) -> None:
        """Every control message waiting (those read ahead first)."""
        while self._deferred:
            read, handed = self._deferred.pop(0)
            self.on_control(read, to_push=not handed)
        while (msg := self.control.recv(timeout=0)) is not None:
            self.on_control(msg)

    def on_control(self, msg: wire.Message, *, to_push: bool = True) -> None:
        """One control message; ``to_push``: an ACK of a SYNC also goes to the push in flight (False: it went)."""
        self.liveness.heard(msg)
        if isinstance(msg, wire.Ready) and msg.role == "generator":
            g = msg.index
            self.starting.pop(g, None)
            back = g in self.ready_seen or g in self.left or g in self.dropped or g in self.out
            self.left.discard(g)
            self.dropped.discard(g)
            self.out.discard(g)
            if back and 0 <= g < self.members:
                self._rejoin(g)
            elif g >= self.members:
                self.joining.add(g)
                self._grow()
            self.ready_seen.add(g)
        elif isinstance(msg, wire.Ack) and msg.role == "generator" and msg.of == wire.Kind.READY and not msg.ok:
            self.on_starting(msg.index)
        elif isinstance(msg, wire.Ack) and msg.role == "generator" and msg.of == wire.Kind.STOP:
            self._leave(msg.index)
        elif isinstance(msg, wire.Ack) and msg.role == "generator" and msg.of == wire.Kind.SYNC:
            self._answered(msg)
            if to_push:
                getattr(self.pusher, "acked", lambda m: None)(msg)   # an ACK of the push in flight
        elif not isinstance(msg, (wire.Ready, wire.Ack)):
            self.observer.unexpected(kind=type(msg).__name__)

    def on_starting(self, g: int) -> None:
        """Generator ``g`` is loading its engine. A member's (restarted in place) beat counts as progress of the step
        being collected, for at most ``start_deadline`` from its first beat (a start that never ends is a hang too);
        a joining generator's does not (no step waits for it)."""
        now = time.monotonic()
        if now - self.starting.setdefault(g, now) <= self.s.start_deadline and g < self.members:
            self.start_beat_at = now

    def _answered(self, ack: wire.Ack) -> None:
        """An answer (ACK or NACK) to a SYNC outside a push: the generator is alive. One dropped for silence joins
        again (it was slow, not gone)."""
        g = ack.index
        if ack.version >= self.silent_version:
            self.silent.discard(g)
        if g in self.dropped and g not in self.left and g >= self.members:
            self.dropped.discard(g)
            self.joining.add(g)
            self._grow()

    # ------------------------------------------------------------ changes of membership

    def _grow(self) -> None:
        """Generators that said READY beyond the membership join it, lowest index first (StatefulSet ordinals are
        contiguous): connect, new epoch over the larger group, current policy pushed before they get WORK."""
        grown = self.members
        while grown in self.joining:
            address = self.generator_address(grown)
            if address is None:
                break
            while self.generators.peers <= grown:
                self.generators.add_peer(address)
            self.joining.discard(grown)
            grown += 1
        if grown == self.members:
            return
        before, self.members = self.members, grown
        self.epochs = self.pusher.reform(members=self.members, left_out=frozenset(self.out))
        if not getattr(self.learner, "sharded", False):
            self.push(step=self.learner.step)
        print(f"trainer-0: generators {before} -> {self.members} (joined); weight-sync epoch {self.epochs}",
              flush=True)

    def _leave(self, g: int) -> None:
        """Generator ``g`` sent its leave notice. At the top of the membership it is a scale-down: shrink past it.
        Below the top it restarts (a pod replaced), and its READY re-forms the group."""
        self.ready_seen.discard(g)
        self.joining.discard(g)
        self.left.add(g)
        self._shrink(gone=self.left, why="left")

    def quiet(self, g: int) -> bool:
        """Generator ``g`` has been silent for the peer-silence deadline (it is left out at the next check), once
        what waits in the control inbox is heard."""
        self.hear_waiting()
        return bool(self.liveness.silent([g]))

    def live(self) -> list[int]:
        """The members taking work now: every member but those left out for silence (all of them when every one
        is: work then waits for whichever comes back)."""
        return [g for g in range(self.members) if g not in self.out] or list(range(self.members))

    def pushed(self) -> None:
        """A push reached every generator in the group: none of them is silent since an earlier failed push."""
        self.silent.clear()

    def silent_now(self) -> dict[int, float]:
        """The members silent for ``peer_silence`` now, each with the wall clock it was last heard: those left out
        and the one kept in when none answers (trainer 0 reports them to the operator, which may replace their
        pods: docs/recovery.md). A member that is starting or left is not silent."""
        judged = [g for g in range(self.members) if g not in self.left and g not in self.starting]
        return self.liveness.since(judged)

    def check_silent(self) -> None:
        """Members silent for ``peer_silence`` are left out (their beats stopped). After a failed push: top members
        that did not answer its SYNC within ``answer_within`` are gone (their leave notice, if any, was lost)."""
        self._check_beats()
        if self.silent and time.monotonic() - self.silent_since > self.s.answer_within:
            gone, self.silent = set(self.silent), set()
            self.dropped |= self._shrink(gone=gone, why=f"silent {self.s.answer_within:.0f}s after a failed sync")

    def _check_beats(self) -> None:
        """Leave out the members whose beats stopped (at least one stays in)."""
        judged = [g for g in self.live() if g not in self.left and g not in self.starting]
        silent = sorted(self.liveness.silent(judged))
        while silent and len(self.live()) - len(silent) < 1:
            silent.pop()                 # none alive: keep one in; the stall timer and the deadline rule
        if not silent:
            return
        quiet = {g: self.liveness.quiet_for(g) for g in silent}
        self.out |= set(silent)
        self.silent -= set(silent)
        now = time.time()
        self.left_out_at.update({g: now for g in silent})
        self.epochs = self.pusher.reform(members=self.members, left_out=frozenset(self.out))
        if not getattr(self.learner, "sharded", False):
            # the push in flight when it went silent failed for everyone: the live ones get the current policy
            # before its work, or they would skip work of a version beyond their lag
            self.push(step=self.learner.step)
        live = self.live()
        pending = [w for g in silent for w in self.outstanding.pop(g, []) if w.step >= self.rollouts.next_step]
        for i, w in enumerate(pending):
            self.send_work(live[i % len(live)], self.work(w.step, w.prompts))
        print(f"trainer-0: generator-{'/'.join(map(str, silent))} silent "
              f"{'/'.join(f'{q:.1f}' for q in quiet.values())}s (peerSilenceSeconds {self.s.peer_silence:g}): left "
              f"out; weight-sync epoch {self.epochs} over generators {live}, "
              f"{sum(len(w.prompts) for w in pending)} prompts re-routed", flush=True)

    def _shrink(self, *, gone: set[int], why: str) -> set[int]:
        """Drop the members at the top that are in ``gone`` (at least one stays): a smaller epoch, the current
        policy to the rest, and the leavers' outstanding work to them. Returns the dropped indexes."""
        top = self.members
        while top > 1 and (top - 1) in gone:
            top -= 1
        if top == self.members:
            return set()
        leavers = set(range(top, self.members))
        before, self.members = self.members, top
        self.silent -= leavers
        self.out -= leavers
        self.epochs = self.pusher.reform(members=self.members, left_out=frozenset(self.out))
        pending = [w for g in sorted(leavers) for w in self.outstanding.pop(g, [])
                   if w.step >= self.rollouts.next_step]
        if not getattr(self.learner, "sharded", False):
            self.push(step=self.learner.step)
        live = self.live() or [0]
        for i, w in enumerate(pending):
            self.send_work(live[i % len(live)], self.work(w.step, w.prompts))
        print(f"trainer-0: generators {before} -> {self.members} (generator-{'/'.join(map(str, sorted(leavers)))} "
              f"{why}); weight-sync epoch {self.epochs}, {sum(len(w.prompts) for w in pending)} prompts re-issued",
              flush=True)
        return leavers

    def _rejoin(self, g: int) -> None:
        """Generator ``g`` restarted: new weight-sync epoch, current policy to everyone, its work again."""
        self.epochs = self.pusher.reform(members=self.members, left_out=frozenset(self.out))
        if not getattr(self.learner, "sharded", False):
            # a sharded (FSDP) model's push needs every rank's gathers: it waits for the next step boundary, and
            # the work below is skipped by the generator until then and re-issued by the stall timer
            self.push(step=self.learner.step)
        pending = [w for w in self.outstanding.pop(g, []) if w.step >= self.rollouts.next_step]
        for w in pending:
            self.send_work(g, self.work(w.step, w.prompts))
        print(f"trainer-0: generator-{g} restarted: weight-sync epoch {self.epochs}, policy v"
              f"{self.learner.policy_version} pushed, {sum(len(w.prompts) for w in pending)} prompts re-issued",
              flush=True)

