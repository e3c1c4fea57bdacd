"""The loop of a pool engine: several jobs' WORK and SYNC in, each job's rollouts out, one engine thread.

```
 job a's trainer 0 ──WORK/SYNC/STOP──▶ inbox a (CURVE: a's key only) ─┐
 job b's trainer 0 ──WORK/SYNC/STOP──▶ inbox b (CURVE: b's key only) ─┤  drain every inbox (non-blocking)
                                                                      ▼
      WORK ─▶ fairshare.Scheduler (DRR, weight promptsPerStep x groupSize) ─▶ next (job, work)
               ─▶ slots.acquire(job) ─▶ sampler(job).sample(prompts, adapter) ─▶ stamped ─▶ job's verifiers
      SYNC ─▶ generator.loop.sync (forged / fenced refused, ACK) with the job's own loader
               ─▶ slots.publish(job, version, path)                       (the job's next adapter)
      STOP ─▶ passed on to the job's verifiers; the job detached (its queue and adapter slot released)
 roster.poll() (the jobs file changed) ─▶ jobs that went: queue and adapter dropped, sockets closed
                                       ─▶ jobs that came: sockets opened, served from the next turn
```

Neighbours: ``generator.pool.start`` wires the sockets, the vLLM engine and the per-job loaders; ``fairshare`` and
``adapters`` are the pure policies; ``generator.loop.sync`` is the single-job generator's SYNC handling, reused.

Invariants:
- A job is whoever holds the key of the socket a frame came in on: nothing in a frame names a job, an adapter or
  a ``lora_id``. A job's WORK is sampled with that job's newest adapter only (``adapters.Slots``), and its groups
  go to that job's verifiers only, stamped with the version of the adapter that sampled them.
- One engine thread: a SYNC is loaded between two batches, never during one, so a batch runs on one version.
- A job waiting for its trainer queues nothing and takes no engine time. A job that stops answering costs the
  others at most a bounded wait: one weight-sync wait (that job's ``spec.weightSync.timeoutSeconds``) for a push
  its trainer abandons, ``ROLLOUT_SEND_SECONDS`` for a batch its verifiers have no room for (the batch is dropped
  and counted; its trainer re-issues the work, as for a generator that lost it).
- The set of jobs changes without a restart (``Roster``: the engine's jobs file re-read): a job that went is dropped
  between two batches (its queued work, its adapter unloaded, its sockets closed) and costs the others nothing; a
  job that came is served from the next turn, and its trainer finds it as it finds a generator that started.
- READY goes to every job's trainer 0 when its channel opens (the loop's start, or the roster opening it; as a
  generator's start says READY), else when its
  connection's HELLO arrives (the trainer waits for it before any WORK), and again for every new connection of
  trainer 0 (a restarted trainer), so a restarted trainer finds the pool as it would find a generator that
  restarted.
- An engine that restarts (lost, replaced) is a generator that restarted to every attached job (docs/recovery.md):
  its READY at start makes each job's trainer 0 push its current adapter and re-issue this engine's work
  (``trainer.membership``), and until that push is loaded a job's WORK of a newer version than the engine holds
  for it is skipped (``generator.join.Joining``, per job), never sampled with the base model or an older adapter.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kubeforge.runtime import transport, types, wire
from kubeforge.runtime.generator import fence as push_fence
from kubeforge.runtime.generator import join, loop
from kubeforge.runtime.generator.pool import adapters, fairshare

POLL_SECONDS = 0.02
DRAIN_LIMIT = 64          # messages taken from one job's inbox per turn (so one busy job cannot starve the turn)
ROLLOUT_SEND_SECONDS = 10.0   # how long the engine waits for room towards one job's verifiers (then drops the batch)
ANNOUNCE_SECONDS = 10.0       # the bound on the READY sent at the start (else the trainer's HELLO gets it)
LATE_ANNOUNCE_SECONDS = 1.0   # the same for a job that attaches while others are served (it holds them)
#: A job whose WORK is ahead of the adapter this engine holds, with no push heard for this long since its last READY,
#: gets READY again: the push that READY asked for was lost (seen in real pods: a restarted engine's READY reached
#: the trainer before the trainer's own connection to the new pod did, its push timed out, and the trainer waits for
#: another READY before it pushes again), so the trainer pushes anew instead of re-issuing work that is skipped.
ASK_AGAIN_SECONDS = 15.0


class JobSampler(Protocol):
    def sample(self, prompts: Sequence[types.Prompt], adapter: adapters.Adapter | None) -> list[types.RolloutGroup]:
        """One group per prompt, sampled with ``adapter`` (None: the base model, policy v0)."""


class AdapterLoader(loop.WeightLoader, Protocol):
    path: str     # where the last load wrote the adapter


@dataclasses.dataclass(kw_only=True)
class Channel:
    """One attached job as the engine serves it."""

    name: str
    weight: int                       # promptsPerStep x groupSize
    group_size: int
    inbox: transport.Receiver
    verifiers: transport.Sender
    control: transport.Sender
    weights: AdapterLoader
    sampler: JobSampler
    trainer_weights: tuple[str, int] | None
    max_policy_lag: int | None
    fence: push_fence.PushFence = dataclasses.field(default_factory=push_fence.PushFence)
    send_timeout: float = ROLLOUT_SEND_SECONDS
    version: int = 0
    stopped: bool = False
    trainer_hellos: int = 0
    announced: bool = False           # READY went out at the loop's start (its first HELLO needs none)
    asked_at: float | None = None     # when READY was last sent (or a push heard): ASK_AGAIN_SECONDS counts from it
    behind: bool = False              # WORK ahead of the adapter held was skipped, and no push came since
    joining: join.Joining = dataclasses.field(default_factory=join.Joining)   # holds the trainer's adapter yet?


@dataclasses.dataclass(frozen=True, kw_only=True)
class Change:
    """How the set of attached jobs changed (by name): ``went`` are no longer served, ``came`` are to be opened (a
    job whose record changed, e.g. a new key or port, is in both: closed first, then opened)."""

    went: tuple[str, ...] = ()
    came: tuple[str, ...] = ()


class Roster(Protocol):
    """Where the attached jobs come from while the engine runs (``generator.pool.start``: the jobs file)."""

    def poll(self) -> Change | None:
        """What changed since the last poll (None: nothing, or not time to look yet)."""

    def close(self, ch: Channel) -> None:
        """``ch``'s job went: close its sockets and loader (its queue and adapter are already dropped)."""

    def open(self, name: str) -> Channel | None:
        """Open the channel of job ``name`` that came (None: it could not be; the roster offers it again later)."""


@dataclasses.dataclass
class JobLedger:
    """What the engine did for one job (the pool's summary and series)."""

    engine_seconds: float = 0.0       # sampling time spent on its work
    completions: int = 0
    batches: int = 0
    queue_wait_seconds: float = 0.0   # summed over its batches: from arrival to the start of sampling
    skipped: int = 0                  # WORK too new for the adapter held (maxPolicyLag): re-issued by its trainer
    undelivered: int = 0              # groups its verifiers had no room for in time: dropped, re-issued by its trainer
    syncs: int = 0
    versions: list[int] = dataclasses.field(default_factory=list)   # adapter versions its groups were sampled with
    stopped: bool = False
    detached: int = 0                 # times it left the jobs file (deleted, suspended) while the engine ran


@dataclasses.dataclass
class Ledger:
    jobs: dict[str, JobLedger] = dataclasses.field(default_factory=dict)

    def job(self, name: str) -> JobLedger:
        return self.jobs.setdefault(name, JobLedger())

    def shares(self) -> dict[str, float]:
        """Each job's share of the engine's sampling time."""
        total = sum(j.engine_seconds for j in self.jobs.values())
        return {n: (j.engine_seconds / total if total else 0.0) for n, j in self.jobs.items()}


class Observer(Protocol):
    """The pool's series (``observe.PoolObserver``); the single-job generator's ``loop.GeneratorObserver`` too."""

    def sampled(self, *, groups: Sequence[types.RolloutGroup], seconds: float) -> None: ...
    def synced(self, *, version: int, result: loop.SyncResult) -> None: ...
    def sync_failed(self, *, version: int, error: BaseException) -> None: ...
    def skipped(self, *, work: wire.Work, version: int) -> None: ...
    def unexpected(self, *, kind: str) -> None: ...
    def served(self, *, job: str, seconds: float, queue_wait: float, completions: int) -> None: ...


@dataclasses.dataclass(frozen=True)
class _Queued:
    work: wire.Work
    arrived: float


def serve(*, index: int, channels: Sequence[Channel], slots: adapters.Slots, observer: Observer,
          should_stop: Callable[[], bool], ledger: Ledger | None = None,
          beat: Callable[[str], None] = lambda activity: None, clock: Callable[[], float] = time.monotonic,
          poll: float = POLL_SECONDS, roster: Roster | None = None) -> Ledger:
    """Serve every channel until ``should_stop`` (a pool outlives its jobs: a stopped job's channel stays quiet);
    with a ``roster``, the jobs that come and go while it runs too."""
    ledger = ledger if ledger is not None else Ledger()
    sched: fairshare.Scheduler[_Queued] = fairshare.Scheduler()
    channels = list(channels)
    for ch in channels:
        ledger.job(ch.name)
        _announce(ch, index=index, clock=clock)
    while not should_stop():
        beat("idle")
        change = roster.poll() if roster is not None else None
        if change is not None and roster is not None:
            serving = bool(channels)
            for ch in regroup(channels, change, roster=roster, sched=sched, slots=slots, ledger=ledger):
                # opened while others are served: its trainer may not be up yet, so it holds them a second at most;
                # else (a restarted engine's jobs: their trainers are up and waiting) the start's bound
                _announce(ch, index=index, timeout=LATE_ANNOUNCE_SECONDS if serving else ANNOUNCE_SECONDS,
                          clock=clock)
        got = False
        for ch in channels:
            got = _drain(ch, index=index, sched=sched, slots=slots, observer=observer, ledger=ledger,
                         beat=beat, clock=clock) or got
            _ask_again(ch, index=index, clock=clock)
        nxt = sched.next()
        if nxt is None:
            if not got:
                time.sleep(poll)
            continue
        name, queued = nxt
        ch = next(c for c in channels if c.name == name)
        _sample(ch, queued, index=index, slots=slots, observer=observer, ledger=ledger, beat=beat, clock=clock)
    for ch in channels:
        if not ch.stopped:       # still attached: its trainer re-issues this engine's work (best effort)
            _leave(ch, index=index)
    return ledger


def regroup(channels: list[Channel], change: Change, *, roster: Roster, sched: fairshare.Scheduler[Any],
            slots: adapters.Slots, ledger: Ledger) -> list[Channel]:
    """Apply ``change`` to ``channels`` (in place): the jobs that went are detached (queue, adapter) and closed
    before those that came are opened, so a port block a job left can be taken by one that came at once. Returns
    the channels opened."""
    opened_now: list[Channel] = []
    for name in change.went:
        ch = next((c for c in channels if c.name == name), None)
        if ch is None:
            continue
        sched.remove(name)
        slots.drop(name)
        channels.remove(ch)
        ledger.job(name).detached += 1
        roster.close(ch)
    for name in change.came:
        if any(c.name == name for c in channels):
            continue
        opened = roster.open(name)
        if opened is not None:
            channels.append(opened)
            ledger.job(name)
            opened_now.append(opened)
    return opened_now


def _announce(ch: Channel, *, index: int, timeout: float = ANNOUNCE_SECONDS,
              clock: Callable[[], float] = time.monotonic) -> None:
    """READY to the job's trainer 0 when its channel opens, as a generator's start says it: to a trainer that ran
    with this engine before (the engine restarted) it asks for the current adapter at once. Best effort: a trainer
    not reached within ``timeout`` gets its READY with its first HELLO."""
    try:
        ch.control.send(wire.Ready(role="generator", index=index, policy_version=ch.version),
                        timeout=timeout)
        ch.announced = True
        ch.asked_at = clock()
    except transport.TransportError:
        pass


def _trainer_hellos(ch: Channel) -> int:
    return sum(1 for h in ch.inbox.hellos if h.role == "trainer" and h.index == 0)


def _drain(ch: Channel, *, index: int, sched: fairshare.Scheduler[_Queued], slots: adapters.Slots,
           observer: Observer, ledger: Ledger, beat: Callable[[str], None], clock: Callable[[], float]) -> bool:
    """Take what ``ch``'s trainer sent; True when anything came."""
    got = False
    for _ in range(DRAIN_LIMIT):
        msg = ch.inbox.recv(timeout=0)
        hellos = _trainer_hellos(ch)
        if hellos > ch.trainer_hellos:        # trainer 0 connected (or restarted): it waits for this engine's READY
            again = ch.trainer_hellos > 0
            if again:                         # a new trainer: as to a restarted generator, it pushes its policy anew
                sched.remove(ch.name)
                slots.drop(ch.name)
                ch.version, ch.stopped, ch.joining = 0, False, join.Joining()
            sched.add_job(ch.name, weight=ch.weight)
            ch.trainer_hellos = hellos
            if again or not ch.announced:
                ch.control.send(wire.Ready(role="generator", index=index, policy_version=ch.version))
                ch.asked_at = clock()
        if msg is None:
            return got
        got = True
        if isinstance(msg, wire.Stop):
            _stop(ch, msg, sched=sched, slots=slots, ledger=ledger)
            return got
        if isinstance(msg, wire.Work):
            if not ch.joining.admit(msg, version=ch.version) or (
                    ch.max_policy_lag is not None and msg.policy_version - ch.version > ch.max_policy_lag):
                observer.skipped(work=msg, version=ch.version)
                ledger.job(ch.name).skipped += 1
                ch.behind = ch.behind or msg.policy_version > ch.version
                continue
            sched.push(ch.name, _Queued(work=msg, arrived=clock()), cost=len(msg.prompts) * ch.group_size or 1)
        elif isinstance(msg, wire.Sync):
            ch.asked_at, ch.behind = clock(), False     # a push came: ASK_AGAIN_SECONDS counts from here
            _sync(ch, msg, index=index, slots=slots, observer=observer, ledger=ledger, beat=beat)
        else:
            observer.unexpected(kind=type(msg).__name__)
    return got


def _ask_again(ch: Channel, *, index: int, clock: Callable[[], float]) -> None:
    """READY again to a trainer whose WORK was ahead of the adapter this engine holds and that pushed nothing for
    ``ASK_AGAIN_SECONDS`` since the last READY (its push was lost); best effort, a second at most."""
    now = clock()
    if not ch.behind or (ch.asked_at is not None and now - ch.asked_at < ASK_AGAIN_SECONDS):
        return
    ch.asked_at = now
    try:
        ch.control.send(wire.Ready(role="generator", index=index, policy_version=ch.version), timeout=1.0)
    except transport.TransportError:
        pass


def _sync(ch: Channel, msg: wire.Sync, *, index: int, slots: adapters.Slots, observer: Observer, ledger: Ledger,
          beat: Callable[[str], None]) -> None:
    """``generator.loop.sync`` with the job's loader; a load that succeeded (its loader wrote a folder) becomes the
    job's adapter, whatever its version (a trainer resumed from a checkpoint pushes an older one)."""
    ch.weights.path = ""
    ch.version = loop.sync(msg, index=index, version=ch.version, weights=ch.weights, control=ch.control,
                           observer=observer, beat=beat, trainer_weights=ch.trainer_weights, leave=None,
                           fence=ch.fence)
    if ch.weights.path:
        slots.publish(ch.name, version=ch.version, path=ch.weights.path)
        ch.joining.loaded(version=ch.version)
        ledger.job(ch.name).syncs += 1


def _sample(ch: Channel, queued: _Queued, *, index: int, slots: adapters.Slots, observer: Observer, ledger: Ledger,
            beat: Callable[[str], None], clock: Callable[[], float]) -> None:
    beat("generate")
    started = clock()
    adapter = slots.acquire(ch.name)
    try:
        groups = ch.sampler.sample(queued.work.prompts, adapter)
    finally:
        slots.release(adapter)
    seconds = clock() - started
    version = adapter.version if adapter is not None else 0
    for g in groups:
        g.policy_version = version
        g.step = queued.work.step
        g.generator = index
    observer.sampled(groups=groups, seconds=seconds)
    done = sum(len(g.completions) for g in groups)
    j = ledger.job(ch.name)
    j.engine_seconds += seconds
    j.completions += done
    j.batches += 1
    j.queue_wait_seconds += started - queued.arrived
    if not j.versions or j.versions[-1] != version:
        j.versions.append(version)
    observer.served(job=ch.name, seconds=seconds, queue_wait=started - queued.arrived, completions=done)
    try:
        ch.verifiers.send_many([wire.Rollout(group=g) for g in groups], timeout=ch.send_timeout)
    except transport.TransportError:   # its verifiers stopped taking groups: that job's loss alone
        j.undelivered += len(groups)


def _stop(ch: Channel, msg: wire.Stop, *, sched: fairshare.Scheduler[_Queued], slots: adapters.Slots,
          ledger: Ledger) -> None:
    """The job's run ended: STOP on to its verifiers, its queue and adapter slot released."""
    for v in range(ch.verifiers.peers):
        try:
            ch.verifiers.send(msg, to=v, timeout=2.0)
        except transport.TransportError:
            pass
    sched.remove(ch.name)
    slots.drop(ch.name)
    ch.stopped = True
    ledger.job(ch.name).stopped = True


def _leave(ch: Channel, *, index: int) -> None:
    try:
        ch.control.send(wire.Ack(role="generator", index=index, of=wire.Kind.STOP, version=ch.version), timeout=2.0)
    except transport.TransportError:
        pass


def summary(ledger: Ledger, slots: adapters.Slots) -> dict[str, Any]:
    """The engine's summary (JSON): per job its share of engine time, completions, queue wait, adapter swaps."""
    shares = ledger.shares()
    out: dict[str, Any] = {}
    for name, j in ledger.jobs.items():
        st = slots.stats[name]
        out[name] = {"engine_seconds": round(j.engine_seconds, 3), "engine_share": round(shares[name], 4),
                     "completions": j.completions, "batches": j.batches,
                     "queue_wait_seconds": round(j.queue_wait_seconds, 3), "skipped": j.skipped, "syncs": j.syncs,
                     "undelivered": j.undelivered,
                     "adapter_versions": j.versions, "adapter_loads": st.loads, "adapter_swaps": st.swaps,
                     "adapter_swap_seconds": round(st.swap_seconds, 4), "stopped": j.stopped,
                     "detached": j.detached}
    return out
