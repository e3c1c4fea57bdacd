"""Native tool calls through the OpenAI-compatible endpoint, over real HTTP with the real ``openai`` client: ``tools``
rendered by the model's chat template, the reply read into ``tool_calls``, ``tool`` messages fed back into an episode
that extends token for token, malformed output returned as content and counted, ``tool_choice``, streamed
``tool_calls``, and every refusal naming its field.

The sampler answers scripted texts (one byte token per character, the tiny tokenizer's), so each test knows what the
model "wrote"; the templates are SmolLM2's as it ships and the Hermes / Qwen2.5 fixture (``_toolcall_util``). Real
vLLM: ``test_agents_endpoint_vllm.py``.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import openai
import pytest

from _toolcall_util import TOOLS, hermes_template, smollm2_template, tokenizer
from kubeforge.runtime.agents import endpoint
from test_agents_endpoint import EOS, raw

HERMES_CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "314 * 27"}}\n</tool_call>'
SMOL_CALLS = ('<tool_call>[{"name": "calculate", "arguments": {"expression": "1 + 2"}}, '
              '{"name": "weather", "arguments": {"city": "Bern"}}]</tool_call>')
BASE = {"role": "endpoint", "replica": "0"}


class TextSampler:
    """Answers the scripted texts in order (their byte tokens + <eos>), one engine step per token from its own
    thread when ``period`` is set (a stream sees each step), all at once otherwise; logprob -0.5 per token."""

    def __init__(self, tok: Any, texts: list[str], *, period: float = 0.0) -> None:
        self.tok, self.texts, self.period = tok, list(texts), period
        self.policy, self.max_model_len = endpoint.sampler.Policy(), 4096
        self.prompts: list[tuple[int, ...]] = []
        self.samples: list[tuple[int, ...]] = []

    def submit(self, request: endpoint.sampler.SampleRequest, *, timeout: float) -> endpoint.sampler.Pending:
        self.prompts.append(request.prompt_ids)
        ids = tuple(self.tok.encode(self.texts.pop(0), add_special_tokens=False)) + (EOS,)
        ids, finish = (ids, "stop") if len(ids) <= request.max_tokens else (ids[:request.max_tokens], "length")
        self.samples.append(ids)
        sample = endpoint.sampler.Sample(token_ids=ids, logprobs=tuple(-0.5 for _ in ids), finish_reason=finish)
        if not self.period:
            return endpoint.sampler.answered(request, sample)
        pending = endpoint.sampler.Pending(request)

        def drip() -> None:
            for i in ids:
                time.sleep(self.period)
                pending.push(endpoint.sampler.Step(token_ids=(i,), logprobs=(-0.5,)))
            pending.end(sample)

        threading.Thread(target=drip, daemon=True).start()
        return pending


def serve(template: str | None, texts: list[str], *, period: float = 0.0) -> tuple[Any, TextSampler, Any]:
    tok = tokenizer(template)
    s = TextSampler(tok, texts, period=period)
    ep = endpoint.server.Endpoint(sampler=s, chat=endpoint.chat.ChatTemplate(tok),
                                  config=endpoint.server.EndpointConfig(request_timeout=10, max_tokens_per_call=200))
    return ep, s, tok


def client(ep: Any, eid: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=ep.base_url(eid), api_key="unused", max_retries=0, timeout=10)


def create(c: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return c.chat.completions.create(model="policy", messages=messages, tools=TOOLS, **kw)  # type: ignore[arg-type]


def metric(ep: Any, outcome: str) -> float:
    got = ep.metrics.registry.get_sample_value("kubeforge_endpoint_tool_parses_total", BASE | {"outcome": outcome})
    return 0.0 if got is None else got


def test_hermes_call_result_and_answer_extend_one_token_sequence() -> None:
    ep, s, tok = serve(hermes_template(), [HERMES_CALL, "The answer is 8478."])
    try:
        eid = ep.open_episode()
        c = client(ep, eid)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 314 * 27?"}]
        first = create(c, messages)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "calculate" and call.id.startswith("call_")
        assert json.loads(call.function.arguments) == {"expression": "314 * 27"}
        messages += [choice.message.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": "8478"}]
        second = create(c, messages)
        assert second.choices[0].message.content == "The answer is 8478."
        assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    (branch,) = rec.branches
    one, two = branch.calls
    assert two.reason == endpoint.chat.EXTENDS
    # the sampled ids are exactly what the sampler gave, and the second prompt is prompt + sample + delta
    assert (one.sampled_ids, two.sampled_ids) == tuple(s.samples)
    assert two.prompt_ids == one.prompt_ids + one.sampled_ids + two.delta_ids == s.prompts[1]
    assert two.delta_text == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n8478\n</tool_response><|im_end|>\n"
                              "<|im_start|>assistant\n")
    assert one.content == HERMES_CALL and one.tool_outcome == "tool_calls" and two.tool_outcome == "text"
    # the model saw the tools: the template listed them in the first prompt
    assert '"name": "calculate"' in tok.decode(list(one.prompt_ids)) and "<tools>" in tok.decode(list(one.prompt_ids))
    assert ep.stats()["tool_parses"] == {"tool_calls": 1, "text": 1} and metric(ep, "tool_calls") == 1


def test_smollm2_two_calls_in_one_list_and_their_results() -> None:
    ep, s, tok = serve(smollm2_template(), [SMOL_CALLS, "3, sunny"])
    try:
        eid = ep.open_episode()
        c = client(ep, eid)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "1 + 2, and the weather in Bern?"}]
        first = create(c, messages).choices[0]
        calls = first.message.tool_calls
        assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == \
            [("calculate", {"expression": "1 + 2"}), ("weather", {"city": "Bern"})]
        assert len({t.id for t in calls}) == 2
        # an agent that re-serialises the arguments with other spacing still extends (compared as JSON)
        echoed = first.message.model_dump()
        echoed["tool_calls"][1]["function"]["arguments"] = '{"city":"Bern"}'
        messages += [echoed, *({"role": "tool", "tool_call_id": t.id, "content": r} for t, r in zip(calls, "3s"))]
        create(c, messages)
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    (branch,) = rec.branches
    assert branch.calls[1].reason == endpoint.chat.EXTENDS and branch.calls[0].sampled_ids == s.samples[0]
    assert branch.calls[1].delta_text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>\n3\n")
    prompt = tok.decode(list(branch.calls[0].prompt_ids))
    assert '<tools>[{"name": "calculate"' in prompt and "named SmolLM" not in prompt


def test_a_changed_call_starts_a_new_branch() -> None:
    ep, _, _ = serve(hermes_template(), [HERMES_CALL, "ok"])
    try:
        eid = ep.open_episode()
        c = client(ep, eid)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
        first = create(c, messages).choices[0].message.model_dump()
        first["tool_calls"][0]["function"]["arguments"] = '{"expression": "1"}'
        create(c, messages + [first, {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "1"}])
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    assert [b.reason for b in rec.branches] == ["first", endpoint.chat.REWRITTEN]


@pytest.mark.parametrize("text, outcome, kw", [
    ('<tool_call>\n{"name": "calculate", "arguments": {"expression": ', "malformed", {}),
    ('<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>', "malformed", {}),
    ("8478", "unmet", {"tool_choice": "required"}),
    (HERMES_CALL, "unmet", {"tool_choice": {"type": "function", "function": {"name": "weather"}}}),
])
def test_unread_replies_are_content_and_counted(text: str, outcome: str, kw: dict[str, Any]) -> None:
    ep, s, _ = serve(hermes_template(), [text])
    try:
        eid = ep.open_episode()
        reply = create(client(ep, eid), [{"role": "user", "content": "q"}], **kw).choices[0]
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    assert reply.message.content == text and not reply.message.tool_calls and reply.finish_reason == "stop"
    assert rec.branches[0].calls[0].sampled_ids == s.samples[0]
    assert ep.stats()["tool_parses"] == {outcome: 1} and metric(ep, outcome) == 1


def test_tool_choice_none_renders_the_tools_and_reads_nothing() -> None:
    ep, s, tok = serve(hermes_template(), [HERMES_CALL])
    try:
        eid = ep.open_episode()
        reply = create(client(ep, eid), [{"role": "user", "content": "q"}], tool_choice="none").choices[0]
    finally:
        ep.close()
    assert reply.message.content == HERMES_CALL and not reply.message.tool_calls
    assert "<tools>" in tok.decode(list(s.prompts[0])) and ep.stats()["tool_parses"] == {}


def test_streamed_tool_calls_come_in_the_last_chunks() -> None:
    ep, s, _ = serve(hermes_template(), ["Let me compute.\n" + HERMES_CALL], period=0.002)
    try:
        eid = ep.open_episode()
        chunks = list(create(client(ep, eid), [{"role": "user", "content": "q"}], stream=True))
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == "Let me compute.\n"              # the markup never went out as text
    calls = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == \
        [(0, "calculate", {"expression": "314 * 27"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert rec.branches[0].calls[0].sampled_ids == s.samples[0]


def bad(**kw: Any) -> bytes:
    return json.dumps({"model": "policy", "messages": [{"role": "user", "content": "q"}], "tools": TOOLS} | kw).encode()


@pytest.mark.parametrize("payload, param", [
    (bad(tools=[{"type": "function", "function": {"name": "no spaces"}}]), "tools[0].function.name"),
    (bad(tools=[TOOLS[0], TOOLS[0]]), "tools[1].function.name"),
    (bad(tools=[{"type": "retrieval"}]), "tools[0]"),
    (bad(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), "tools[0].function.parameters"),
    (bad(tools="calculate"), "tools"),
    (bad(tool_choice="always"), "tool_choice"),
    (bad(tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice.function.name"),
    (bad(tools=None, tool_choice="required"), "tool_choice"),
    (bad(messages=[{"role": "user", "content": "q"}, {"role": "tool", "content": "1"}]), "messages[1].tool_call_id"),
    (bad(messages=[{"role": "assistant", "content": None, "tool_calls": [{"id": "a", "function": {"name": "f"}}]}]),
     "messages[0].tool_calls[0]"),
])
def test_bad_tools_are_refused_naming_the_field(payload: bytes, param: str) -> None:
    ep, _, _ = serve(hermes_template(), [])
    try:
        status, doc = raw(ep, "POST", f"/episodes/{ep.open_episode()}/v1/chat/completions", payload)
    finally:
        ep.close()
    assert status == 400 and doc["error"]["code"] == "invalid_request" and doc["error"]["param"] == param
    assert param in doc["error"]["message"]


def test_tools_for_a_model_without_a_tool_format_are_refused() -> None:
    ep, _, _ = serve(None, [])                      # the tiny model: no chat template, no tool-call format
    try:
        status, doc = raw(ep, "POST", f"/episodes/{ep.open_episode()}/v1/chat/completions", bad())
    finally:
        ep.close()
    assert status == 400 and doc["error"]["code"] == "unsupported" and doc["error"]["param"] == "tools"
