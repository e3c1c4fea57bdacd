"""An agent on the real ``openai`` client runs a three-turn episode through the endpoint backed by real vLLM (the
shared tiny engine): the recorded token ids are exactly what vLLM sampled and was fed.

Three checks, each able to fail on its own: (1) the sampler's audit (vLLM's own ``RequestOutput`` prompt ids, token
ids and logprobs) equals the episode's record call by call; (2) each call's prompt is the previous prompt + the
previous sampled ids + the delta (no re-tokenisation); (3) replaying each recorded prompt through the engine with
the call's seed gives the same ids again, and the policy spans of the replayed episode cover exactly those ids.
"""
from __future__ import annotations

from typing import Any

import openai
import pytest

from kubeforge.runtime.agents import endpoint
from test_agents_endpoint import Sink

TURNS = 3
MAX_TOKENS = 8


def agent(base_url: str) -> list[Any]:
    """A plain agent: asks, reads the reply, answers with feedback, three times. Nothing kubeforge-specific."""
    c = openai.OpenAI(base_url=base_url, api_key="local", max_retries=0, timeout=60)
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Guess a number."},
                                      {"role": "user", "content": "Between 1 and 9?"}]
    replies = []
    for turn in range(TURNS):
        r = c.chat.completions.create(model="policy", messages=messages,  # type: ignore[arg-type]
                                      max_tokens=MAX_TOKENS, seed=100 + turn, logprobs=True)
        replies.append(r)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "higher" if turn % 2 else "lower"}]
    return replies


@pytest.mark.vllm
def test_openai_agent_episode_records_what_vllm_sampled(tiny_engine: Any) -> None:
    sampler = endpoint.sampler.VllmSampler(tiny_engine, policy=endpoint.sampler.Policy(), audit=True)
    ep = endpoint.server.Endpoint(sampler=sampler, chat=endpoint.chat.ChatTemplate(tiny_engine.tokenizer),
                                  config=endpoint.server.EndpointConfig(max_tokens_per_call=MAX_TOKENS))
    try:
        eid = ep.open_episode()
        replies = agent(ep.base_url(eid))
        rec = ep.close_episode(eid)
    finally:
        ep.close()
        sampler.close()
    assert len(rec.branches) == 1, [b.reason for b in rec.branches]
    branch = rec.branches[0]
    assert [c.reason for c in branch.calls] == ["first", "extends", "extends"]
    assert sampler.audit is not None and len(sampler.audit) == TURNS
    for call, seen, reply in zip(branch.calls, sampler.audit, replies):
        assert call.prompt_ids == seen.prompt_ids                       # what vLLM was fed
        assert call.sampled_ids == seen.token_ids and len(call.sampled_ids) > 0
        assert call.logprobs == seen.logprobs
        assert [t.logprob for t in reply.choices[0].logprobs.content] == list(call.logprobs)
    for prev, call in zip(branch.calls, branch.calls[1:]):
        assert call.prompt_ids == prev.prompt_ids + prev.sampled_ids + call.delta_ids
        assert "user: " in call.delta_text and call.delta_text.endswith("assistant: ")
    # replay: the same prompt ids with the same seed through the engine give the same ids
    vllm = tiny_engine._vllm
    outs = tiny_engine.llm.generate(
        [{"prompt_token_ids": list(c.prompt_ids)} for c in branch.calls],
        [vllm.SamplingParams(n=1, max_tokens=MAX_TOKENS, temperature=1.0, top_p=1.0, top_k=0, logprobs=0,
                             seed=100 + i) for i in range(TURNS)], use_tqdm=False)
    assert [tuple(o.outputs[0].token_ids) for o in outs] == [c.sampled_ids for c in branch.calls]
    sink = Sink()
    branch.replay(sink)
    covered = [t for s, e in sink.spans for t in sink.token_ids[s:e]]
    assert covered == [t for c in branch.calls for t in c.sampled_ids]
    assert tuple(sink.token_ids) == branch.token_ids()
    assert branch.prompt_ids + branch.token_ids() == branch.calls[-1].prompt_ids + branch.calls[-1].sampled_ids
    assert ep.refused == {} and ep.answered == TURNS
