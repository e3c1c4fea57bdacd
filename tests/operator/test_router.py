"""The router coalesces events per job, runs one pass per job at a time, hands over failures, requeues."""
from __future__ import annotations

import asyncio
import threading
import time

from kubeforge.operator import observed, reconcile, router


def test_coalescing_and_failure_handover() -> None:
    calls: list[tuple[tuple[str, str], list[observed.Failure]]] = []
    running = threading.Event()
    release = threading.Event()
    concurrent = [0, 0]

    def work(key: tuple[str, str], failures: list[observed.Failure]) -> reconcile.Outcome:
        concurrent[0] += 1
        concurrent[1] = max(concurrent[1], concurrent[0])
        calls.append((key, list(failures)))
        running.set()
        release.wait(5)
        concurrent[0] -= 1
        return reconcile.Outcome(phase="Pending")

    async def scenario() -> None:
        r = router.Router(work, workers=4)
        key = ("ns", "a")
        r.request(key, trigger="rljob")
        await asyncio.get_running_loop().run_in_executor(None, running.wait, 5)
        f = observed.Failure(role="trainer", pod="a-trainer-0", attempt=0, exit_code=1, reason="Error", time=None)
        for _ in range(20):       # a burst during the pass: exactly one more pass
            r.note_failure(key, f)
            r.request(key, trigger="pod")
        release.set()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(calls) >= 2 and r._jobs[key].task.done():  # noqa: SLF001
                break
        r.shutdown()

    asyncio.run(scenario())
    assert len(calls) == 2 and concurrent[1] == 1
    assert calls[0][1] == [] and len(calls[1][1]) == 1


def test_requeue_after_and_error_retry() -> None:
    stamps: list[float] = []

    def work(key: tuple[str, str], failures: list[observed.Failure]) -> reconcile.Outcome:
        stamps.append(time.monotonic())
        if len(stamps) == 1:
            raise RuntimeError("API down")
        return reconcile.Outcome(phase="Running", requeue_after=0.0 if len(stamps) == 2 else None)

    async def scenario() -> None:
        r = router.Router(work)
        r.request(("ns", "b"), trigger="rljob")
        await asyncio.sleep(3.0)
        r.shutdown()

    asyncio.run(scenario())
    assert len(stamps) == 3          # error → retry after 1 s backoff → requeue → done
    assert stamps[1] - stamps[0] >= 0.9
