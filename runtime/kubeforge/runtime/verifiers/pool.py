"""Running one group's verifier calls concurrently, each within its time limit; process workers for isolation.

Neighbours: ``score.Scorer`` hands ``Pool.run`` the calls of one group (verifier name -> prompt and the completions
that missed the cache) and gets an ``Outcome`` per verifier; ``registry`` wraps ``isolation: Process`` verifiers in
``ProcessVerifier``.

```
 Pool.run ──submit──▶ thread pool: slow / Process-isolated verifiers ─┐
          ──inline──▶ cheap rule verifiers (bounded by themselves)    ├─▶ Outcome per verifier
          ◀──wait for each until its verifier's deadline ─────────────┘   (scores | error | timed out)
```

Invariants:
- A call that raises, overruns its ``timeout`` or returns the wrong count / a non-number / an infinite score gives
  an ``Outcome`` with ``scores=None`` and the reason; NaN means "this completion has no score" and is passed on.
- A thread that overran keeps running in the background (Python threads cannot be killed): the pool has a bounded
  number of threads, so a verifier that hangs for ever must be ``isolation: Process``: ``ProcessVerifier`` kills its
  worker on overrun and starts a fresh one for the next call. The pool's threads are daemon threads, so a hung
  call never holds up the process's exit (``concurrent.futures``' own pool joins its threads at exit).
- Nothing here pickles data: a process worker receives its spec as JSON and exchanges JSON frames over a pipe; the
  function that builds its verifier (``registry.build_inner``) travels by reference, so this module needs no
  ``registry`` (which needs this one for ``ProcessVerifier``).
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import math
import multiprocessing
import multiprocessing.connection
import queue
import threading
import time
from typing import Any, Callable, Mapping, Sequence

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.verifiers import base

GRACE_S = 0.5          # a process worker's own deadline fires first; the pool waits this much longer
START_TIMEOUT_S = 120  # a process worker must build its verifier within this

Builder = Callable[[rljob.VerifierSpec], base.Verifier]   # a spec -> the verifier itself, in this process


@dataclasses.dataclass(frozen=True)
class Outcome:
    scores: list[float] | None
    error: str | None = None
    timed_out: bool = False


def _validated(got: Any, n: int) -> list[float]:
    vals = [float(s) for s in got]
    if len(vals) != n:
        raise ValueError(f"{len(vals)} scores for {n} completions")
    if math.inf in vals or -math.inf in vals:
        raise ValueError("infinite score")
    return vals


def call(verifier: base.Verifier, prompt: types.Prompt, texts: Sequence[str]) -> Outcome:
    """One call in the current thread, validated."""
    try:
        return Outcome(_validated(verifier.score(prompt, texts), len(texts)))
    except TimeoutError as e:
        return Outcome(None, f"timed out: {e}", timed_out=True)
    except Exception as e:  # a verifier bug scores its group as missing, never crashes the role
        return Outcome(None, f"{type(e).__name__}: {e}")


class DaemonThreads:
    """A bounded pool of daemon threads handing out ``concurrent.futures.Future``s. Unlike
    ``ThreadPoolExecutor``, whose threads the interpreter joins at exit, a call that never returns here cannot keep
    the role's process alive after it is done."""

    def __init__(self, max_workers: int, *, name: str) -> None:
        self._max = max(1, max_workers)
        self._name = name
        self._work: queue.SimpleQueue[tuple[cf.Future[Any], Any, tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Any, *args: Any) -> cf.Future[Any]:
        fut: cf.Future[Any] = cf.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("submit after shutdown")
            self._work.put((fut, fn, args))
            if self._idle == 0 and len(self._threads) < self._max:
                t = threading.Thread(target=self._worker, name=f"{self._name}_{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
            else:
                self._idle -= 1 if self._idle else 0
        return fut

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            fut, fn, args = item
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn(*args))
                except BaseException as e:  # handed to the waiter, like ThreadPoolExecutor
                    fut.set_exception(e)
            with self._lock:
                self._idle += 1

    def shutdown(self) -> None:
        """Cancel what has not started; idle threads end, busy ones end when their call returns (or never)."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for _ in self._threads:
                self._work.put(None)


class Pool:
    def __init__(self, verifiers: Mapping[str, base.Verifier], *, timeouts: Mapping[str, float],
                 inline: set[str], threads: int | None = None) -> None:
        self.verifiers = dict(verifiers)
        self.timeouts = dict(timeouts)
        self.inline = set(inline) & set(self.verifiers)
        slow = len(self.verifiers) - len(self.inline)
        self._executor = DaemonThreads(threads or max(2, 2 * slow), name="verifier") if slow else None

    def run(self, calls: Mapping[str, tuple[types.Prompt, list[str]]]) -> dict[str, Outcome]:
        out: dict[str, Outcome] = {}
        pending: dict[str, tuple[cf.Future[Outcome], float]] = {}
        for name, (prompt, texts) in calls.items():
            if name not in self.inline and self._executor is not None:
                v = self.verifiers[name]
                fut = self._executor.submit(call, v, prompt, texts)
                grace = float(getattr(v, "pool_grace_s", GRACE_S))
                pending[name] = (fut, time.monotonic() + self.timeouts[name] + grace)
        for name, (prompt, texts) in calls.items():
            if name not in pending:
                out[name] = call(self.verifiers[name], prompt, texts)
        for name, (fut, deadline) in pending.items():
            try:
                out[name] = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except cf.TimeoutError:
                out[name] = Outcome(None, f"timed out after {self.timeouts[name]} s", timed_out=True)
        return out

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
        for v in self.verifiers.values():
            close = getattr(v, "close", None)
            if callable(close):
                close()


# ---------------------------------------------------------------- process workers


def _worker_main(conn: multiprocessing.connection.Connection, spec_json: str, build: Builder) -> None:
    try:
        verifier = build(rljob.VerifierSpec.model_validate_json(spec_json))
    except Exception as e:
        conn.send_bytes(json.dumps({"error": f"{type(e).__name__}: {e}"}).encode())
        return
    conn.send_bytes(b'{"ready": true}')
    while True:
        try:
            req = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        p = types.Prompt(index=int(req["index"]), text=str(req["text"]), answer=str(req["answer"]))
        o = call(verifier, p, [str(t) for t in req["completions"]])
        scores = None if o.scores is None else [None if math.isnan(s) else s for s in o.scores]
        conn.send_bytes(json.dumps({"scores": scores, "error": o.error}).encode())


class ProcessVerifier:
    """A verifier living in a worker process (spawned, so no state leaks in); killed on overrun and replaced at
    the next call. The time limit counts from the request reaching the worker: starting a worker does not use up
    a call's time (the pool waits ``pool_grace_s`` longer for it). ``build`` makes the verifier in the worker: a
    module-level function (``registry.build_inner``), which the spawned worker imports by name."""

    pool_grace_s = START_TIMEOUT_S + GRACE_S

    def __init__(self, spec_json: str, *, timeout_s: float, build: Builder) -> None:
        self._spec_json = spec_json
        self._build = build
        self.timeout_s = timeout_s
        self.restarts = 0
        self._ctx = multiprocessing.get_context("spawn")
        self._proc: Any = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._lock = threading.Lock()   # one request at a time per worker

    def _start(self) -> multiprocessing.connection.Connection:
        parent, child = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=_worker_main, args=(child, self._spec_json, self._build),
                                 daemon=True)
        proc.start()
        child.close()
        if not parent.poll(START_TIMEOUT_S):
            proc.kill()
            raise RuntimeError(f"verifier worker did not start within {START_TIMEOUT_S} s")
        hello = json.loads(parent.recv_bytes())
        if "error" in hello:
            proc.join(5)
            raise RuntimeError(f"verifier worker failed to build: {hello['error']}")
        self._proc, self._conn = proc, parent
        return parent

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        with self._lock:
            return self._score(prompt, completions)

    def _score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        conn = self._conn or self._start()
        conn.send_bytes(json.dumps({"index": prompt.index, "text": prompt.text, "answer": prompt.answer,
                                    "completions": list(completions)}).encode())
        if not conn.poll(self.timeout_s):
            self._kill()
            raise TimeoutError(f"process worker overran {self.timeout_s} s and was killed")
        try:
            rep = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            self._kill()
            raise RuntimeError("process worker died") from None
        if rep.get("scores") is None:
            raise RuntimeError(rep.get("error") or "worker returned no scores")
        return [math.nan if s is None else float(s) for s in rep["scores"]]

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
            self.restarts += 1
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None
