"""The skewed-lengths workload of ``bench_partial_rollouts.py --skewed``, its idle accounting and the in-process
harness that runs the generator's two loops against it (unit-tested with a fake engine: tests/test_bench_skewed.py;
the bench adds the vLLM engine).

Role and neighbours: :func:`run_mode` drives one of the generator's production loops, ``generator.loop.run`` (whole
batch: a WORK's requests run until the last one finishes) or ``generator.partial.run`` (``partialRollouts``: work
joins the running batch, groups leave as they finish), over a ``generator.stepper.Pool`` on the engine backend it
is given, from :class:`StandIn`, which hands out work as trainer 0's loop does (``trainer.loop``: the WORK of
steps up to s + maxPolicyLag out; once step s is complete, SYNC(v = s + 1), then the WORK of step
s + 1 + maxPolicyLag), with no training in between unless asked (``train_seconds``: a trainer that keeps up).

```
 StandIn ──WORK / SYNC / STOP (mem://)──▶ loop.run | partial.run ─▶ Pool ─▶ Metered(backend) ─▶ engine
    ▲                                                                      (each engine step: seconds, batch)
    └───────────────────────── ROLLOUT (mem://) ─────────────────────────────┘
```

The workload (:class:`Skew`): each completion's length is drawn before it starts from a seeded mixture, most
short (uniform in 1..maxNewTokens/8) and a fraction ``long_fraction`` near the cap (uniform in 3/4..1 of
maxNewTokens), and the engine enforces it (``max_tokens`` = the length, EOS ignored). Why the engine and not the
model: both modes then decode exactly the same tokens (completions/s compare equal work), and the skew does not
depend on what a model learns (session 14's calibrated EOS head drifted to full-length completions within five
steps) nor on whether a small model can follow a length instruction (the tiny one cannot).

Invariants:
- A completion's length depends on (seed, the pool's prompt serial, sample index) only. The pool numbers prompts
  in the order their WORK arrives, the same in both loops (WORK goes out in step order; nothing is re-issued
  here), so both modes decode the same lengths; :func:`run_mode` reports the token total to check it.
- Idle accounting (:func:`occupancy`): capacity B = one step's requests (promptsPerStep x groupSize, the batch the
  whole-batch engine starts each step with); idle fraction = 1 - sum(step seconds x min(running, B)) / (B x wall),
  wall = the first request added to the last engine step's end: the slots stragglers leave empty, plus any time
  the engine does not step at all. A batch above B counts as full, not more (its cost shows in completions/s).
- No wait is unbounded: the stand-in gives up after ``deadline`` seconds without a step completing, and stops the
  generator's loop.
"""
from __future__ import annotations

import dataclasses
import random
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from kubeforge.runtime import transport, types, wire
from kubeforge.runtime.generator import loop, partial, stepper


@dataclasses.dataclass(frozen=True, kw_only=True)
class Skew:
    """Completion lengths: most short, ``long_fraction`` near ``max_new_tokens`` (see the module docstring)."""

    max_new_tokens: int
    long_fraction: float = 1 / 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 8:
            raise ValueError(f"max_new_tokens must be >= 8, got {self.max_new_tokens}")
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ValueError(f"long_fraction must be within [0, 1], got {self.long_fraction}")

    @property
    def short_max(self) -> int:
        return self.max_new_tokens // 8

    @property
    def long_min(self) -> int:
        return (3 * self.max_new_tokens) // 4

    def length(self, *, key: int, sample: int) -> int:
        """The length of sample ``sample`` of the pool's prompt ``key``: the same for the same seed, in any mode."""
        rng = random.Random(f"{self.seed}/{key}/{sample}")     # str seeds hash the same in every process
        if rng.random() < self.long_fraction:
            return rng.randint(self.long_min, self.max_new_tokens)
        return rng.randint(1, self.short_max)

    def mean(self) -> float:
        """The mean length the mixture draws."""
        f = self.long_fraction
        return (1 - f) * (1 + self.short_max) / 2 + f * (self.long_min + self.max_new_tokens) / 2


def request_key(request_id: str) -> tuple[int, int]:
    """(prompt serial, sample index) of a ``stepper.Pool`` request id (``kf-{serial}-{i}``)."""
    prefix, key, sample = request_id.split("-")
    if prefix != "kf":
        raise ValueError(f"not a pool request id: {request_id!r}")
    return int(key), int(sample)


class Metered:
    """A ``stepper.Backend`` around another: records each engine step's seconds and the requests it ran."""

    def __init__(self, inner: stepper.Backend, *, clock: Callable[[], float] = time.perf_counter) -> None:
        self.inner = inner
        self.clock = clock
        self.running: set[str] = set()
        self.records: list[tuple[float, int]] = []     # (seconds, requests running) per engine step
        self.first_add: float | None = None
        self.last_end: float | None = None

    def encode(self, prompt: types.Prompt) -> list[int]:
        return self.inner.encode(prompt)

    def add(self, request_id: str, prompt_ids: list[int], *, seed: int | None) -> None:
        if self.first_add is None:
            self.first_add = self.clock()
        self.running.add(request_id)
        self.inner.add(request_id, prompt_ids, seed=seed)

    def step(self) -> list[stepper.Delta]:
        running = len(self.running)
        started = self.clock()
        out = self.inner.step()
        self.last_end = self.clock()
        self.records.append((self.last_end - started, running))
        self.running.difference_update(d.request_id for d in out if d.finished)
        return out

    def abort(self, request_ids: list[str]) -> None:
        self.running.difference_update(request_ids)
        self.inner.abort(request_ids)

    def wall(self) -> float:
        """The first request added to the last step's end (0 before any step)."""
        if self.first_add is None or self.last_end is None:
            return 0.0
        return self.last_end - self.first_add


class Simulated:
    """A ``stepper.Backend`` with no engine behind it: each step adds one token to every running request, a request
    runs ``length(request_id)`` tokens, and ``clock`` advances by ``cost(batch)`` per step and by nothing else (the
    step costs alone, without a loop's own time). Each step also sleeps ``sleep`` real seconds, as an engine's
    forward gives the stand-in's thread time to answer. The unit tests' engine; the bench replays its workload on
    the step costs it measured (what the two modes would give if those were all that counted)."""

    def __init__(self, *, length: Callable[[str], int], cost: Callable[[int], float] = lambda batch: 0.01,
                 sleep: float = 0.001) -> None:
        self.length = length
        self.cost = cost
        self.sleep = sleep
        self.now = 0.0
        self.running: dict[str, list[int]] = {}

    def clock(self) -> float:
        return self.now

    def encode(self, prompt: types.Prompt) -> list[int]:
        return [ord(c) for c in prompt.text]

    def add(self, request_id: str, prompt_ids: list[int], *, seed: int | None) -> None:
        self.running[request_id] = [0, self.length(request_id)]

    def step(self) -> list[stepper.Delta]:
        self.now += self.cost(len(self.running))
        time.sleep(self.sleep)
        out = []
        for rid, state in list(self.running.items()):
            state[0] += 1
            done = state[0] >= state[1]
            out.append(stepper.Delta(request_id=rid, token_ids=[7], logprobs=[-1.0], text="x", finished=done,
                                     finish_reason="length" if done else ""))
            if done:
                del self.running[rid]
        return out

    def abort(self, request_ids: list[str]) -> None:
        for r in request_ids:
            self.running.pop(r, None)


def interpolate(points: Sequence[tuple[int, float]]) -> Callable[[int], float]:
    """Step seconds at any batch from (batch, seconds) points: linear between them, flat outside."""
    pts = sorted(points)
    if not pts:
        raise ValueError("points must not be empty")

    def cost(batch: int) -> float:
        if batch <= pts[0][0]:
            return pts[0][1]
        for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
            if batch <= b1:
                return s0 + (s1 - s0) * (batch - b0) / (b1 - b0)
        return pts[-1][1]

    return cost


def occupancy(records: Sequence[tuple[float, int]], *, capacity: int, wall: float) -> dict[str, Any]:
    """Idle accounting of one run (the module's invariants): ``idle_fraction``, the part of the wall time the engine
    stepped (``busy_fraction``), the time-weighted mean batch it ran and its step count."""
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    busy = sum(s for s, _ in records)
    if wall <= 0 or busy > wall * (1 + 1e-9):
        raise ValueError(f"wall must be > 0 and cover the steps' {busy:.6f} s, got {wall}")
    filled = sum(s * min(n, capacity) for s, n in records)
    return {"idle_fraction": round(1.0 - filled / (capacity * wall), 4), "busy_fraction": round(busy / wall, 4),
            "mean_batch": round(sum(s * n for s, n in records) / busy, 2) if busy > 0 else 0.0,
            "engine_steps": len(records)}


class WholeBatch:
    """``generator.loop.Sampler`` over the pool: a WORK's requests added at once and stepped until the last one
    finishes (what ``Engine.generate`` does inside vLLM), so both modes run on one backend with the same lengths."""

    def __init__(self, pool: stepper.Pool, *, seed: int) -> None:
        self.pool = pool
        self.seed = seed
        self.calls = 0

    def sample(self, prompts: Sequence[types.Prompt]) -> list[types.RolloutGroup]:
        self.calls += 1
        self.pool.add(prompts, step=0, version=0, seed=self.seed + self.calls * 31)   # the loop stamps both
        out: list[types.RolloutGroup] = []
        while self.pool.busy():
            out += self.pool.step()
        order = {p.index: i for i, p in enumerate(prompts)}
        return sorted(out, key=lambda g: order[g.prompt.index])


class NoLoad:
    """``loop.WeightLoader`` that loads nothing (the weights do not change here): a SYNC costs its message and
    ``reset`` (the bench: the prefix-cache reset every real load ends with)."""

    def __init__(self, reset: Callable[[], object] = lambda: None) -> None:
        self.reset = reset
        self.loads = 0

    def load(self, sync: wire.Sync) -> loop.SyncResult:
        self.loads += 1
        self.reset()
        return loop.SyncResult(seconds=0.0, bytes=0)


class Quiet:
    """``loop.GeneratorObserver`` that counts what a healthy run never does."""

    def __init__(self) -> None:
        self.skipped_work = 0
        self.unexpected_kinds: list[str] = []
        self.sync_failures = 0

    def sampled(self, *, groups: Sequence[types.RolloutGroup], seconds: float) -> None: ...
    def synced(self, *, version: int, result: loop.SyncResult) -> None: ...

    def sync_failed(self, *, version: int, error: BaseException) -> None:
        self.sync_failures += 1

    def skipped(self, *, work: wire.Work, version: int) -> None:
        self.skipped_work += 1

    def unexpected(self, *, kind: str) -> None:
        self.unexpected_kinds.append(kind)


def prompts_of(step: int, *, prompts_per_step: int, seed: int) -> tuple[types.Prompt, ...]:
    """Step ``step``'s prompts: short copy-task texts, indexes ``[step*P, (step+1)*P)`` as the trainer's cursor."""
    out = []
    for k in range(step * prompts_per_step, (step + 1) * prompts_per_step):
        rng = random.Random(f"prompt/{seed}/{k}")
        word = "".join(rng.choice("abcdefgh") for _ in range(6))
        out.append(types.Prompt(index=k, text=f"Copy: {word}\n", answer=word))
    return tuple(out)


@dataclasses.dataclass(kw_only=True)
class StandIn:
    """Trainer 0 as far as the generator sees it (the module docstring); :meth:`run` returns what arrived."""

    to_generator: transport.Sender
    rollouts: transport.Receiver
    control: transport.Receiver
    steps: int
    prompts_per_step: int
    group_size: int
    ahead: int
    seed: int
    train_seconds: float = 0.0
    deadline: float = 600.0
    clock: Callable[[], float] = time.perf_counter

    def run(self) -> dict[str, Any]:
        self._expect_ready()
        started = self.clock()
        for s in range(min(self.ahead + 1, self.steps)):
            self._work(s, version=0)
        groups: dict[int, int] = {}
        completions = tokens = 0
        current, last_progress = 0, self.clock()
        while current < self.steps:
            if self.clock() - last_progress > self.deadline:
                raise TimeoutError(f"step {current}: {groups.get(current, 0)} of {self.prompts_per_step} groups "
                                   f"after {self.deadline:.0f} s")
            msg = self.rollouts.recv(timeout=0.5)
            if not isinstance(msg, wire.Rollout):
                continue
            g = msg.group
            groups[g.step] = groups.get(g.step, 0) + 1
            completions += len(g.completions)
            tokens += sum(len(c.token_ids) for c in g.completions)
            while current < self.steps and groups.get(current, 0) == self.prompts_per_step:
                last_progress = self.clock()
                if self.train_seconds > 0:
                    time.sleep(self.train_seconds)
                current += 1
                if current < self.steps:      # trainer.loop: push v = s + 1, then issue up to s + 1 + ahead
                    self.to_generator.send(wire.Sync(version=current, step=current, host="stand-in", port=1,
                                                     world_size=2))
                    if current + self.ahead < self.steps:
                        self._work(current + self.ahead, version=current)
        wall = self.clock() - started
        self.to_generator.send(wire.Stop(reason="bench done"))
        return {"completions": completions, "tokens": tokens, "groups": sum(groups.values()),
                "wall_seconds": round(wall, 3), "completions_per_s": round(completions / wall, 3)}

    def _expect_ready(self) -> None:
        until = self.clock() + self.deadline
        while self.clock() < until:
            if isinstance(self.control.recv(timeout=0.5), wire.Ready):
                return
        raise TimeoutError(f"the generator sent no READY within {self.deadline:.0f} s")

    def _work(self, step: int, *, version: int) -> None:
        self.to_generator.send(wire.Work(step=step, policy_version=version, prompts=prompts_of(
            step, prompts_per_step=self.prompts_per_step, seed=self.seed)))


def run_mode(*, partial_rollouts: bool, backend: stepper.Backend, steps: int, prompts_per_step: int,
             group_size: int, max_policy_lag: int, seed: int, train_seconds: float = 0.0,
             synced: Callable[[], None] = lambda: None, reset: Callable[[], object] = lambda: None,
             deadline: float = 600.0, clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """One run of the generator's loop (``partial_rollouts``: ``partial.run``, else ``loop.run``) against the
    stand-in; ``synced`` is partial.run's hook after a load (the vLLM backend's deferred prefix-cache reset),
    ``reset`` what every load does, ``clock`` the idle accounting's (tests inject one). The stand-in's figures,
    the idle accounting and the pool's counters."""
    run_id = uuid.uuid4().hex
    gen, ctl, out = (f"mem://skew-{kind}-{run_id}" for kind in ("gen", "ctl", "out"))
    inbox, control_in, rollouts_in = (transport.open_receiver(a) for a in (gen, ctl, out))
    to_gen = transport.open_sender([gen], role="trainer", index=0)       # the stand-in's; the generator's two:
    control, verifiers = (transport.open_sender([a], role="generator", index=0) for a in (ctl, out))
    metered = Metered(backend, clock=clock)
    pool = stepper.Pool(metered, group_size=group_size)
    observer, weights = Quiet(), NoLoad(reset)
    stand_in = StandIn(to_generator=to_gen, rollouts=rollouts_in, control=control_in, steps=steps,
                       prompts_per_step=prompts_per_step, group_size=group_size, ahead=max_policy_lag, seed=seed,
                       train_seconds=train_seconds, deadline=deadline)
    failed = threading.Event()
    result: dict[str, Any] = {}

    def drive() -> None:
        try:
            result.update(stand_in.run())
        except BaseException as exc:        # re-raised below, on the caller's thread
            result["error"] = exc
            failed.set()

    thread = threading.Thread(target=drive, name="skew-stand-in", daemon=True)
    common: dict[str, Any] = dict(index=0, inbox=inbox, verifiers=verifiers, control=control, weights=weights,
                                  observer=observer, max_policy_lag=max_policy_lag, should_stop=failed.is_set)
    try:
        thread.start()
        if partial_rollouts:
            partial.run(**common, pool=pool, seed=lambda step: seed + (step + 1) * 31, synced=synced,
                        activity=partial.Activity())
        else:
            loop.run(**common, sampler=WholeBatch(pool, seed=seed))
        thread.join(deadline)
    finally:
        for s in (to_gen, control, verifiers):
            s.close()
        for r in (inbox, control_in, rollouts_in):
            r.close()
    if "error" in result:
        raise RuntimeError(f"the stand-in trainer failed: {result['error']}") from result["error"]
    return {**result, **occupancy(metered.records, capacity=prompts_per_step * group_size, wall=metered.wall()),
            "engine_wall_seconds": round(metered.wall(), 4), "switches": pool.counters.switches, "switched_completions": pool.counters.switched_completions,
            "syncs": weights.loads, "skipped_work": observer.skipped_work,
            "unexpected": observer.unexpected_kinds, "sync_failures": observer.sync_failures}
