"""The sampler behind the endpoint: prompt ids in, sampled ids and behaviour logprobs out, one request at a time.

Neighbours: ``endpoint`` calls :meth:`Sampler.sample` from its HTTP threads; :class:`VllmSampler` drives a
``generator.engine.Engine``'s ``vllm.LLM`` (unit tests use a deterministic sampler of their own with the same
interface).

Concurrency (VllmSampler)::

    HTTP thread ─┐ put (request, future)         one batcher thread owns the engine
    HTTP thread ─┼─────────────▶ bounded queue ─▶ all queued (≤ max_batch) ─▶ llm.generate([...])
    HTTP thread ─┘ future.result(timeout) ◀────── set each future (or its exception)

Invariants:
- Only the batcher thread calls the engine, so concurrent episodes are batched into one ``generate`` and vLLM is
  never entered twice. The engine must not sync weights while requests are in flight (the same rule as
  ``Engine.receive_weights``): the owner stops serving first (:meth:`VllmSampler.close`).
- Every wait is bounded: a full queue refuses at once (``SamplerBusy``), a caller waits ``timeout`` seconds at most
  (``SamplerTimeout``); ``close`` fails the requests still queued.
- The sampling distribution is the job's (:class:`Policy`): the endpoint refuses requests asking for another, so
  every logprob is the one the trainer reproduces (docs/runtime.md, "Logprob convention").
- With ``audit=True`` the sampler keeps vLLM's own ``RequestOutput`` ids and logprobs per request (tests compare
  them with the episode's record).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
from typing import Any, Protocol

DEFAULT_QUEUE = 256
DEFAULT_MAX_BATCH = 64


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
class Sample:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str                # "stop" or "length"


class Sampler(Protocol):
    policy: Policy
    max_model_len: int

    def sample(self, request: SampleRequest, *, timeout: float) -> Sample: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Audit:
    """vLLM's own output for one request (``audit=True``)."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


_Item = tuple[SampleRequest, "concurrent.futures.Future[Sample]"]


class VllmSampler:
    """Samples through one engine's ``vllm.LLM`` from one batcher thread (see the module's diagram)."""

    def __init__(self, engine: Any, *, policy: Policy, queue_size: int = DEFAULT_QUEUE,
                 max_batch: int = DEFAULT_MAX_BATCH, audit: bool = False) -> None:
        self._engine = engine
        self.policy = policy
        self.max_model_len = int(engine.kwargs["max_model_len"])
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=queue_size)
        self._max_batch = max_batch
        self._closed = threading.Event()
        self.audit: list[Audit] | None = [] if audit else None
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name="kf-endpoint-sampler", daemon=True)
        self._thread.start()

    def sample(self, request: SampleRequest, *, timeout: float) -> Sample:
        if self._closed.is_set():
            raise SamplerBusy("the sampler is closed")
        future: concurrent.futures.Future[Sample] = concurrent.futures.Future()
        try:
            self._queue.put_nowait((request, future))
        except queue.Full:
            raise SamplerBusy(f"{self._queue.maxsize} requests queued already") from None
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise SamplerTimeout(f"no sample within {timeout:g} s") from None

    def close(self, timeout: float = 30.0) -> None:
        self._closed.set()
        self._thread.join(timeout=timeout)
        while True:
            try:
                _, future = self._queue.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(SamplerBusy("the sampler closed"))

    def _run(self) -> None:
        while not self._closed.is_set():
            try:
                batch = [self._queue.get(timeout=0.1)]
            except queue.Empty:
                continue
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            live = [(r, f) for r, f in batch if f.set_running_or_notify_cancel()]
            if live:
                self._generate(live)

    def _generate(self, batch: list[_Item]) -> None:
        try:
            outs = self._engine.llm.generate([{"prompt_token_ids": list(r.prompt_ids)} for r, _ in batch],
                                             [self._params(r) for r, _ in batch], use_tqdm=False,
                                             lora_request=self._engine.lora_request)
            self.batches += 1
            for (_, future), out in zip(batch, outs):
                future.set_result(self._sample(out))
        except Exception as exc:  # noqa: BLE001 - every waiting caller gets the engine's error
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)

    def _params(self, req: SampleRequest) -> Any:
        p = self.policy
        return self._engine._vllm.SamplingParams(
            n=1, max_tokens=req.max_tokens, temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, logprobs=0,
            seed=req.seed, stop=list(req.stop) or None)

    def _sample(self, request_output: Any) -> Sample:
        out = request_output.outputs[0]
        ids = tuple(int(t) for t in out.token_ids)
        lps = out.logprobs or []
        if len(lps) != len(ids):
            raise RuntimeError(f"vLLM returned {len(lps)} logprobs for {len(ids)} tokens")
        logprobs = tuple(float(lps[i][tok].logprob) for i, tok in enumerate(ids))
        if self.audit is not None:
            prompt = tuple(int(t) for t in request_output.prompt_token_ids)
            self.audit.append(Audit(prompt_ids=prompt, token_ids=ids, logprobs=logprobs))
        reason = str(out.finish_reason or "")
        return Sample(token_ids=ids, logprobs=logprobs, finish_reason="length" if reason == "length" else "stop")
