"""Router: turns a stream of watch events into coalesced, per-job reconcile passes on worker threads.

Role: the only state the operator keeps between passes is here, and it is all soft (losing it on restart costs
one extra pass): a dirty flag per job, failures seen in watch events, and a timer per job for deadlines/TTLs.

    kopf handlers ──request(key)──▶ [job state: dirty, failures, timer]
                                        │  one drain task per job at a time (asyncio, kopf's loop)
                                        ▼
                        executor thread: reconcile.reconcile(...)  ── sync API client
                                        │
                  requeue_after / error backoff ──call_later──▶ request(key)

Invariants: at most one pass per job runs at a time (no two passes race on one job's children); an event that
arrives during a pass makes exactly one more pass; failures seen in events are handed to the next pass.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable

from kubeforge.operator import metrics, observed, reconcile, timefmt

log = logging.getLogger("kubeforge.operator")
Key = tuple[str, str]
Work = Callable[[Key, list[observed.Failure]], reconcile.Outcome]

MAX_BACKOFF = 60.0


@dataclasses.dataclass
class _JobState:
    dirty: bool = False
    since: float | None = None          # monotonic time of the oldest request not yet served by a pass
    trigger: str = "rljob"
    failures: list[observed.Failure] = dataclasses.field(default_factory=list)
    task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None
    backoff: float = 1.0
    running_seen: bool = False
    recovering: tuple[str, float] | None = None    # (action, monotonic time of the restart decision)


class Router:
    def __init__(self, work: Work, *, invalidate: Callable[[Key], None] = lambda key: None,
                 workers: int = 8) -> None:
        self._work = work
        self._invalidate = invalidate
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reconcile")
        self._jobs: dict[Key, _JobState] = {}
        #: routers shut down with this one (the GeneratorPools' beside the RLJobs': ``main.build``)
        self.companions: list[Router] = []

    def request(self, key: Key, *, trigger: str, invalidate: bool = False) -> None:
        """Ask for a pass of ``key`` (coalesced with any pending request); ``invalidate``: a child was deleted,
        so the next pass must re-send every object."""
        if invalidate:
            self._invalidate(key)
        st = self._jobs.setdefault(key, _JobState())
        if not st.dirty:
            st.trigger = trigger
        st.dirty = True
        if st.since is None:
            st.since = time.monotonic()
        if st.task is None or st.task.done():
            st.task = asyncio.get_running_loop().create_task(self._drain(key, st))

    def note_failure(self, key: Key, failure: observed.Failure) -> None:
        """Remember a failure seen in a watch event until the next pass consumes it."""
        st = self._jobs.setdefault(key, _JobState())
        if failure not in st.failures:
            st.failures.append(failure)

    def forget(self, key: Key) -> None:
        st = self._jobs.pop(key, None)
        if st and st.timer:
            st.timer.cancel()
        metrics.set_phase(key, None)

    def _schedule(self, key: Key, st: _JobState, delay: float, trigger: str) -> None:
        if st.timer:
            st.timer.cancel()
        loop = asyncio.get_running_loop()
        st.timer = loop.call_later(max(delay, 0.05), lambda: self.request(key, trigger=trigger))

    async def _drain(self, key: Key, st: _JobState) -> None:
        loop = asyncio.get_running_loop()
        while st.dirty:
            st.dirty = False
            since, st.since = st.since, None
            failures, st.failures = st.failures, []
            trigger = st.trigger
            metrics.RECONCILES.labels(trigger).inc()
            try:
                out = await loop.run_in_executor(self._pool, self._timed, key, failures)
            except Exception:
                metrics.ERRORS.labels(trigger).inc()
                log.exception("reconcile of %s/%s failed; retrying in %.0fs", *key, st.backoff)
                st.failures = failures + st.failures
                self._schedule(key, st, st.backoff, "retry")
                st.backoff = min(st.backoff * 2, MAX_BACKOFF)
                continue
            finally:
                done = time.monotonic()
                metrics.LATENCY.observe(done - (since if since is not None else done))
            st.backoff = 1.0
            self._observe(key, st, out)
            if out.gone:
                self.forget(key)
                return
            if out.requeue_after is not None:
                self._schedule(key, st, out.requeue_after + 0.5, "timer")

    def _timed(self, key: Key, failures: list[observed.Failure]) -> reconcile.Outcome:
        """The pass itself, timed on its worker thread (not the wait for a free worker)."""
        started = time.monotonic()
        try:
            return self._work(key, failures)
        finally:
            metrics.DURATION.observe(time.monotonic() - started)

    def _observe(self, key: Key, st: _JobState, out: reconcile.Outcome) -> None:
        metrics.set_phase(key, out.phase)
        for kind, n in out.fenced.items():
            metrics.FENCED.labels(kind).inc(n)
        d = out.decision
        if d is not None and d.cause is not None:
            metrics.RESTARTS.labels(d.cause.role, d.cause.reason, d.action).inc()
            if d.counts:
                st.recovering = (d.action, time.monotonic())
        elif st.recovering is not None and out.all_ready:
            metrics.RECOVERY.labels(st.recovering[0]).observe(time.monotonic() - st.recovering[1])
            st.recovering = None
        if out.phase == "Running" and out.previous_phase != "Running" and not st.running_seen:
            st.running_seen = True
            created = timefmt.parse(out.created)
            if created is not None:
                metrics.GANG_RUNNING.observe((dt.datetime.now(dt.timezone.utc) - created).total_seconds())

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for other in self.companions:
            other.shutdown()
