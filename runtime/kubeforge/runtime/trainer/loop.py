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

Neighbours: the learner (``learner.base.Learner``, injected: ``learner.step.Trainer`` in a pod; its step returns
``progress.StepMetrics``), ``trainer.buffer.RolloutBuffer`` (staleness), ``tasks`` (``prompt_at(k)``, injected),
``trainer.report`` (Reporter), the transport (inbox and a sender to every generator; rank 0 also a control inbox for
READY/ACK). The loop owns one part per concern: ``trainer.membership`` (rank 0's elastic generators: join, leave,
restart, silence), ``trainer.pushes`` (when to push, the push that overlaps the next step; the weight pusher itself
is ``trainer.pusher``), ``trainer.record`` (the step's record), ``trainer.saves`` (checkpoint writes, the stop
checkpoint's bound), ``trainer.accuracy`` (held-out evaluation in the records) and ``trainer.export_requests``
(export on request); dynamic sampling's screening is ``learner.dynamic_sampling``.

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
- SIGTERM (``should_stop``: the pod deleted, e.g. the job suspended by a Kueue eviction/preemption or
  ``spec.suspend``) ends the loop at a safe point with a stop checkpoint, so a resume repeats no step and loses
  none: a step being trained finishes (every rank agrees on the stop after it: one all-reduce; its weight push is
  skipped, the generators stop too and a push to a peer gone would wait out its send timeout), a step being
  collected is abandoned (its groups are generated again after the resume); then the trained steps are checkpointed
  (model, optimizer, data cursor = the next untrained step, RNG) unless the newest checkpoint already holds them.
  Bounded: the write starts only if SIGTERM's age plus the last write's duration stays within ``stop_within``
  (``contract.STOP_CHECKPOINT_WITHIN_SECONDS``, below the pod's grace period), else it is skipped and the resume
  repeats the steps since the last checkpoint. Abandoning a collect under FSDP with several ranks writes nothing
  (the write is collective and the other ranks may be inside a step); DDP's rank 0 writes alone. A checkpoint
  write in progress always finishes (the write itself is atomic: temp folder, fsync, rename, COMPLETE marker), so
  a pod killed mid-write leaves the new checkpoint or the previous one.
- Elastic generators (rank 0): a generator that restarts, joins, leaves or goes silent after a failed push
  changes the membership, and with it the weight-sync epoch; its outstanding work is re-issued
  (``trainer.membership``). A push that fails abandons the epoch and training goes on.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from kubeforge.api import progress
from kubeforge.runtime import infra, transport, types, wire
from kubeforge.runtime.learner import base, dynamic_sampling
from kubeforge.runtime.trainer import accuracy, buffer, dispatch, export_requests, membership, pushes, record, report
from kubeforge.runtime.trainer import saves

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
    peer_silence: float = 0.0         # a generator that beats and then is silent this long is left out (0: off;
                                      # spec.failurePolicy.peerSilenceSeconds in a pod)
    start_deadline: float = 1800.0    # a generator's start (vLLM engine load) may take this long: the READY wait,
                                      # and a step's wait while a generator says it is starting
    colocated: bool = False           # spec.schedule.mode Colocated: a step's work goes out only after the last
                                      # step is trained and pushed (phases take turns on the same cores)
    stop_within: float = 45.0         # SIGTERM: the stop checkpoint is written only if it ends within this
    refill_rounds: int = 0            # dynamic sampling (spec.algorithm.refill_rounds()): refills per slot; 0 off


class Stalled(RuntimeError):
    """No progress within the deadline (spec.failurePolicy.progressDeadlineSeconds)."""


class Terminated(Exception):
    """SIGTERM reached the trainer: it stopped at a safe point (never inside a checkpoint write)."""


class TrainerObserver(Protocol):
    def trained(self, *, record: progress.StepRecord) -> None: ...
    def dropped(self, *, reason: str) -> None: ...
    def unexpected(self, *, kind: str) -> None: ...


@dataclasses.dataclass(kw_only=True)
class Rank0:
    """The parts only trainer rank 0 has."""

    control: transport.Receiver           # READY/ACK from generators
    pusher: pushes.WeightPusher
    reporter: report.Reporter
    evaluate: Evaluate | None = None      # held-out accuracy (spec.evaluation); None: no evaluation
    eval_every: int = 0
    exports: export_requests.Requests | None = None   # export on request; None: only at the end


class Evaluate(Protocol):
    def __call__(self) -> Any:
        """Run the held-out evaluation now; the result has ``accuracy`` and ``seconds``."""


prompt_indices = dispatch.prompt_indices     # the cursor's arithmetic and the split over generators live with the
split = dispatch.split                       # hand-offs; named here too, where the loop's readers look for them


def my_share(*, step: int, settings: Settings) -> int:
    """How many groups of ``step`` belong to this rank."""
    return sum(1 for k in prompt_indices(step=step, prompts_per_step=settings.prompts_per_step)
               if k % settings.world == settings.rank)


class Loop:
    """State of one trainer rank's run (see the module docstring for the order of things)."""

    def __init__(self, *, settings: Settings, inbox: transport.Receiver, generators: transport.Sender,
                 learner: base.Learner, prompt_at: Callable[[int], types.Prompt], observer: TrainerObserver,
                 rank0: Rank0 | None = None, clock: Callable[[], float] = time.time,
                 beat: Callable[[str], None] = lambda activity: None,
                 should_stop: Callable[[], bool] = lambda: False,
                 stopped_at: Callable[[], float | None] = lambda: None,
                 generator_address: Callable[[int], str | None] = lambda index: None) -> None:
        if (rank0 is None) == (settings.rank == 0):
            raise ValueError("rank 0, and only rank 0, needs the Rank0 parts")
        self._settings = settings
        self.inbox = inbox
        self.learner = learner
        self.prompt_at = prompt_at
        self.observer = observer
        self.generators = generators
        self.rank0 = rank0
        self._silent_told: set[int] = set()     # the silent generators last told to the reporter
        self.clock = clock
        self.beat = beat                  # heartbeat: the role's liveness (``/healthz``) follows it
        self.should_stop = should_stop    # SIGTERM: stop at the next safe point (a write in progress finishes)
        self.stopped_at = stopped_at      # when SIGTERM arrived (time.monotonic), if known
        self.saves = saves.Saves(learner=learner, beat=beat)     # checkpoint writes, the stop checkpoint's bound
        self.reissued = 0                 # groups re-issued because they did not arrive in time
        self.dispatch = dispatch.Dispatch(settings=lambda: self.s, generators=generators, prompt_at=prompt_at,
                                          learner=learner)    # work out: rank 0's window, anyone's re-issues
        capacity = (settings.max_policy_lag + 2) * settings.prompts_per_step + 16
        self.buffer = buffer.RolloutBuffer(max_policy_lag=settings.max_policy_lag, capacity=capacity)
        self.resampler = (dynamic_sampling.Resampler(   # DAPO's dynamic sampling (learner/dynamic_sampling.py)
            layout=dynamic_sampling.Layout(prompts_per_step=settings.prompts_per_step, steps=settings.steps,
                                           ranks=settings.world), max_rounds=settings.refill_rounds)
            if settings.refill_rounds > 0 else None)
        self.membership = (membership.Membership(
            settings=settings, generators=generators, control=rank0.control, pusher=rank0.pusher, learner=learner,
            rollouts=self.buffer, observer=observer, generator_address=generator_address,
            push=lambda step: self.pushes.push(step=step), send_work=self.dispatch.send, work=self.dispatch.work)
            if rank0 is not None else None)   # rank 0: the generators taking work, elastic
        self.dispatch.membership = self.membership
        self.pushes = pushes.Pushes(learner=learner, pusher=rank0.pusher if rank0 is not None else None,
                                    membership=self.membership, beat=beat)
        self.accuracy = accuracy.HeldOutAccuracy(evaluate=rank0.evaluate if rank0 is not None else None,
                                                 every=rank0.eval_every if rank0 is not None else 0, beat=beat)
        self.exports = export_requests.OnRequest(learner=learner, beat=beat)
        self.ahead = settings.max_policy_lag - (settings.sync_every - 1)
        if self.ahead < 0:
            raise ValueError("spec.algorithm.maxPolicyLag must be >= spec.weightSync.everySteps - 1")
        if settings.colocated:
            self.ahead = 0

    @property
    def s(self) -> Settings:
        return self._settings

    @s.setter
    def s(self, settings: Settings) -> None:
        """New settings reach the membership too (its deadlines)."""
        self._settings = settings
        if self.membership is not None:
            self.membership.s = settings

    @property
    def members(self) -> int:
        """Generators taking work now (indexes ``0..members-1``): elastic on rank 0, every generator elsewhere."""
        return self.dispatch.members

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        start = self._resume()
        if self.rank0 is not None and start < self.s.steps:
            self._wait_for_generators()
        if 0 < start < self.s.steps:
            self.pushes.push(step=start)
        if start == 0:
            self.accuracy.before_first_step()
        for s in range(start, self.s.steps):
            if self.rank0 is not None:
                self.dispatch.issue_window(current=s, ahead=self.ahead)
            waited = self.clock()
            try:
                groups = self._collect(s)
            except Terminated:          # the step being collected is abandoned: its work goes out again
                written = self.saves.on_stop(self.s, trained=s, collective=False, stopped_at=self.stopped_at())
                raise Terminated(f"SIGTERM while collecting step {s} ({written})") from None
            self.beat("train")
            t0 = self.clock()
            counts = None
            if self.resampler is not None:
                groups, counts = self.resampler.finish(step=s, groups=groups)
            metrics = (self.learner.train_step(groups=groups) if counts is None
                       else self.learner.train_step(groups=groups, sampling=counts))
            # a stop agreed now skips this step's weight push: the generators are stopping too (a suspended or
            # evicted job loses every pod), and a push to a peer gone waits out its send timeout, eating the stop
            # checkpoint's bound (measured: 30 s of 45 under Kueue preemption); a resume pushes anyway
            stopping = s + 1 < self.s.steps and self._stop_agreed()
            self._after_step(s, metrics, groups, train_seconds=self.clock() - t0, wait_seconds=t0 - waited,
                             push=not stopping)
            self.beat("step")
            if s + 1 < self.s.steps and (stopping or self._stop_agreed()):
                written = self.saves.on_stop(self.s, trained=s + 1, collective=True, stopped_at=self.stopped_at())
                raise Terminated(f"SIGTERM after step {s + 1} ({written})")
        exported = self.learner.export(directory=self.s.checkpoint_dir)
        if self.rank0 is not None:
            self._finish(exported)

    def _resume(self) -> int:
        state = self.learner.resume(directory=self.s.checkpoint_dir)
        start = int(state["data_cursor"]) if state else 0
        self.saves.saved_cursor = start if state else -1
        self.buffer.advance(next_step=start)
        self.dispatch.issued = start
        if self.rank0 is not None:
            self.rank0.reporter.resumed(step=start)
        return start

    def _wait_for_generators(self) -> None:
        assert self.rank0 is not None and self.membership is not None
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
                self.membership.ready(msg.index)
            elif msg is not None:
                self.membership.on_control(msg)

    # ------------------------------------------------------------ groups in (every rank)

    def _collect(self, step: int) -> list[types.RolloutGroup]:
        expected = my_share(step=step, settings=self.s)
        last_progress = started = time.monotonic()
        have = self.buffer.count(step=step)
        while not self.buffer.ready(step=step, expected=expected, policy_version=self.learner.policy_version):
            self.beat("collect")
            if self.should_stop():
                raise Terminated(f"SIGTERM while collecting step {step}")
            msg = self.inbox.recv(timeout=POLL_SECONDS)
            if isinstance(msg, wire.Scored) and self._screened_out(msg.group):
                pass
            elif isinstance(msg, wire.Scored):
                reason = self.buffer.add(group=msg.group, policy_version=self.learner.policy_version)
                if reason is not None:
                    self.observer.dropped(reason=reason)
            elif msg is not None:
                self.observer.unexpected(kind=type(msg).__name__)
            if self.membership is not None:
                self.membership.drain()
                self.membership.check_silent()
                self._tell_silent()
                started = max(started, self.membership.start_beat_at)   # a generator is starting: not a stall
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

    def _tell_silent(self) -> None:
        """Rank 0 tells its reporter (the operator, in a pod) when the set of silent generators changes."""
        if self.membership is None or self.rank0 is None:
            return
        silent = self.membership.silent_now()
        if set(silent) != self._silent_told:
            self._silent_told = set(silent)
            self.rank0.reporter.silent(silent)

    def _screened_out(self, group: types.RolloutGroup) -> bool:
        """Dynamic sampling: True when ``group`` has no signal and is dropped here, a new prompt sent in its place.
        Groups the buffer refuses anyway (malformed, late, duplicate, lost to infrastructure) are left to it."""
        if (self.resampler is None or group.step < self.buffer.next_step or group.rewards is None
                or len(group.rewards) != len(group.completions) or infra.reason(group) is not None
                or self.buffer.holds(step=group.step, index=group.prompt.index)):
            return False
        decision = self.resampler.screen(group)
        if decision.keep:
            return False
        if decision.refill is not None:
            self.dispatch.to_next(group.step, self.prompt_at(decision.refill))
        return True

    def _slot_index(self, step: int, k: int) -> int:
        """The prompt index slot ``k`` of ``step`` waits for: ``k``, or its refill under dynamic sampling."""
        return k if self.resampler is None else self.resampler.current(step=step, slot=k)

    def _reissue_missing(self, step: int) -> None:
        """This rank's prompts of ``step`` that have not arrived: hand them out again (a lost frame, a dead peer)."""
        mine = [self._slot_index(step, k) for k in prompt_indices(step=step, prompts_per_step=self.s.prompts_per_step)
                if k % self.s.world == self.s.rank]
        missing = [k for k in mine if not self.buffer.holds(step=step, index=k)]
        for k in missing:
            self.dispatch.to_next(step, self.prompt_at(k))
        self.reissued += len(missing)
        print(f"trainer-{self.s.rank}: step {step}: {len(missing)} groups did not arrive within "
              f"{self.s.reissue_after:.0f}s; re-issued", flush=True)

    def _forward_reissues(self) -> None:
        """Hand dropped-but-needed prompts out again, round robin over generators."""
        for r in self.buffer.drain_reissue():
            self.dispatch.to_next(r.step, r.prompt)

    # ------------------------------------------------------------ after a step

    def _after_step(self, s: int, metrics: progress.StepMetrics, groups: Sequence[types.RolloutGroup], *,
                    train_seconds: float, wait_seconds: float = 0.0, push: bool = True) -> None:
        done = s + 1
        last = done == self.s.steps
        sync: types.SyncResult | None = None
        if (done % self.s.sync_every == 0) and not last and push:
            sync = self.pushes.push_overlapped(step=done)
        rec = record.of(metrics, groups, rollouts=self.buffer, sync=sync, at=self.clock(),
                        train_seconds=train_seconds, wait_seconds=wait_seconds,
                        trained_version=self.learner.policy_version - 1, max_policy_lag=self.s.max_policy_lag)
        self.accuracy.after_step(rec, done=done, last=last)
        if not last:          # the last step exports anyway, after the loop
            self.exports.after_step(rec, requests=self.rank0.exports if self.rank0 is not None else None,
                                    directory=self.s.checkpoint_dir)
        if self.rank0 is not None:
            self._fencing(rec)
            rec.weights_at = self.pushes.weights_at
        self.observer.trained(record=rec)
        if self.rank0 is not None:      # reported before the checkpoint: a resume never lacks a step's record
            self.rank0.reporter.step(rec)
        if self.membership is not None:       # forget work of trained steps
            self.membership.forget(trained=s)
        if done % self.s.checkpoint_every == 0 or last:
            self.saves.save(self.s, cursor=done)

    # ------------------------------------------------------------ stopping (SIGTERM)

    def _stop_agreed(self) -> bool:
        """After a step: True when any rank was told to stop (one all-reduce when there are several ranks)."""
        flag = self.should_stop()
        agree = getattr(self.learner, "any_rank", None)
        return bool(agree(flag)) if agree is not None and self.s.world > 1 else flag

    def _finish(self, exported: Path | None) -> None:
        assert self.rank0 is not None
        self.pushes.finish()
        for g in range(self.members):
            try:
                self.generators.send(wire.Stop(reason="done"), to=g, timeout=5.0)
            except transport.TransportError:
                pass
        closing = progress.StepRecord(
            step=self.learner.step, policy_version=self.learner.policy_version,
            export=str(exported) if exported else None, eval_accuracy=self.accuracy.last)
        self._fencing(closing)
        self.rank0.reporter.done(closing)

    def _fencing(self, rec: progress.StepRecord) -> None:
        assert self.rank0 is not None
        record.fencing(rec, trainer_epoch=getattr(self.learner, "trainer_epoch", 0),
                       pushes=getattr(self.rank0.pusher, "fenced_pushes", 0), checkpoint_dir=self.s.checkpoint_dir)

    # ------------------------------------------------------------ rank 0's membership, as seen on the loop

    @property
    def left(self) -> set[int]:
        return self.membership.left if self.membership is not None else set()

    @property
    def dropped(self) -> set[int]:
        return self.membership.dropped if self.membership is not None else set()

    @property
    def epochs(self) -> int:
        return self.membership.epochs if self.membership is not None else 0

    @property
    def starting(self) -> dict[int, float]:
        return self.membership.starting if self.membership is not None else {}

    @property
    def start_beat_at(self) -> float:
        return self.membership.start_beat_at if self.membership is not None else 0.0

    def _starting(self, g: int) -> None:
        assert self.membership is not None
        self.membership.on_starting(g)
