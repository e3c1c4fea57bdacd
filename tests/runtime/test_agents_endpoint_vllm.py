"""An agent on the real ``openai`` client runs a three-turn episode through the endpoint backed by real vLLM (the
shared tiny engine): the recorded token ids are exactly what vLLM sampled and was fed.

Three checks, each able to fail on its own: (1) the sampler's audit (vLLM's own ``RequestOutput`` prompt ids, token
ids and logprobs) equals the episode's record call by call; (2) each call's prompt is the previous prompt + the
previous sampled ids + the delta (no re-tokenisation); (3) replaying each recorded prompt through the engine with
the call's seed gives the same ids again, and the policy spans of the replayed episode cover exactly those ids.
"""
from __future__ import annotations

import json
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


def _counter(ep: endpoint.server.Endpoint, name: str, **labels: str) -> float:
    value = ep.metrics.registry.get_sample_value(name, {"role": "endpoint", "replica": "0", **labels})
    return 0.0 if value is None else value


@pytest.mark.vllm
def test_streamed_completion_arrives_token_by_token_and_records_what_vllm_sampled(tiny_engine: Any) -> None:
    """The same request with the same seed, streamed (``httpx`` reading the events as they come) and whole: the
    stream has more than one content chunk, its text is the whole response's, usage is right, and both records equal
    vLLM's own output. Then a client that leaves mid-stream: the engine request is aborted, the call is recorded as
    disconnected and counted, and the engine serves the next call."""
    import httpx

    sampler = endpoint.sampler.VllmSampler(tiny_engine, policy=endpoint.sampler.Policy(), audit=True)
    ep = endpoint.server.Endpoint(sampler=sampler, chat=endpoint.chat.ChatTemplate(tiny_engine.tokenizer),
                                  config=endpoint.server.EndpointConfig(max_tokens_per_call=64))
    body = {"model": "policy", "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 16,
            "seed": 7, "logprobs": True}
    try:
        streamed_id, whole_id, left_id = ep.open_episode(), ep.open_episode(), ep.open_episode()
        whole = openai.OpenAI(base_url=ep.base_url(whole_id), api_key="local", max_retries=0, timeout=60) \
            .chat.completions.create(**body)  # type: ignore[call-overload]
        events: list[dict[str, Any]] = []
        with httpx.stream("POST", ep.base_url(streamed_id) + "/chat/completions", timeout=60,
                          json=body | {"stream": True, "stream_options": {"include_usage": True}}) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
            lines = [line for line in resp.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        events = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        with httpx.stream("POST", ep.base_url(left_id) + "/chat/completions", timeout=60,
                          json=body | {"stream": True, "max_tokens": 64}) as resp:
            next(resp.iter_lines())          # the role chunk; then the client goes away
        rec_streamed, rec_whole, rec_left = (ep.close_episode(e) for e in (streamed_id, whole_id, left_id))
        after = ep.open_episode()           # the engine still serves
        again = openai.OpenAI(base_url=ep.base_url(after), api_key="local", max_retries=0, timeout=60) \
            .chat.completions.create(**body)  # type: ignore[call-overload]
        assert again.choices[0].message.content == whole.choices[0].message.content
    finally:
        ep.close()
        sampler.close()
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    choices = [e["choices"][0] for e in events if e["choices"]]
    contents = [c["delta"].get("content") for c in choices[1:] if c["delta"].get("content")]
    assert len(contents) > 1, contents                                 # token by token, not one chunk
    assert "".join(contents) == whole.choices[0].message.content
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + [whole.choices[0].finish_reason]
    streamed_call, whole_call = rec_streamed.branches[0].calls[0], rec_whole.branches[0].calls[0]
    assert events[-1]["choices"] == [] and events[-1]["usage"] == {
        "prompt_tokens": len(streamed_call.prompt_ids), "completion_tokens": len(streamed_call.sampled_ids),
        "total_tokens": len(streamed_call.prompt_ids) + len(streamed_call.sampled_ids)}
    assert [t["logprob"] for c in choices if c["logprobs"] for t in c["logprobs"]["content"]] == \
        list(streamed_call.logprobs)
    assert (streamed_call.prompt_ids, streamed_call.sampled_ids, streamed_call.logprobs) == \
        (whole_call.prompt_ids, whole_call.sampled_ids, whole_call.logprobs)
    assert sampler.audit is not None
    audited = {(a.prompt_ids, a.token_ids, a.logprobs) for a in sampler.audit}
    assert (streamed_call.prompt_ids, streamed_call.sampled_ids, streamed_call.logprobs) in audited
    # the client that left
    assert rec_left.branches == [] and len(rec_left.disconnected) == 1
    left = rec_left.disconnected[0]
    assert left.prompt_ids == whole_call.prompt_ids
    n = min(len(left.sampled_ids), len(whole_call.sampled_ids))     # the same seed: the same first tokens
    assert left.sampled_ids[:n] == whole_call.sampled_ids[:n]
    assert ep.disconnected == 1 and sampler._running == {}
    assert not tiny_engine.llm.llm_engine.has_unfinished_requests()
    assert _counter(ep, "kubeforge_endpoint_requests_total", outcome="disconnected") == 1
    assert _counter(ep, "kubeforge_endpoint_requests_total", outcome="answered") == 3
    assert _counter(ep, "kubeforge_endpoint_tokens_total", kind="completion") == \
        3 * len(whole_call.sampled_ids) + len(left.sampled_ids)
    assert _counter(ep, "kubeforge_endpoint_first_token_seconds_count") == 1


@pytest.mark.vllm
def test_tools_through_real_vllm_are_read_from_the_sampled_text_and_leave_the_ids(tiny_engine: Any) -> None:
    """``tools`` with ``tool_choice: required`` through the shared tiny engine under the Hermes fixture template: the
    tools reach the prompt vLLM is fed, the reply is exactly the tool-call reading of the sampled text (a parse, a
    counted malformed or unmet content: the tiny model's random weights decide which), and the recorded ids and
    logprobs are vLLM's own, whole and streamed alike."""
    from _toolcall_util import hermes_template
    from kubeforge.runtime.agents.toolcalls import choice, hermes

    sampler = endpoint.sampler.VllmSampler(tiny_engine, policy=endpoint.sampler.Policy(), audit=True)
    chat = endpoint.chat.ChatTemplate(tiny_engine.tokenizer, template=hermes_template())
    ep = endpoint.server.Endpoint(sampler=sampler, chat=chat,
                                  config=endpoint.server.EndpointConfig(max_tokens_per_call=24))
    tools = [{"type": "function", "function": {"name": "calculate"}}]   # the fixture's prompt fills 461 of 512
    body = {"model": "policy", "messages": [{"role": "user", "content": "What is 314 * 27?"}], "tools": tools,
            "tool_choice": "required", "max_tokens": 24, "seed": 11}
    try:
        whole_id, streamed_id = ep.open_episode(), ep.open_episode()
        whole = openai.OpenAI(base_url=ep.base_url(whole_id), api_key="local", max_retries=0, timeout=60) \
            .chat.completions.create(**body)  # type: ignore[call-overload]
        chunks = list(openai.OpenAI(base_url=ep.base_url(streamed_id), api_key="local", max_retries=0, timeout=60)
                      .chat.completions.create(**body, stream=True))  # type: ignore[call-overload]
        calls = [ep.close_episode(e).branches[0].calls[0] for e in (whole_id, streamed_id)]
    finally:
        ep.close()
        sampler.close()
    assert sampler.audit is not None and len(sampler.audit) == 2
    audited = {(a.prompt_ids, a.token_ids, a.logprobs) for a in sampler.audit}
    for call in calls:
        assert (call.prompt_ids, call.sampled_ids, call.logprobs) in audited and call.sampled_ids
    assert calls[0].sampled_ids == calls[1].sampled_ids          # the same seed, whole or streamed
    tok = tiny_engine.tokenizer
    assert '"name": "calculate"' in tok.decode(list(calls[0].prompt_ids))     # the model was shown the tools
    text = tok.decode(list(calls[0].sampled_ids), skip_special_tokens=True)
    expected = choice.reply(hermes.FORMAT, text, offered={"calculate"},
                            choice=choice.Choice(mode=choice.REQUIRED))
    assert calls[0].tool_outcome == calls[1].tool_outcome == expected.outcome
    assert ep.tool_parses == {expected.outcome: 2}
    assert _counter(ep, "kubeforge_endpoint_tool_parses_total", outcome=expected.outcome) == 2
    message = whole.choices[0].message
    if expected.calls:
        assert [t.function.name for t in message.tool_calls] == [c.name for c in expected.calls]
    else:
        assert message.content == text and not message.tool_calls
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
