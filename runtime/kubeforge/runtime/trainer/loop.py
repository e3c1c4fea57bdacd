"""The trainer role's loop (every rank), with the data cursor and the weight push on rank 0.

```
 resume from the newest complete checkpoint → step s0, policy version v = s0 (all ranks, rank 0 broadcasts)
 rank 0: wait for READY from every generator; if v > 0 push weights v (generators start from the base model)
 for s in s0 .. steps-1:
   rank 0: issue WORK for steps up to s + ahead, ahead = maxPolicyLag - (weightSync.everySteps - 1)
   collect my share of step s: SCORED → buffer (stale/duplicate/late dropped and counted)
       dropped-but-needed prompts → re-issued by this rank straight to a generator (round robin)
   train_step(my groups) ── all-reduce ──▶ v = s + 1
   rank 0: push weights v every weightSync.everySteps (SYNC notice, then the broadcast; generators ACK);
           the other ranks follow the push (sharded weights are gathered by every rank). Unsharded, the push
           overlaps the next step: SYNC + snapshot now, broadcast in the background, joined at the next push
   rank 0: report the step (JSONL locally, pod annotation on a cluster)
   checkpoint every checkpoint.everySteps and after the last step (with the data cursor)
 every rank: export the policy as an HF folder next to the checkpoints (rank 0 writes); also after any step on
   request (trainer/export_requests.py: rank 0 sees it, every rank agrees, the step's record names the folder)
 rank 0: STOP every generator, report done
```

Neighbours: ``trainer.step.Trainer`` (learner, checkpoints), ``trainer.buffer.RolloutBuffer`` (staleness),
``tasks`` (``prompt_at(k)``, injected), ``trainer.report`` (Reporter), the weight pusher (``trainer.pusher``), the
transport (inbox and a sender to every generator; rank 0 also a control inbox for READY/ACK).

Invariants:
- The cursor is the step: prompts of step s are ``[s*P, (s+1)*P)``, a pure function of the task and seed. A
  checkpoint after step s stores cursor s+1, so a restarted job re-issues exactly the untrained steps.
- Rank r trains on prompts with ``index % trainers == r``; every rank calls ``train_step`` once per step.
- Outstanding work never exceeds ``ahead + 1`` steps: the only queue growth is bounded by it.
- ``spec.schedule.mode: Colocated`` sets ``ahead = 0``: step s's work goes out only after step s-1 is trained and
  pushed, so the generators sample while the trainer waits and sit idle while it trains (the phases take turns on
  the same cores instead of fighting for them); every other mode overlaps them.
- A generator's weights are at most ``everySteps - 1`` versions behind the trainer's when it samples, and work is
  issued ``ahead`` steps early, so a group's lag at training is at most ``ahead + everySteps - 1 = maxPolicyLag``:
  in a healthy run nothing is stale (``kubeforge.api.validate`` refuses ``maxPolicyLag < everySteps - 1``).
- Re-issues go from the rank that needs them straight to a generator, never through rank 0, so no rank ever
  waits inside a collective for a message another rank has yet to forward.
- No wait is unbounded (``Settings.deadline`` = ``spec.failurePolicy.progressDeadlineSeconds``): a step whose
  groups stop arriving for ``reissue_after`` has its missing prompts re-issued (a frame lost with a dead
  verifier or generator); no progress for ``deadline`` raises :class:`Stalled` (the process exits non-zero and
  the failure policy restarts it). A start is not a hang: waiting for the generators' READY is bounded by
  ``start_deadline`` (their vLLM engines load), and while a generator tells rank 0 it is starting (restarted in
  place: an ACK of READY with ``ok=False`` every few seconds while its engine loads) the step's stall clock starts
  again at each such beat, for at most ``start_deadline`` from that generator's first beat.
- SIGTERM (``should_stop``) ends the loop only at a safe point: while collecting, or after a step whose checkpoint
  (if due) is complete; a checkpoint write in progress always finishes (the write itself is atomic: temp folder,
  fsync, rename, COMPLETE marker), so a pod deleted mid-write leaves the new checkpoint or the previous one.
- Elastic generators (rank 0): a READY from a generator seen before means it restarted. Rank 0 then re-forms the
  weight-sync group (a new epoch, ``WeightPusher.reform``), pushes the current policy (the new generator gets it
  before any WORK it samples) and re-issues the work it had handed that generator for steps not yet trained;
  the buffer drops any duplicate. A push that fails (a generator died mid-sync) abandons the epoch and training
  goes on; the generator's return triggers the next push.
- Scale-down (rank 0): a generator's leave notice (sent at its SIGTERM, even from inside a weight receive) marks it
  as left; the membership shrinks past every left generator at the top (StatefulSet ordinals go from the top), a
  new epoch forms over the rest, and the leavers' work is re-issued. If the notice is lost (SIGKILL before it
  went out), a failed push finds it: every member that does not answer that SYNC (ACK or NACK) within
  ``answer_within`` and is at the top is dropped the same way; one that answers later, or says READY, joins again.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from kubeforge.api import progress
from kubeforge.runtime import transport, types, wire
from kubeforge.runtime.trainer import buffer as buffer_mod
from kubeforge.runtime.trainer import export_requests, report

POLL_SECONDS = 0.05


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The numbers of the loop, from the spec and the env contract."""

    rank: int
    world: int
    steps: int
    prompts_per_step: int
    max_policy_lag: int
    sync_every: int
    checkpoint_every: int
    checkpoint_dir: str
    checkpoint_keep: int
    deadline: float = 600.0           # no progress this long: Stalled
    reissue_after: float = 150.0      # no group for this long: re-issue the step's missing prompts
    answer_within: float = 30.0       # after a failed push: a top member silent this long is dropped
    start_deadline: float = 1800.0    # a generator's start (vLLM engine load) may take this long: the READY wait,
                                      # and a step's wait while a generator says it is starting
    colocated: bool = False           # spec.schedule.mode Colocated: a step's work goes out only after the last
                                      # step is trained and pushed (phases take turns on the same cores)


class Stalled(RuntimeError):
    """No progress within the deadline (spec.failurePolicy.progressDeadlineSeconds)."""


class Terminated(Exception):
    """SIGTERM reached the trainer: it stopped at a safe point (never inside a checkpoint write)."""


class Learner(Protocol):
    """What the loop needs of ``trainer.step.Trainer``."""

    step: int
    policy_version: int

    def train_step(self, *, groups: Sequence[types.RolloutGroup]) -> Any: ...
    def resume(self, *, directory: str) -> dict[str, Any] | None: ...
    def save_checkpoint(self, *, directory: str, keep: int, data_cursor: int,
                        extra: Mapping[str, Any] | None = None) -> Any: ...
    def follow_sync(self) -> None:
        """A non-zero rank's part of rank 0's weight push (gathers of sharded weights); may do nothing."""
    def export(self, *, directory: str) -> Any:
        """Write the policy as an HF folder under ``directory`` (every rank calls it; rank 0 writes)."""


class WeightPusher(Protocol):
    def push(self, *, version: int, step: int) -> types.SyncResult:
        """Announce SYNC to every generator, broadcast the weights, wait for every ACK; raises
        ``weightsync.WeightSyncError`` (or any RuntimeError) when the group broke."""

    def reform(self, *, members: int | None = None) -> int:
        """Abandon the current weight-sync epoch; the next push forms a new one (over ``members`` generators when
        given). Returns the new epoch."""


class TrainerObserver(Protocol):
    def trained(self, *, record: progress.StepRecord) -> None: ...
    def dropped(self, *, reason: str) -> None: ...
    def unexpected(self, *, kind: str) -> None: ...


@dataclasses.dataclass(kw_only=True)
class Rank0:
    """The parts only trainer rank 0 has."""

    control: transport.Receiver           # READY/ACK from generators
    pusher: WeightPusher
    reporter: report.Reporter
    evaluate: Evaluate | None = None      # held-out accuracy (spec.evaluation); None: no evaluation
    eval_every: int = 0
    exports: export_requests.Requests | None = None   # export on request; None: only at the end


class Evaluate(Protocol):
    def __call__(self) -> Any:
        """Run the held-out evaluation now; the result has ``accuracy`` and ``seconds``."""


def prompt_indices(*, step: int, prompts_per_step: int) -> range:
    return range(step * prompts_per_step, (step + 1) * prompts_per_step)


def my_share(*, step: int, settings: Settings) -> int:
    """How many groups of ``step`` belong to this rank."""
    return sum(1 for k in prompt_indices(step=step, prompts_per_step=settings.prompts_per_step)
               if k % settings.world == settings.rank)


def split(items: Sequence[types.Prompt], parts: int) -> list[list[types.Prompt]]:
    """Contiguous, nearly equal chunks (some empty when there are fewer items than parts)."""
    n = len(items)
    return [list(items[i * n // parts:(i + 1) * n // parts]) for i in range(parts)]


class Loop:
    """State of one trainer rank's run (see the module docstring for the order of things)."""

    def __init__(self, *, settings: Settings, inbox: transport.Receiver, generators: transport.Sender,
                 learner: Learner, prompt_at: Callable[[int], types.Prompt], observer: TrainerObserver,
                 rank0: Rank0 | None = None, clock: Callable[[], float] = time.time,
                 beat: Callable[[str], None] = lambda activity: None,
                 should_stop: Callable[[], bool] = lambda: False,
                 generator_address: Callable[[int], str | None] = lambda index: None) -> None:
        if (rank0 is None) == (settings.rank == 0):
            raise ValueError("rank 0, and only rank 0, needs the Rank0 parts")
        self.s = settings
        self.inbox = inbox
        self.learner = learner
        self.prompt_at = prompt_at
        self.observer = observer
        self.generators = generators
        self.rank0 = rank0
        self.clock = clock
        self.beat = beat                  # heartbeat: the role's liveness (``/healthz``) follows it
        self.should_stop = should_stop    # SIGTERM: stop at the next safe point (a write in progress finishes)
        self.ready_seen: set[int] = set()     # rank 0: generators that announced themselves
        self.members = generators.peers       # generators taking work now: indexes 0..members-1 (elastic)
        self.joining: set[int] = set()        # rank 0: generators beyond ``members`` that said READY
        self.left: set[int] = set()           # rank 0: generators whose leave notice came (until their READY)
        self.dropped: set[int] = set()        # rank 0: generators dropped for silence after a failed push
        self.silent: set[int] = set()         # rank 0: members yet to answer the SYNC of a failed push
        self.silent_version = 0
        self.silent_since = 0.0
        self.generator_address = generator_address   # data address of generator i (None: cannot grow)
        self._deferred: list[wire.Message] = []      # control messages a push read past (READY, leave)
        self.starting: dict[int, float] = {}  # rank 0: generator -> its first "starting" beat (until its READY)
        self.start_beat_at = 0.0              # rank 0: the last "starting" beat within its start deadline
        if rank0 is not None and hasattr(rank0.pusher, "on_other"):
            rank0.pusher.on_other = self._deferred.append
        self.outstanding: dict[int, list[wire.Work]] = {}   # rank 0: work handed to each generator
        self.epochs = 0                   # rank 0: weight-sync re-formations
        self.reissued = 0                 # groups re-issued because they did not arrive in time
        capacity = (settings.max_policy_lag + 2) * settings.prompts_per_step + 16
        self.buffer = buffer_mod.RolloutBuffer(max_policy_lag=settings.max_policy_lag, capacity=capacity)
        self.issued = 0                   # rank 0: next step whose work has not been handed out
        self._next_generator = settings.rank
        self.eval_base: float | None = None   # rank 0: held-out accuracy before the first step (fresh start)
        self.eval_last: float | None = None   # rank 0: the latest held-out accuracy (carried in every record)
        self.ahead = settings.max_policy_lag - (settings.sync_every - 1)
        if self.ahead < 0:
            raise ValueError("spec.algorithm.maxPolicyLag must be >= spec.weightSync.everySteps - 1")
        if settings.colocated:
            self.ahead = 0

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        start = self._resume()
        if self.rank0 is not None and start < self.s.steps:
            self._wait_for_generators()
        if 0 < start < self.s.steps:
            self._push(step=start)
        if start == 0 and self.rank0 is not None and self.rank0.evaluate is not None:
            self.beat("evaluate")
            self.eval_base = self.eval_last = float(self.rank0.evaluate().accuracy)
        for s in range(start, self.s.steps):
            self._issue_window(current=s)
            waited = self.clock()
            groups = self._collect(s)
            self.beat("train")
            t0 = self.clock()
            stats = self.learner.train_step(groups=groups)
            self._after_step(s, stats, groups, train_seconds=self.clock() - t0, wait_seconds=t0 - waited)
            self.beat("step")
            if self.should_stop() and s + 1 < self.s.steps:
                raise Terminated(f"SIGTERM after step {s + 1} (its checkpoint, if due, is complete)")
        exported = self.learner.export(directory=self.s.checkpoint_dir)
        if self.rank0 is not None:
            self._finish(exported)

    def _resume(self) -> int:
        state = self.learner.resume(directory=self.s.checkpoint_dir)
        start = int(state["data_cursor"]) if state else 0
        self.buffer.advance(next_step=start)
        self.issued = start
        if self.rank0 is not None:
            self.rank0.reporter.resumed(step=start)
        return start

    def _wait_for_generators(self) -> None:
        assert self.rank0 is not None
        waiting = set(range(self.members))
        until = time.monotonic() + self.s.start_deadline      # their vLLM engines load: a start, not a hang
        while waiting:
            self.beat("wait-generators")
            if time.monotonic() > until:
                raise Stalled(f"generators {sorted(waiting)} not ready within {self.s.start_deadline:.0f}s "
                              "(the start deadline: 3 x spec.failurePolicy.progressDeadlineSeconds)")
            msg = self.rank0.control.recv(timeout=1.0)
            if isinstance(msg, wire.Ready) and msg.role == "generator":
                waiting.discard(msg.index)
                self.ready_seen.add(msg.index)
                self.starting.pop(msg.index, None)
            elif msg is not None:
                self._control(msg)

    # ------------------------------------------------------------ work out (rank 0)

    def _issue_window(self, *, current: int) -> None:
        if self.rank0 is None:
            return
        last = min(current + self.ahead, self.s.steps - 1)
        while self.issued <= last:
            step = self.issued
            prompts = [self.prompt_at(k) for k in prompt_indices(step=step, prompts_per_step=self.s.prompts_per_step)]
            for g, chunk in enumerate(split(prompts, self.members)):
                if chunk:
                    self._send_work(g, self._work(step, chunk))
            self.issued += 1

    def _send_work(self, g: int, work: wire.Work) -> None:
        """Hand ``work`` to generator ``g``, bounded by ``answer_within``: a generator gone without a word (its pod
        deleted, its notice lost) must not hold the trainer. Rank 0 then counts it as silent (dropped at the top
        after ``answer_within``, its outstanding work, this one included, re-issued); for any rank the stall timer
        re-issues what did not go out."""
        if self.rank0 is not None:
            self.outstanding.setdefault(g, []).append(work)
        try:
            self.generators.send(work, to=g, timeout=min(self.s.deadline, self.s.answer_within))
        except transport.TransportError as exc:
            print(f"trainer-{self.s.rank}: work of step {work.step} not delivered to generator-{g} ({exc})",
                  flush=True)
            if self.rank0 is not None:
                if not self.silent:
                    self.silent_version, self.silent_since = self.learner.policy_version, time.monotonic()
                self.silent.add(g)

    def _work(self, step: int, prompts: Sequence[types.Prompt]) -> wire.Work:
        return wire.Work(step=step, policy_version=self.learner.policy_version, prompts=tuple(prompts))

    def _control(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Ready) and msg.role == "generator" and self.rank0 is not None:
            g = msg.index
            self.starting.pop(g, None)
            back = g in self.ready_seen or g in self.left or g in self.dropped
            self.left.discard(g)
            self.dropped.discard(g)
            if back and 0 <= g < self.members:
                self._rejoin(g)
            elif g >= self.members:
                self.joining.add(g)
                self._grow()
            self.ready_seen.add(g)
        elif (isinstance(msg, wire.Ack) and msg.role == "generator" and msg.of == wire.Kind.READY and not msg.ok
              and self.rank0 is not None):
            self._starting(msg.index)
        elif (isinstance(msg, wire.Ack) and msg.role == "generator" and msg.of == wire.Kind.STOP
              and self.rank0 is not None):
            self._leave(msg.index)
        elif (isinstance(msg, wire.Ack) and msg.role == "generator" and msg.of == wire.Kind.SYNC
              and self.rank0 is not None):
            self._answered(msg)
            getattr(self.rank0.pusher, "acked", lambda m: None)(msg)   # an ACK of the push in flight
        elif not isinstance(msg, (wire.Ready, wire.Ack)):
            self.observer.unexpected(kind=type(msg).__name__)

    def _starting(self, g: int) -> None:
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

    def _grow(self) -> None:
        """Generators that said READY beyond the membership join it, lowest index first (StatefulSet ordinals are
        contiguous): connect, new epoch over the larger group, current policy pushed before they get WORK."""
        assert self.rank0 is not None
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
        self.epochs = self.rank0.pusher.reform(members=self.members)
        if not getattr(self.learner, "sharded", False):
            self._push(step=self.learner.step)
        print(f"trainer-0: generators {before} -> {self.members} (joined); weight-sync epoch {self.epochs}",
              flush=True)

    def _leave(self, g: int) -> None:
        """Generator ``g`` sent its leave notice. At the top of the membership it is a scale-down: shrink past it.
        Below the top it restarts (a pod replaced), and its READY re-forms the group."""
        assert self.rank0 is not None
        self.ready_seen.discard(g)
        self.joining.discard(g)
        self.left.add(g)
        self._shrink(gone=self.left, why="left")

    def _check_silent(self) -> None:
        """After a failed push: top members that did not answer its SYNC within ``answer_within`` are gone (their
        leave notice, if any, was lost)."""
        if self.silent and time.monotonic() - self.silent_since > self.s.answer_within:
            gone, self.silent = set(self.silent), set()
            self.dropped |= self._shrink(gone=gone, why=f"silent {self.s.answer_within:.0f}s after a failed sync")

    def _shrink(self, *, gone: set[int], why: str) -> set[int]:
        """Drop the members at the top that are in ``gone`` (at least one stays): a smaller epoch, the current
        policy to the rest, and the leavers' outstanding work to them. Returns the dropped indexes."""
        assert self.rank0 is not None
        top = self.members
        while top > 1 and (top - 1) in gone:
            top -= 1
        if top == self.members:
            return set()
        leavers = set(range(top, self.members))
        before, self.members = self.members, top
        self.silent -= leavers
        self.epochs = self.rank0.pusher.reform(members=self.members)
        pending = [w for g in sorted(leavers) for w in self.outstanding.pop(g, []) if w.step >= self.buffer.next_step]
        if not getattr(self.learner, "sharded", False):
            self._push(step=self.learner.step)
        for i, w in enumerate(pending):
            self._send_work(i % self.members, self._work(w.step, w.prompts))
        print(f"trainer-0: generators {before} -> {self.members} (generator-{'/'.join(map(str, sorted(leavers)))} "
              f"{why}); weight-sync epoch {self.epochs}, {sum(len(w.prompts) for w in pending)} prompts re-issued",
              flush=True)
        return leavers

    def _rejoin(self, g: int) -> None:
        """Generator ``g`` restarted: new weight-sync epoch, current policy to everyone, its work again."""
        assert self.rank0 is not None
        self.epochs = self.rank0.pusher.reform(members=self.members)
        if not getattr(self.learner, "sharded", False):
            # a sharded (FSDP) model's push needs every rank's gathers: it waits for the next step boundary, and
            # the work below is skipped by the generator until then and re-issued by the stall timer
            self._push(step=self.learner.step)
        pending = [w for w in self.outstanding.pop(g, []) if w.step >= self.buffer.next_step]
        for w in pending:
            self._send_work(g, self._work(w.step, w.prompts))
        print(f"trainer-0: generator-{g} restarted: weight-sync epoch {self.epochs}, policy v"
              f"{self.learner.policy_version} pushed, {sum(len(w.prompts) for w in pending)} prompts re-issued",
              flush=True)

    # ------------------------------------------------------------ groups in (every rank)

    def _collect(self, step: int) -> list[types.RolloutGroup]:
        expected = my_share(step=step, settings=self.s)
        last_progress = started = time.monotonic()
        have = self.buffer.count(step=step)
        while not self.buffer.ready(step=step, expected=expected, policy_version=self.learner.policy_version):
            self.beat("collect")
            if self.should_stop():
                raise Terminated(f"SIGTERM while collecting step {step} (nothing was being written)")
            msg = self.inbox.recv(timeout=POLL_SECONDS)
            if isinstance(msg, wire.Scored):
                reason = self.buffer.add(group=msg.group, policy_version=self.learner.policy_version)
                if reason is not None:
                    self.observer.dropped(reason=reason)
            elif msg is not None:
                self.observer.unexpected(kind=type(msg).__name__)
            self._drain_control()
            if self.rank0 is not None:
                self._check_silent()
                started = max(started, self.start_beat_at)   # a generator is starting: not a stall
            self._forward_reissues()
            now = time.monotonic()
            if self.buffer.count(step=step) != have:
                have, last_progress = self.buffer.count(step=step), now
            elif now - started > self.s.deadline:
                raise Stalled(f"step {step}: {have}/{expected} groups after {self.s.deadline:.0f}s "
                              "(spec.failurePolicy.progressDeadlineSeconds)")
            elif now - last_progress > self.s.reissue_after:
                self._reissue_missing(step)
                last_progress = now
        return self.buffer.take(step=step, policy_version=self.learner.policy_version)

    def _reissue_missing(self, step: int) -> None:
        """This rank's prompts of ``step`` that have not arrived: hand them out again (a lost frame, a dead peer)."""
        missing = [k for k in prompt_indices(step=step, prompts_per_step=self.s.prompts_per_step)
                   if k % self.s.world == self.s.rank and not self.buffer.holds(step=step, index=k)]
        for k in missing:
            g = self._next_generator % self.members
            self._next_generator = g + 1
            self._send_work(g, self._work(step, [self.prompt_at(k)]))
        self.reissued += len(missing)
        print(f"trainer-{self.s.rank}: step {step}: {len(missing)} groups did not arrive within "
              f"{self.s.reissue_after:.0f}s; re-issued", flush=True)

    def _drain_control(self) -> None:
        if self.rank0 is None:
            return
        while self._deferred:
            self._control(self._deferred.pop(0))
        while (msg := self.rank0.control.recv(timeout=0)) is not None:
            self._control(msg)

    def _forward_reissues(self) -> None:
        """Hand dropped-but-needed prompts out again, round robin over generators."""
        for r in self.buffer.drain_reissue():
            g = self._next_generator % self.members
            self._next_generator = g + 1
            self._send_work(g, self._work(r.step, [r.prompt]))

    # ------------------------------------------------------------ after a step

    def _after_step(self, s: int, stats: Any, groups: Sequence[types.RolloutGroup], *, train_seconds: float,
                    wait_seconds: float = 0.0) -> None:
        done = s + 1
        last = done == self.s.steps
        sync: types.SyncResult | None = None
        if (done % self.s.sync_every == 0) and not last:
            sync = self._push_overlapped(step=done)
        record = self._record(stats, groups, sync=sync, train_seconds=train_seconds)
        record.wait_seconds = wait_seconds
        self._evaluate(record, done=done, last=last)
        if not last:          # the last step exports anyway, after the loop
            self._export_on_request(record)
        self.observer.trained(record=record)
        if self.rank0 is not None:      # reported before the checkpoint: a resume never lacks a step's record
            self.rank0.reporter.step(record)
        for g in list(self.outstanding):       # forget work of trained steps
            self.outstanding[g] = [w for w in self.outstanding[g] if w.step > s]
        if done % self.s.checkpoint_every == 0 or last:
            self.beat("checkpoint")
            self.learner.save_checkpoint(directory=self.s.checkpoint_dir, keep=self.s.checkpoint_keep,
                                         data_cursor=done)

    def _evaluate(self, record: progress.StepRecord, *, done: int, last: bool) -> None:
        """Rank 0: held-out accuracy every ``eval_every`` steps and after the last; every record carries the latest
        (``eval_accuracy``), the step's own evaluation time, and the first also the base accuracy."""
        r0 = self.rank0
        if r0 is None or r0.evaluate is None:
            return
        if done % max(r0.eval_every, 1) == 0 or last:
            self.beat("evaluate")
            result = r0.evaluate()
            self.eval_last = float(result.accuracy)
            record.eval_seconds = float(result.seconds)
            record.evaluated = True
        if self.eval_last is not None:
            record.eval_accuracy = self.eval_last
        if done == 1 and self.eval_base is not None:
            record.eval_accuracy_base = self.eval_base

    def _export_on_request(self, record: progress.StepRecord) -> None:
        """Rank 0's pending export request (if any), agreed by every rank (one broadcast), served by all."""
        r0 = self.rank0
        request = r0.exports.pending() if r0 is not None and r0.exports is not None else None
        agree = getattr(self.learner, "agree", None)
        if agree is not None:
            request = agree(request)
        if request is None:
            return
        self.beat("export")
        path = self.learner.export(directory=self.s.checkpoint_dir)
        if r0 is not None and r0.exports is not None:
            r0.exports.served(str(request))
            record.export = str(path) if path else None
            record.export_request = str(request)
            print(f"trainer-0: export request {request}: {path}", flush=True)

    def _push_overlapped(self, *, step: int) -> types.SyncResult | None:
        """Rank 0: finish the push still in flight (started after the previous due step; its figures go in this
        step's record), then start this one: SYNC notices and the snapshot now, the broadcast in the background
        while the next step is collected and trained. A pusher without ``start`` pushes synchronously."""
        if self.rank0 is None or not hasattr(self.rank0.pusher, "start") or getattr(self.learner, "sharded", False):
            return self._push(step=step)   # sharded: the streaming push keeps rank 0's memory at one bucket
        pusher: Any = self.rank0.pusher
        previous = self._finish_push()
        self._drain_control()   # as in _push: leave notices and silent members shrink the group first
        self._check_silent()
        self.beat("sync")
        try:
            pusher.start(version=self.learner.policy_version, step=step)
        except RuntimeError as exc:
            self._push_failed(exc)
        finally:
            getattr(self.learner, "complete_sync", lambda: None)()
        return previous

    def _finish_push(self) -> types.SyncResult | None:
        """Rank 0: join the push in flight, if any; a failed one abandons the epoch (as a failed ``_push``)."""
        if self.rank0 is None or not getattr(self.rank0.pusher, "in_flight", False):
            return None
        try:
            result: types.SyncResult | None = getattr(self.rank0.pusher, "finish")()
            return result
        except RuntimeError as exc:
            self._push_failed(exc)
            return None

    def _push_failed(self, exc: BaseException) -> None:
        assert self.rank0 is not None
        self.epochs = self.rank0.pusher.reform(members=self.members)
        if not self.silent:     # members still silent since an earlier failed push keep their clock
            self.silent = set(range(self.members)) - self.left
            self.silent_version, self.silent_since = self.learner.policy_version, time.monotonic()
        print(f"trainer-0: weight sync v{self.learner.policy_version} failed ({exc}); weight-sync epoch "
              f"{self.epochs} forms when the generators are back", flush=True)

    def _push(self, *, step: int) -> types.SyncResult | None:
        """Push the current policy (other ranks take part in the gathers a sharded model needs); a broken group (a
        generator died mid-sync) abandons the epoch and returns None: training goes on and the generator's return
        (its READY) triggers the next push."""
        if self.rank0 is None:
            self.learner.follow_sync()
            return None
        self._finish_push()
        self._drain_control()   # a leave notice that came meanwhile shrinks the group before any SYNC goes out
        self._check_silent()    # so does a member silent since the last failed push
        self.beat("sync")
        try:
            return self.rank0.pusher.push(version=self.learner.policy_version, step=step)
        except RuntimeError as exc:
            self._push_failed(exc)
            return None
        finally:    # the other ranks' follow_sync gathers complete even when the push did not
            getattr(self.learner, "complete_sync", lambda: None)()

    def _record(self, stats: Any, groups: Sequence[types.RolloutGroup], *,
                sync: types.SyncResult | None, train_seconds: float) -> progress.StepRecord:
        base = stats.as_dict() if hasattr(stats, "as_dict") else dict(stats)
        drops = sum(self.buffer.drops.values())
        return progress.StepRecord(
            **base,
            time=self.clock(),
            step_seconds=train_seconds,
            weight_sync_seconds=sync.seconds if sync else None,
            weight_sync_bytes=sync.bytes if sync else None,
            dropped_stale=self.buffer.drops.get(buffer_mod.STALE, 0),
            dropped_total=drops,
            policy_lag={str(k): v for k, v in sorted(self.buffer.lag_counts.items())},
        )

    def _finish(self, exported: Any) -> None:
        assert self.rank0 is not None
        self._finish_push()
        for g in range(self.members):
            try:
                self.generators.send(wire.Stop(reason="done"), to=g, timeout=5.0)
            except transport.TransportError:
                pass
        self.rank0.reporter.done(progress.StepRecord(
            step=self.learner.step, policy_version=self.learner.policy_version,
            export=str(exported) if exported else None, eval_accuracy=self.eval_last))
