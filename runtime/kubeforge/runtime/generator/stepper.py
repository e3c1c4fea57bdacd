"""Partial rollouts: a pool of in-flight requests driven one engine step at a time, each token stamped with the
policy version it was sampled under.

```
 WORK ─▶ pool.add(prompts, step)      groupSize single-sample requests per prompt join the running batch at once
 loop:   pool.step()                   one engine step (one token for every running request) ─▶ groups whose every
                                       completion finished come back, stamped, and go out as ROLLOUT at once
 SYNC ─▶ weights.load ─▶ pool.switch(v) between two steps: the running requests go on under version v; each
                                       completion records (tokens so far, v) as a new version segment
```

Neighbours: ``generator.partial`` (the loop of this mode) owns a :class:`Pool`; the pool drives a :class:`Backend`,
``generator.engine.StepBackend`` over vLLM's ``LLMEngine`` (``add_request`` / ``step``) in a pod, an in-process fake
in unit tests.

Invariants: a request's tokens before a switch were sampled under the old weights, the ones after under the new
(the switch happens only between two ``Backend.step`` calls, never during one); its KV cache of the tokens before
the switch stays as the old weights computed it (the accepted approximation of AReaL-style partial rollouts:
re-computing it would cost a prefill per request and sync). The behaviour logprob of each token is the one the
engine reported when it sampled it, so the trainer's per-token ratio compares against the policy that really
sampled each token. A group leaves the pool once all its completions finished, in whatever order groups finish.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from kubeforge.runtime import types


@dataclasses.dataclass(frozen=True, kw_only=True)
class Delta:
    """What one engine step added to one request."""

    request_id: str
    token_ids: Sequence[int]
    logprobs: Sequence[float]
    text: str
    finished: bool
    finish_reason: str = ""


class Backend(Protocol):
    def encode(self, prompt: types.Prompt) -> list[int]:
        """The prompt's token ids (chat template as the job says)."""

    def add(self, request_id: str, prompt_ids: list[int], *, seed: int | None) -> None:
        """Start one single-sample request."""

    def step(self) -> list[Delta]:
        """One engine step; the new tokens of every request that made progress."""

    def abort(self, request_ids: list[str]) -> None: ...


@dataclasses.dataclass
class _Completion:
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    text: list[str] = dataclasses.field(default_factory=list)
    segments: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    finish_reason: str = ""
    done: bool = False


@dataclasses.dataclass
class _Group:
    prompt: types.Prompt
    prompt_ids: list[int]
    step: int
    completions: list[_Completion]
    started: float


@dataclasses.dataclass
class Counters:
    """What the pool did (the bench and the generator's closing line read them)."""

    groups: int = 0
    completions: int = 0
    tokens: int = 0
    switches: int = 0                 # version switches that found requests in flight
    switched_completions: int = 0     # completions that carry more than one version


class Pool:
    """In-flight groups of one generator (see the module docstring)."""

    def __init__(self, backend: Backend, *, group_size: int) -> None:
        self.backend = backend
        self.group_size = group_size
        self._groups: dict[str, _Group] = {}
        self._requests: dict[str, tuple[str, int]] = {}    # request id -> (group key, completion index)
        self._serial = 0
        self.counters = Counters()

    def busy(self) -> bool:
        return bool(self._requests)

    def in_flight(self) -> int:
        """Requests not finished yet."""
        return len(self._requests)

    def add(self, prompts: Sequence[types.Prompt], *, step: int, version: int, seed: int | None) -> None:
        """Start ``group_size`` requests per prompt (sample ``i`` of prompt ``p`` seeded ``seed(p) + i``, as vLLM
        seeds its ``n`` samples)."""
        from kubeforge.runtime.generator.engine import request_seed   # pure function (no vLLM import)

        now = time.monotonic()
        for p in prompts:
            self._serial += 1
            key = f"{self._serial}"
            ids = self.backend.encode(p)
            comps = [_Completion(segments=[(0, version)]) for _ in range(self.group_size)]
            self._groups[key] = _Group(prompt=p, prompt_ids=ids, step=step, completions=comps, started=now)
            base = None if seed is None else request_seed(seed, prompt_index=p.index, n=self.group_size)
            for i in range(self.group_size):
                rid = f"kf-{key}-{i}"
                self._requests[rid] = (key, i)
                self.backend.add(rid, ids, seed=None if base is None else base + i)

    def switch(self, version: int) -> None:
        """New weights are loaded: every running request's next token is sampled under ``version``."""
        if self._requests:
            self.counters.switches += 1
        for key, i in self._requests.values():
            c = self._groups[key].completions[i]
            k = len(c.tokens)
            if c.segments[-1][0] == k:       # no token under the previous version yet
                c.segments[-1] = (k, version)
            else:
                c.segments.append((k, version))

    def step(self) -> list[types.RolloutGroup]:
        """One engine step; the groups it finished, stamped (version, step; ``generator`` set by the caller)."""
        finished_keys: list[str] = []
        for d in self.backend.step():
            where = self._requests.get(d.request_id)
            if where is None:
                continue
            key, i = where
            c = self._groups[key].completions[i]
            c.tokens.extend(d.token_ids)
            c.logprobs.extend(d.logprobs)
            if d.text:
                c.text.append(d.text)
            if d.finished:
                c.done, c.finish_reason = True, d.finish_reason
                del self._requests[d.request_id]
                if all(x.done for x in self._groups[key].completions):
                    finished_keys.append(key)
        return [self._emit(self._groups.pop(key)) for key in finished_keys]

    def abort(self) -> None:
        """Drop every request in flight (STOP)."""
        if self._requests:
            self.backend.abort(list(self._requests))
        self._requests.clear()
        self._groups.clear()

    def _emit(self, g: _Group) -> types.RolloutGroup:
        comps: list[types.Completion] = []
        segments: list[types.VersionSegments] = []
        for c in g.completions:
            if len(c.logprobs) != len(c.tokens):
                raise RuntimeError(f"engine returned {len(c.logprobs)} logprobs for {len(c.tokens)} tokens")
            comps.append(types.Completion(token_ids=np.asarray(c.tokens, dtype=np.int64),
                                          logprobs=np.asarray(c.logprobs, dtype=types.LOGPROB_DTYPE),
                                          text="".join(c.text), finish_reason=c.finish_reason))
            segs = [(k, v) for k, v in c.segments if k < max(len(c.tokens), 1)]   # a switch after the last token
            segments.append(tuple(segs))
        newest = max(s[-1][1] for s in segments)
        uniform = all(len(s) == 1 and s[0][1] == newest for s in segments)
        self.counters.groups += 1
        self.counters.completions += len(comps)
        self.counters.tokens += sum(len(c.token_ids) for c in comps)
        self.counters.switched_completions += sum(1 for s in segments if len(s) > 1)
        return types.RolloutGroup(prompt=g.prompt, prompt_token_ids=types.token_array(g.prompt_ids), completions=comps,
                                  policy_version=newest, step=g.step,
                                  token_versions=None if uniform else tuple(segments))
