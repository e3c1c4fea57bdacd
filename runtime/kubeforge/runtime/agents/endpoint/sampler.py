"""The sampler behind the endpoint: prompt ids in, sampled ids and behaviour logprobs out, step by step.

Neighbours: ``server`` calls :meth:`Sampler.submit` from its HTTP threads and reads the :class:`Pending` it gets
(each engine step's new tokens, then the whole :class:`Sample`); :class:`VllmSampler` drives a
``generator.engine.Engine``'s ``vllm.LLM`` (unit tests use a deterministic sampler of their own with the same
interface, answering through :func:`answered`).

Concurrency (VllmSampler)::

    HTTP thread ─┐ submit: put Pending          one engine thread owns the engine
    HTTP thread ─┼─────────────▶ bounded queue ─▶ admit queued (≤ max_batch running) ─▶ llm_engine.add_request
    HTTP thread ─┘                                 loop: llm_engine.step() ─▶ each request's new tokens (DELTA)
         ▲  Pending.steps(timeout): Step, Step, …, Sample   ◀── push(Step) / end(Sample) / fail(exc)
         └─ Pending.cancel() (client gone, timeout) ──────────▶ llm_engine.abort_request at the next step

Invariants:
- Only the engine thread calls the engine, so vLLM is never entered twice; requests join the running batch between
  steps (continuous batching, as vLLM's own server does). The engine must not sync weights while requests are in
  flight (the same rule as ``Engine.receive_weights``): the owner stops serving first (:meth:`VllmSampler.close`).
- A :class:`Sample` is the concatenation of its steps: the ids and logprobs vLLM sampled, in order, whether the
  caller reads them as they come (a stream) or only the end. Streaming changes when tokens leave, never which.
- Every wait is bounded: a full queue refuses at once (``SamplerBusy``), a caller waits ``timeout`` seconds at most
  (``SamplerTimeout``; the request is then cancelled, so the engine stops spending steps on it); ``close`` aborts the
  running requests and fails the queued ones.
- The sampling distribution is the job's (:class:`Policy`): the endpoint refuses requests asking for another, so
  every logprob is the one the trainer reproduces (docs/runtime.md, "Logprob convention").
- With ``audit=True`` the sampler keeps vLLM's own ``RequestOutput`` ids and logprobs per request (tests compare
  them with the episode's record).
"""
from __future__ import annotations

import dataclasses
import importlib
import itertools
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

DEFAULT_QUEUE = 256
DEFAULT_MAX_BATCH = 64
CANCELLED = "cancelled"            # Sample.finish_reason of a request cancelled before it finished


class SamplerBusy(RuntimeError):
    """The sampler's queue is full: refused at once (HTTP 503)."""


class SamplerTimeout(RuntimeError):
    """No result within the caller's timeout (HTTP 504)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    """The job's sampling distribution (``spec.algorithm``'s temperature, topP, topK)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class SampleRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """The tokens one engine step added to a request (usually one)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str                # "stop", "length", or CANCELLED


class Pending:
    """One request in flight. The engine side calls :meth:`push` per step, then :meth:`end` or :meth:`fail`; the
    caller reads :meth:`steps` (or :meth:`result`) and may :meth:`cancel`."""

    def __init__(self, request: SampleRequest) -> None:
        self.request = request
        self.sample: Sample | None = None              # set once the last step was read
        self._events: queue.SimpleQueue[Step | Sample | BaseException] = queue.SimpleQueue()
        self._cancel = threading.Event()

    # -- the engine's side
    def push(self, step: Step) -> None:
        self._events.put(step)

    def end(self, sample: Sample) -> None:
        self._events.put(sample)

    def fail(self, exc: BaseException) -> None:
        self._events.put(exc)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    # -- the caller's side
    def cancel(self) -> None:
        """Stop sampling it (a client gone, a timeout): the engine aborts it at its next step and ends it with what
        it sampled so far (``finish_reason`` CANCELLED)."""
        self._cancel.set()

    def steps(self, *, timeout: float) -> Iterator[Step]:
        """Each step as the engine makes it; afterwards :attr:`sample` holds the whole. Raises the engine's error,
        or ``SamplerTimeout`` (and cancels) when the end is not there within ``timeout`` seconds of the call."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.cancel()
                raise SamplerTimeout(f"no sample within {timeout:g} s") from None
            if isinstance(event, Step):
                yield event
            elif isinstance(event, Sample):
                self.sample = event
                return
            else:
                raise event

    def result(self, *, timeout: float) -> Sample:
        for _ in self.steps(timeout=timeout):
            pass
        assert self.sample is not None
        return self.sample


def answered(request: SampleRequest, sample: Sample) -> Pending:
    """A Pending already ended, one step per token: for samplers that compute a whole sample at once."""
    pending = Pending(request)
    for tok, lp in zip(sample.token_ids, sample.logprobs):
        pending.push(Step(token_ids=(tok,), logprobs=(lp,)))
    pending.end(sample)
    return pending


class Sampler(Protocol):
    policy: Policy
    max_model_len: int

    def submit(self, request: SampleRequest, *, timeout: float) -> Pending:
        """Start sampling (``SamplerBusy`` when it cannot take more); ``timeout`` bounds any wait of its own."""
        ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Audit:
    """vLLM's own output for one request (``audit=True``)."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclasses.dataclass(kw_only=True)
class _Running:
    pending: Pending
    ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)

    def sample(self, finish_reason: str) -> Sample:
        return Sample(token_ids=tuple(self.ids), logprobs=tuple(self.logprobs), finish_reason=finish_reason)


class VllmSampler:
    """Samples through one engine's ``vllm.LLM`` from one engine thread, step by step (see the module's diagram)."""

    def __init__(self, engine: Any, *, policy: Policy, queue_size: int = DEFAULT_QUEUE,
                 max_batch: int = DEFAULT_MAX_BATCH, audit: bool = False) -> None:
        self._engine = engine
        self.policy = policy
        self.max_model_len = int(engine.kwargs["max_model_len"])
        self._queue: queue.Queue[Pending] = queue.Queue(maxsize=queue_size)
        self._max_batch = max_batch
        self._closed = threading.Event()
        self._ids = itertools.count()
        self._running: dict[str, _Running] = {}
        self.audit: list[Audit] | None = [] if audit else None
        self.steps = 0
        self._delta = importlib.import_module("vllm.sampling_params").RequestOutputKind.DELTA
        self._thread = threading.Thread(target=self._run, name="kf-endpoint-sampler", daemon=True)
        self._thread.start()

    def submit(self, request: SampleRequest, *, timeout: float = 0.0) -> Pending:
        if self._closed.is_set():
            raise SamplerBusy("the sampler is closed")
        pending = Pending(request)
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            raise SamplerBusy(f"{self._queue.maxsize} requests queued already") from None
        return pending

    def sample(self, request: SampleRequest, *, timeout: float) -> Sample:
        return self.submit(request).result(timeout=timeout)

    def close(self, timeout: float = 30.0) -> None:
        self._closed.set()
        self._thread.join(timeout=timeout)
        while True:
            try:
                self._queue.get_nowait().fail(SamplerBusy("the sampler closed"))
            except queue.Empty:
                return

    # ------------------------------------------------------------ the engine thread

    def _run(self) -> None:
        engine = self._engine.llm.llm_engine
        while not self._closed.is_set():
            self._admit(block=not self._running)
            self._abort([rid for rid, r in self._running.items() if r.pending.cancelled], CANCELLED)
            if not self._running:
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # noqa: BLE001 - every running caller gets the engine's error
                for r in self._running.values():
                    r.pending.fail(exc)
                self._abort(list(self._running), None)
                continue
            self.steps += 1
            for out in outputs:
                self._output(out)
        self._abort(list(self._running), CANCELLED)

    def _admit(self, *, block: bool) -> None:
        """Queued requests join the running batch (waiting 0.1 s for one when none runs)."""
        while len(self._running) < self._max_batch:
            try:
                pending = self._queue.get(timeout=0.1) if block else self._queue.get_nowait()
            except queue.Empty:
                return
            block = False
            if pending.cancelled:
                pending.end(Sample(token_ids=(), logprobs=(), finish_reason=CANCELLED))
                continue
            rid = f"kf-endpoint-{next(self._ids)}"
            try:
                self._add(rid, pending.request)
            except Exception as exc:  # noqa: BLE001 - the caller gets the engine's error (a bad prompt, ...)
                pending.fail(exc)
                continue
            self._running[rid] = _Running(pending=pending)

    def _add(self, rid: str, req: SampleRequest) -> None:
        # LLM.generate forces FINAL_ONLY outputs; the engine's own add_request keeps DELTA: each step's new tokens.
        # The prompt goes through LLM's own rendering (what generate does), ids in, nothing re-tokenised.
        llm = self._engine.llm
        prompt = llm._preprocess_cmpl_one({"prompt_token_ids": list(req.prompt_ids)})
        llm.llm_engine.add_request(rid, prompt, self._params(req), lora_request=self._engine.lora_request)

    def _abort(self, rids: list[str], finish_reason: str | None) -> None:
        if not rids:
            return
        self._engine.llm.llm_engine.abort_request(rids, internal=False)   # our ids (vLLM suffixes its own)
        for rid in rids:
            r = self._running.pop(rid)
            if finish_reason is not None:
                r.pending.end(r.sample(finish_reason))

    def _output(self, request_output: Any) -> None:
        r = self._running.get(request_output.request_id)
        if r is None:
            return
        out = request_output.outputs[0]
        ids = tuple(int(t) for t in out.token_ids)
        lps = out.logprobs or []
        if len(lps) != len(ids):
            self._running.pop(request_output.request_id)
            r.pending.fail(RuntimeError(f"vLLM returned {len(lps)} logprobs for {len(ids)} tokens"))
            return
        logprobs = tuple(float(lps[i][tok].logprob) for i, tok in enumerate(ids))
        r.ids += ids
        r.logprobs += logprobs
        if ids:
            r.pending.push(Step(token_ids=ids, logprobs=logprobs))
        if not request_output.finished:
            return
        del self._running[request_output.request_id]
        reason = str(out.finish_reason or "")
        sample = r.sample("length" if reason == "length" else "stop")
        if self.audit is not None:
            prompt = tuple(int(t) for t in request_output.prompt_token_ids or r.pending.request.prompt_ids)
            self.audit.append(Audit(prompt_ids=prompt, token_ids=sample.token_ids, logprobs=sample.logprobs))
        r.pending.end(sample)

    def _params(self, req: SampleRequest) -> Any:
        p, vllm = self.policy, self._engine._vllm
        return vllm.SamplingParams(
            n=1, max_tokens=req.max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, logprobs=0,
            seed=req.seed, stop=list(req.stop) or None, output_kind=self._delta)
