"""``stepper.Backend`` over a running vLLM engine: requests added to ``vllm.LLM``'s ``LLMEngine`` and driven one
``step()`` at a time, so the caller can load new weights between two steps (partial rollouts).

Neighbours: ``generator.engine.Engine`` owns the ``vllm.LLM`` (``self.llm.llm_engine`` is vLLM V1's ``LLMEngine``);
``generator.stepper.Pool`` calls this. Requests are single-sample (``n=1``; the pool makes ``groupSize`` of them per
prompt, seeded as vLLM seeds its ``n`` children) with ``RequestOutputKind.DELTA``, so each step hands back only its
new tokens and their behaviour logprobs (``processed_logprobs``, as ``Engine.generate``).

Invariant: ``Engine.receive_weights`` between two steps is safe (this process is the engine core's only caller, and
``step()`` returns after its forward pass); its prefix-cache reset fails while requests hold blocks, so
:meth:`VllmSteps.step` resets the prefix cache again once the engine is idle after a sync (``stale_cache``): no
later request reuses a prefix block the old weights computed.
"""
from __future__ import annotations

from typing import Any

from kubeforge.runtime import types
from kubeforge.runtime.generator import stepper


class VllmSteps:
    def __init__(self, engine: Any, *, max_tokens: int, temperature: float, top_p: float,
                 chat_template: bool) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.engine = engine
        self.llm_engine = engine.llm.llm_engine
        self._params: dict[str, Any] = dict(n=1, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                            logprobs=0, output_kind=RequestOutputKind.DELTA)
        self._make = SamplingParams
        self.chat_template = chat_template
        self.stale_cache = False
        self._ours: dict[str, str] = {}    # vLLM's internal request id (a random suffix added) -> ours

    def encode(self, prompt: types.Prompt) -> list[int]:
        return list(self.engine.encode(prompt, chat_template=self.chat_template))

    def params(self, request_id: str, *, seed: int | None) -> Any:
        """The ``SamplingParams`` of one request: the job's (a benchmark's subclass sets each request's length)."""
        return self._make(**self._params, seed=seed)

    def add(self, request_id: str, prompt_ids: list[int], *, seed: int | None) -> None:
        params = self.params(request_id, seed=seed)
        internal = self.llm_engine.add_request(request_id, {"prompt_token_ids": prompt_ids}, params,
                                               lora_request=self.engine.lora_request)
        self._ours[str(internal)] = request_id

    def step(self) -> list[stepper.Delta]:
        out: list[stepper.Delta] = []
        for ro in self.llm_engine.step():
            for c in ro.outputs:   # n = 1: one
                ids = list(c.token_ids)
                lps = c.logprobs or []
                if len(lps) != len(ids):
                    raise RuntimeError(f"vLLM returned {len(lps)} logprobs for {len(ids)} tokens")
                rid = self._ours.pop(ro.request_id, ro.request_id) if ro.finished else self._ours.get(
                    ro.request_id, ro.request_id)
                out.append(stepper.Delta(request_id=rid, token_ids=ids,
                                         logprobs=[lps[i][t].logprob for i, t in enumerate(ids)], text=c.text,
                                         finished=ro.finished, finish_reason=str(c.finish_reason or "")))
        if self.stale_cache and not self.llm_engine.has_unfinished_requests():
            self.stale_cache = not self.engine.llm.reset_prefix_cache()
        return out

    def synced(self) -> None:
        """Weights were loaded: the prefix cache may hold blocks of the old ones until the engine is idle."""
        self.stale_cache = True
        if not self.llm_engine.has_unfinished_requests():
            self.stale_cache = not self.engine.llm.reset_prefix_cache()

    def abort(self, request_ids: list[str]) -> None:
        self.llm_engine.abort_request(request_ids)
        self._ours.clear()
