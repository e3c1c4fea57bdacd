"""The generator role's loop: work in, ``groupSize`` completions per prompt out; new weights between batches.

```
 trainer 0 ──WORK(step, prompts) / SYNC(v) / STOP──▶ inbox            (one ordered channel: a SYNC is seen
                                                      │                 between batches, never mid-batch)
      WORK ─▶ sampler.sample(prompts) ─▶ groups stamped (policy version, step, generator) ─▶ ROLLOUT ─▶ verifiers
      SYNC ─▶ weights.load(sync): join the broadcast, load in place ─▶ version = v ─▶ ACK ─▶ trainer 0
```

Neighbours: the sampler wraps the vLLM engine (``generator.engine.Engine``), ``weights`` wraps its weight receiver
(``weightsync``); both are injected by ``generator.start`` (unit tests inject in-process ones). ``transport`` gives the
inbox, the sender towards the verifiers (round robin) and the control sender towards trainer 0.

STOP ends the loop and is passed on to every verifier.

Invariants: every group carries the policy version of the weights that sampled it; the engine is never reloaded
while it is sampling (this loop is single-threaded); READY goes to trainer 0 once the engine is up (again after a
restart: trainer 0 then re-forms the weight-sync group and pushes the current policy). A sync that fails (a
peer died mid-broadcast, an abandoned epoch) is answered with a negative ACK and the loop goes on with the
weights it has; WORK the generator's weights are too old for (``maxPolicyLag``) is skipped, not sampled: trainer 0
hands it out again after the push, so a restarted generator samples nothing before it has the current policy.

Leaving (scaled down, pod deleted): SIGTERM sends the leave notice (an ACK of kind STOP) to trainer 0 at once, even
while this loop's thread is blocked inside a weight receive (``LeaveNotice.send`` is called from the signal watcher
of ``generator.start``, on its own socket); the loop ends at its next turn. The notice is sent once, whichever comes
first. Trainer 0 shrinks the weight-sync group and re-issues this generator's work (``trainer.membership``).

Fencing: a SYNC from a trainer epoch older than the highest seen is refused before the broadcast and counted
(``generator.fence``; docs/fencing.md); every ACK of a load carries the count.

Joining a running job (a restart, a scale-up): WORK of a newer policy than this generator has held is skipped until
trainer 0's push, which its READY asks for, is loaded (``generator.join``); its first rollouts carry that version.

Starting: while the vLLM engine loads, ``StartBeats`` tells trainer 0 every few seconds that this generator is
starting (an ACK of READY with ``ok=False``), so a restart in place is not taken for a stalled step.
"""
from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kubeforge.runtime import transport, types, wire
from kubeforge.runtime.generator import fence as push_fence
from kubeforge.runtime.generator import join

POLL_SECONDS = 0.2
FORGED_SYNC = "ForgedSync"  # a SYNC naming a weight-sync address other than the env contract's trainer 0


SyncResult = types.SyncResult   # what one weight load cost (plain data: trainer 0's pushes report it too)


class Sampler(Protocol):
    def sample(self, prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
        """One group per prompt (``groupSize`` completions, behaviour logprobs); version/step set by the loop."""


class WeightLoader(Protocol):
    def load(self, sync: wire.Sync) -> SyncResult:
        """Join the weight broadcast announced by ``sync`` and load the weights in place."""


class GeneratorObserver(Protocol):
    def sampled(self, *, groups: Sequence[types.RolloutGroup], seconds: float) -> None: ...
    def synced(self, *, version: int, result: SyncResult) -> None: ...
    def sync_failed(self, *, version: int, error: BaseException) -> None: ...
    def skipped(self, *, work: wire.Work, version: int) -> None: ...
    def unexpected(self, *, kind: str) -> None: ...


class LeaveNotice:
    """This generator's leave notice to trainer 0, sent at most once, from whichever thread sees the stop first (the
    signal watcher while the loop is blocked in a weight receive, or the loop when it ends). Each send opens its own
    short-lived sender (``open_control``): a socket belongs to one thread. Best effort and bounded: a dead trainer
    costs at most ``timeout`` seconds."""

    def __init__(self, *, index: int, open_control: Callable[[float], transport.Sender],
                 timeout: float = 2.0) -> None:
        self.index = index
        self.version = 0              # the weights this generator holds (kept current by the loop)
        self.open_control = open_control
        self.timeout = timeout
        self._lock = threading.Lock()
        self.sent = False

    def send(self) -> bool:
        """Send the notice unless it went already; True when this call sent it."""
        with self._lock:
            if self.sent:
                return False
            self.sent = True
        try:
            control = self.open_control(self.timeout)
        except transport.TransportError:
            return False
        try:
            control.send(wire.Ack(role="generator", index=self.index, of=wire.Kind.STOP, version=self.version),
                         timeout=self.timeout)
        except transport.TransportError:
            return False
        finally:
            control.close()
        return True


class StartBeats:
    """While the engine loads (minutes on loaded CPUs, with no heartbeat of its own), tell trainer 0 every ``every``
    seconds that this generator is starting: an ACK of kind READY with ``ok=False`` (a trainer that does not know it
    ignores it). Trainer 0 then bounds its wait for this generator's groups by the start deadline instead of the
    progress deadline, so a generator restarting in place is not taken for a stalled step. A daemon thread sends on
    ``control``; ``stop()`` joins it before the loop uses ``control`` (a socket belongs to one thread at a time)."""

    def __init__(self, *, index: int, control: transport.Sender, every: float, send_timeout: float = 5.0) -> None:
        self.index, self.control, self.every, self.send_timeout = index, control, every, send_timeout
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"start-beats-{index}", daemon=True)

    def start(self) -> StartBeats:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.control.send(wire.Ack(role="generator", index=self.index, of=wire.Kind.READY, version=0,
                                           ok=False, detail="starting"), timeout=self.send_timeout)
                self.sent += 1
            except transport.TransportError:
                pass                   # trainer 0 not up yet (or restarting): the next beat tries again
            self._stop.wait(self.every)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.send_timeout + self.every + 1.0)


def run(*, index: int, inbox: transport.Receiver, verifiers: transport.Sender, control: transport.Sender,
        sampler: Sampler, weights: WeightLoader, observer: GeneratorObserver, policy_version: int = 0,
        should_stop: Callable[[], bool] = lambda: False, max_policy_lag: int | None = None,
        beat: Callable[[str], None] = lambda activity: None,
        trainer_weights: tuple[str, int] | None = None, leave: LeaveNotice | None = None,
        activity: Any = None, fence: push_fence.PushFence | None = None,
        joining: join.Joining | None = None) -> None:
    """Serve until STOP (or ``should_stop``). ``trainer_weights`` is trainer 0's weight-sync address as the job's
    env contract names it: a SYNC naming any other address is refused (counted as ``ForgedSync``, never joined,
    never acked), so no frame can point a generator at a group that feeds it weights of its choosing. ``leave``
    sends the leave notice when stopped by ``should_stop`` (None: sent on ``control``). ``activity``
    (``partial.Activity``) counts the seconds spent sampling (the bench's generator idle fraction). With partial
    rollouts ``generator.partial.run`` serves instead (``generator.start`` chooses). ``fence`` refuses SYNCs of a
    stale trainer epoch (``generator.fence``; None: a fence of this loop's own). ``joining`` holds back WORK of a
    newer policy than this generator has held until trainer 0's push arrives (``generator.join``)."""
    version = policy_version
    fence = fence or push_fence.PushFence()
    joining = joining or join.Joining()
    if leave is not None:
        leave.version = version
    control.send(wire.Ready(role="generator", index=index, policy_version=version))
    while not should_stop():
        beat("idle")
        msg = inbox.recv(timeout=POLL_SECONDS)
        if msg is None:
            continue
        if isinstance(msg, wire.Stop):
            _pass_on(msg, verifiers)
            return
        if isinstance(msg, wire.Work):
            if not joining.admit(msg, version=version) or (
                    max_policy_lag is not None and msg.policy_version - version > max_policy_lag):
                observer.skipped(work=msg, version=version)
                continue
            beat("generate")
            started = time.monotonic()
            if activity is not None:
                activity.work()
            _work(msg, index=index, version=version, sampler=sampler, verifiers=verifiers, observer=observer)
            if activity is not None:
                activity.add_busy(time.monotonic() - started)
        elif isinstance(msg, wire.Sync):
            version = sync(msg, index=index, version=version, weights=weights, control=control, observer=observer,
                           beat=beat, trainer_weights=trainer_weights, leave=leave, fence=fence, joining=joining)
        else:
            observer.unexpected(kind=type(msg).__name__)
    if leave is not None:
        leave.send()
    else:
        _leave(control, index=index, version=version)


def sync(msg: wire.Sync, *, index: int, version: int, weights: WeightLoader, control: transport.Sender,
         observer: GeneratorObserver, beat: Callable[[str], None], trainer_weights: tuple[str, int] | None,
         leave: LeaveNotice | None, fence: push_fence.PushFence | None = None,
         joining: join.Joining | None = None) -> int:
    """Handle one SYNC (both loops): refuse a forged one and one of a stale trainer epoch, load, ACK; the version
    held afterwards."""
    if trainer_weights is not None and (msg.host, msg.port) != trainer_weights:
        observer.unexpected(kind=FORGED_SYNC)
        return version
    if fence is not None and not fence.admit(msg):
        return version               # never joined, never acked (generator.fence)
    beat("sync")
    try:
        result = weights.load(msg)
    except RuntimeError as exc:    # weightsync.WeightSyncError: the group broke; the trainer re-forms it
        observer.sync_failed(version=msg.version, error=exc)
        control.send(wire.Ack(role="generator", index=index, of=wire.Kind.SYNC, version=msg.version,
                              ok=False, detail=str(exc)[:500]))
        return version
    if leave is not None:
        leave.version = msg.version
    if joining is not None:
        joining.loaded(version=msg.version)
    observer.synced(version=msg.version, result=result)
    control.send(wire.Ack(role="generator", index=index, of=wire.Kind.SYNC, version=msg.version,
                          detail=json.dumps({"seconds": result.seconds, "bytes": result.bytes,
                                             "fenced": fence.refused if fence is not None else 0})))
    return msg.version


def _leave(control: transport.Sender, *, index: int, version: int) -> None:
    """Stopped by a signal (scaled down, pod deleted): tell trainer 0, which shrinks the weight-sync group and hands
    this generator's work to the others (best effort: a dead generator is found by the sync instead)."""
    try:
        control.send(wire.Ack(role="generator", index=index, of=wire.Kind.STOP, version=version), timeout=2.0)
    except transport.TransportError:
        pass


def _work(msg: wire.Work, *, index: int, version: int, sampler: Sampler, verifiers: transport.Sender,
          observer: GeneratorObserver) -> None:
    started = time.monotonic()
    groups = sampler.sample(msg.prompts)
    for g in groups:
        g.policy_version = version
        g.step = msg.step
        g.generator = index
    observer.sampled(groups=groups, seconds=time.monotonic() - started)
    verifiers.send_many([wire.Rollout(group=g) for g in groups])   # the batch's groups, packed (wire.pack)


def _pass_on(stop: wire.Stop, verifiers: transport.Sender) -> None:
    """The end of the run travels down the pipeline: every verifier gets the STOP too (best effort)."""
    for v in range(verifiers.peers):
        try:
            verifiers.send(stop, to=v, timeout=2.0)
        except transport.TransportError:
            pass
