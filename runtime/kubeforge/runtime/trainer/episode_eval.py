"""Held-out evaluation of a job with ``spec.environment``: greedy episodes of the trainer's own model, with the
environment's tools and feedback, exactly as the generators run them (``agents.runner.EpisodeSampler``).

Neighbours: ``trainer.start.evaluator`` builds it instead of ``evaluate.Evaluator`` when the job names an
environment; the role loop calls ``run()`` (same ``EvalResult``). ``HFTurns`` is the runner's ``TurnEngine`` over the
HF model: one greedy ``generate`` per turn for a batch of contexts (left-padded), each row cut at its token budget,
at the EOS token and after a stop string. The environments run in one worker process (``agents.workers``).

Shared prefix: every context of a turn starts with the same system prompt and, for ``Calculator``, its worked
demonstration (118 of the first turn's 139 tokens on SmolLM2-135M-Instruct), and on a CPU the prefill of that
prefix in every row dominated a turn. As ``evaluate.Evaluator`` does for prompts, a turn whose contexts share at
least ``evaluate.MIN_SHARED`` tokens computes the prefix's KV cache once and runs each batch of equal-length rows
from a copy of it (same turns, the contexts' order kept: tests/runtime/test_episode_eval.py). Measured on 8 held-out
problems of examples/tool-calculator.yaml, 1 thread, load ~20: the first turn 38.2 s -> 20.5 s; later turns,
whose contexts differ in length, gain little (docs/benchmarks.md, session 16).

Correct: the episode's environment reward >= 0.5 (``reward: Environment`` or ``Both``), else the evaluation
verifier's score of the transcript >= 0.5 (``reward: Verifiers``).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

import torch
import transformers

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.agents.hosts import host as host_mod
from kubeforge.runtime.agents import runner
from kubeforge.runtime.trainer import evaluate
from kubeforge.runtime.verifiers import base as verifiers_base

BATCH = 64


class HFTurns:
    """``runner.TurnEngine``: greedy turns of an HF causal LM (logprobs 0: evaluation trains on nothing)."""

    def __init__(self, evaluator: evaluate.Evaluator) -> None:
        self.ev = evaluator              # its model, padding, EOS, inference context and heartbeat
        self.tokenizer = evaluator.tokenizer

    def sample_turns(self, contexts: Sequence[Sequence[int]], *, max_tokens: Sequence[int], seeds: Sequence[int],
                     stop: Sequence[str]) -> list[types.Completion]:
        shared = evaluate.shared_prefix(contexts)
        if shared:
            return self._shared(contexts, max_tokens, stop, shared)
        out: list[types.Completion] = []
        for start in range(0, len(contexts), BATCH):
            out += self._batch(contexts[start:start + BATCH], max_tokens[start:start + BATCH], stop)
        return out

    def _shared(self, contexts: Sequence[Sequence[int]], limits: Sequence[int], stop: Sequence[str],
                shared: int) -> list[types.Completion]:
        """``sample_turns`` with the contexts' common prefix (system prompt, demonstration) computed once, as
        ``evaluate.Evaluator`` does for prompts: rows of equal length batched, the contexts' order kept."""
        ev = self.ev
        ids = torch.tensor([list(contexts[0][:shared])], dtype=torch.long, device=ev.device)
        prefix = transformers.DynamicCache(config=getattr(ev.model, "config", None))
        with ev._inference():
            ev.model(input_ids=ids, use_cache=True, past_key_values=prefix)
        by_length: dict[int, list[int]] = {}
        for i, c in enumerate(contexts):
            by_length.setdefault(len(c), []).append(i)
        out: list[types.Completion | None] = [None] * len(contexts)
        for rows in by_length.values():
            for start in range(0, len(rows), BATCH):
                chunk = rows[start:start + BATCH]
                batch = torch.tensor([list(contexts[i]) for i in chunk], dtype=torch.long)
                cache = copy.deepcopy(prefix)
                cache.batch_repeat_interleave(len(chunk))
                done = self._generate(batch, torch.ones_like(batch), [limits[i] for i in chunk], stop,
                                      past_key_values=cache)
                for i, turn in zip(chunk, done):
                    out[i] = turn
        assert all(t is not None for t in out)
        return [t for t in out if t is not None]

    def _batch(self, contexts: Sequence[Sequence[int]], limits: Sequence[int],
               stop: Sequence[str]) -> list[types.Completion]:
        ev = self.ev
        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), ev.pad_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, width - len(c):] = torch.tensor(list(c), dtype=torch.long)
            mask[i, width - len(c):] = 1
        return self._generate(ids, mask, limits, stop)

    def _generate(self, ids: torch.Tensor, mask: torch.Tensor, limits: Sequence[int], stop: Sequence[str],
                  **cache: Any) -> list[types.Completion]:
        ev = self.ev
        width = ids.shape[1]
        gen: Any = ev.model
        kw: dict[str, Any] = {"stop_strings": list(stop), "tokenizer": self.tokenizer} if stop else {}
        with ev._inference():
            seq = gen.generate(input_ids=ids.to(ev.device), attention_mask=mask.to(ev.device),
                               max_new_tokens=max(limits), do_sample=False, pad_token_id=ev.pad_id,
                               eos_token_id=ev.eos_id, stopping_criteria=ev._beats(), **kw, **cache)
        return [self._turn(row[width:].tolist(), limit, stop) for row, limit in zip(seq, limits)]

    def _turn(self, new: list[int], limit: int, stop: Sequence[str]) -> types.Completion:
        new = new[:limit]
        if self.ev.eos_id is not None and self.ev.eos_id in new:
            new = new[:new.index(self.ev.eos_id) + 1]
        for k in range(1, len(new) + 1):          # the shortest prefix that holds a stop string
            if stop and any(s in self.tokenizer.decode(new[:k]) for s in stop):
                new = new[:k]
                break
        text = str(self.tokenizer.decode(new, skip_special_tokens=True))
        return types.Completion(token_ids=types.token_array(new), logprobs=types.logprob_array([0.0] * len(new)),
                                text=text)


class EpisodeEvaluator:
    """Held-out greedy episodes (see the module docstring); ``run()`` as ``evaluate.Evaluator.run``."""

    def __init__(self, *, base: evaluate.Evaluator, spec: rljob.RLJobSpec, host: host_mod.EnvironmentHost,
                 verifier: verifiers_base.Verifier, max_context: int) -> None:
        env = spec.environment
        assert env is not None
        self.base, self.env, self.verifier = base, env, verifier
        one = spec.algorithm.model_copy(update={"group_size": 1, "max_new_tokens": base.max_new_tokens})
        self.sampler = runner.EpisodeSampler(engine=HFTurns(base), host=host, spec=env, algorithm=one,
                                             chat_template=spec.task.chat_template, seed=0, max_context=max_context)

    def run(self) -> evaluate.EvalResult:
        t0 = time.perf_counter()
        model = self.base.model
        was_training = model.training
        model.eval()
        try:
            groups = self.sampler.sample(self.base.prompts)
        finally:
            model.train(was_training)
        correct = sum(int(self._score(g) >= evaluate.CORRECT) for g in groups)
        return evaluate.EvalResult(accuracy=correct / len(groups), correct=correct, prompts=len(groups),
                                   seconds=time.perf_counter() - t0)

    def _score(self, g: types.RolloutGroup) -> float:
        if self.env.reward == rljob.EnvironmentReward.VERIFIERS.value:
            return float(self.verifier.score(g.prompt, [g.completions[0].text])[0])
        st = g.episode_stats[0] if g.episode_stats else None
        return float(st.env_reward or 0.0) if st is not None else 0.0

