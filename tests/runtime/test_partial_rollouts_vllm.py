"""Partial rollouts on the real engine: a weight update between two engine steps of requests in flight.

The update scales the final norm only (``model.norm.weight``): the KV cache of the tokens before the switch is then
the same under both weights, so the tokens after it must be exactly what the new weights give (greedy tokens and
their logprobs against HF, within the ``ATOL`` of the weight-sync tests), the ones before it what the old weights
gave, and the version stamps must say so. (A full update keeps the old KV of the prefix: the documented
approximation, not checked token for token.)
"""
from __future__ import annotations

import pathlib

import pytest
import torch
import transformers

from kubeforge.runtime import types
from kubeforge.runtime.generator import stepper

ATOL = 2e-3      # as tests/runtime/test_weightsync.py
PROMPTS = [types.Prompt(index=i, text=t, answer="") for i, t in enumerate(["Copy: abcd\n", "12+34=?", "hello w"])]
BEFORE = 3       # engine steps under the old weights


def teacher_forced(model: transformers.PreTrainedModel, prompt_ids: list[int], completion: list[int]) -> torch.Tensor:
    """log_softmax of each position's logits (T = 1: greedy), rows = completion positions."""
    ids = torch.tensor([[int(x) for x in prompt_ids] + [int(x) for x in completion]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.vllm
def test_update_between_steps_switches_versions_and_logprobs(weight_sync: object, tiny_engine: object,
                                                             tiny_model_dir: pathlib.Path) -> None:
    from kubeforge.runtime.generator import vllm_steps

    old = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    new = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        new.model.norm.weight.mul_(3.0)
    weight_sync.sync(old.named_parameters(), version=10)  # type: ignore[attr-defined]
    steps = vllm_steps.VllmSteps(tiny_engine, max_tokens=10, temperature=0.0, top_p=1.0, chat_template=False)
    pool = stepper.Pool(steps, group_size=2)
    pool.add(PROMPTS, step=0, version=10, seed=None)
    out: list[types.RolloutGroup] = []
    for _ in range(BEFORE):
        out += pool.step()
    assert not out and pool.in_flight() == 2 * len(PROMPTS)
    weight_sync.sync(new.named_parameters(), version=11)  # type: ignore[attr-defined]
    pool.switch(11)
    steps.synced()
    while pool.busy():
        out += pool.step()
    assert not steps.stale_cache          # reset once the engine went idle
    assert sorted(g.prompt.index for g in out) == [0, 1, 2]
    switched = 0
    for g in out:
        assert g.policy_version == 11
        for i, c in enumerate(g.completions):
            versions = types.token_versions(g, i).tolist()
            k = versions.count(10)
            assert versions == [10] * k + [11] * (len(versions) - k)
            assert k == min(BEFORE, len(versions))     # the first BEFORE steps made one token each
            switched += len(versions) > k
            tokens = c.token_ids.tolist()
            lp_old = teacher_forced(old, list(g.prompt_token_ids), tokens)
            lp_new = teacher_forced(new, list(g.prompt_token_ids), tokens)
            for j, tok in enumerate(tokens):
                ref = lp_old[j] if j < k else lp_new[j]
                assert tok == int(torch.argmax(ref)), (g.prompt.index, i, j)
                assert abs(float(ref[tok]) - float(c.logprobs[j])) < ATOL, (g.prompt.index, i, j)
            if len(tokens) > k:   # the new weights really differ where they were used
                assert abs(float(lp_old[k][tokens[k]]) - float(c.logprobs[k])) > 10 * ATOL
    assert switched >= 1
