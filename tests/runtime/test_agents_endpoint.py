"""The OpenAI-compatible endpoint over real HTTP with the real ``openai`` client and a deterministic sampler of ours.

The sampler (:class:`ScriptedSampler`) implements ``endpoint.sampler.Sampler``: it answers each prompt with a reply
derived from the prompt's length, ending in ``<eos>``, and keeps every prompt it was given, so the tests check the
exact token sequences the endpoint builds: delta tokenisation (no re-tokenisation of sampled ids), branches when the
agent rewrites history, and every refusal's status and counter. The tokenizer is the tiny built-in's (built from
code). Real vLLM: ``test_agents_endpoint_vllm.py``.
"""
from __future__ import annotations

import http.client
import json
import threading
from typing import Any

import openai
import pytest

from kubeforge.runtime.agents import endpoint
from kubeforge.runtime.models import tiny

EOS = 1


class ScriptedSampler:
    """Replies ``r<len(prompt)>`` + <eos> (or ``max_tokens`` of them, finish "length"); logprob -0.25 per token."""

    def __init__(self, tokenizer: Any, *, policy: endpoint.sampler.Policy | None = None) -> None:
        self.tokenizer = tokenizer
        self.policy = policy or endpoint.sampler.Policy()
        self.max_model_len = 512
        self.prompts: list[tuple[int, ...]] = []
        self.gate: threading.Event | None = None
        self.error: Exception | None = None

    def sample(self, request: endpoint.sampler.SampleRequest, *, timeout: float) -> endpoint.sampler.Sample:
        if self.gate is not None and not self.gate.wait(timeout):
            raise endpoint.sampler.SamplerTimeout(f"no sample within {timeout:g} s")
        if self.error is not None:
            raise self.error
        self.prompts.append(request.prompt_ids)
        ids = tuple(self.tokenizer.encode(f"r{len(request.prompt_ids)}", add_special_tokens=False)) + (EOS,)
        finish = "stop"
        if len(ids) > request.max_tokens:
            ids, finish = ids[:request.max_tokens], "length"
        return endpoint.sampler.Sample(token_ids=ids, logprobs=tuple(-0.25 for _ in ids), finish_reason=finish)

    def submit(self, request: endpoint.sampler.SampleRequest, *, timeout: float) -> endpoint.sampler.Pending:
        return endpoint.sampler.answered(request, self.sample(request, timeout=timeout))


class Sink:
    """The episode record's two append methods (docs/agents.md), as the generator's Episode implements them."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.spans: list[tuple[int, int]] = []

    def add_policy_turn(self, token_ids: Any, logprobs: Any, text: str) -> None:
        self.spans.append((len(self.token_ids), len(self.token_ids) + len(token_ids)))
        self.token_ids += list(token_ids)
        self.logprobs += list(logprobs)

    def add_environment_turn(self, token_ids: Any, text: str) -> None:
        self.token_ids += list(token_ids)
        self.logprobs += [0.0] * len(token_ids)


@pytest.fixture
def tok() -> Any:
    return tiny.tokenizer()


@pytest.fixture
def served(tok: Any) -> Any:
    sampler = ScriptedSampler(tok)
    ep = endpoint.server.Endpoint(sampler=sampler, chat=endpoint.chat.ChatTemplate(tok),
                                  config=endpoint.server.EndpointConfig(request_timeout=5, max_tokens_per_call=16))
    yield ep, sampler
    ep.close()


def client(ep: endpoint.server.Endpoint, episode: str, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=ep.base_url(episode), api_key=api_key, max_retries=0, timeout=10)


def chat(c: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return c.chat.completions.create(model="policy", messages=messages, **kw)  # type: ignore[arg-type]


def raw(ep: endpoint.server.Endpoint, method: str, path: str, body: bytes | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


# ---------------------------------------------------------------- the token record


def test_three_turns_extend_one_token_sequence(served: Any, tok: Any) -> None:
    ep, sampler = served
    eid = ep.open_episode()
    c = client(ep, eid)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "guess"}]
    for turn in range(3):
        reply = chat(c, messages)
        assert reply.choices[0].finish_reason == "stop"
        messages += [reply.choices[0].message.model_dump(), {"role": "user", "content": f"no{turn}"}]
    rec = ep.close_episode(eid)
    assert len(rec.branches) == 1 and rec.calls == 3
    branch = rec.branches[0]
    # each prompt is the previous prompt + the sampled ids + the delta: nothing re-tokenised
    for prev, nxt in zip(sampler.prompts, sampler.prompts[1:]):
        call = next(c for c in branch.calls if c.prompt_ids == nxt)
        assert nxt[:len(prev)] == prev
        assert nxt[len(prev):len(prev) + len(branch.calls[sampler.prompts.index(prev)].sampled_ids)] == \
            branch.calls[sampler.prompts.index(prev)].sampled_ids
        assert call.delta_text.startswith("\nuser: no") and call.delta_text.endswith("assistant: ")
    # the whole sequence reads as the template's rendering with the model's <eos> after each reply
    text = tok.decode(list(branch.prompt_ids + branch.token_ids()), skip_special_tokens=False)
    n0, n1, n2 = (len(p) for p in sampler.prompts)
    assert text == (f"user: guess\nassistant: r{n0}<eos>\nuser: no0\nassistant: r{n1}<eos>\n"
                    f"user: no1\nassistant: r{n2}<eos>")
    sink = Sink()
    branch.replay(sink)
    assert tuple(sink.token_ids) == branch.token_ids()
    assert tuple(sink.spans) == branch.policy_spans()
    sampled = [t for s, e in sink.spans for t in sink.token_ids[s:e]]
    assert sampled == [t for call in branch.calls for t in call.sampled_ids]
    assert all(sink.logprobs[i] == -0.25 for s, e in sink.spans for i in range(s, e))
    assert sum(1 for lp in sink.logprobs if lp == 0.0) == len(sink.token_ids) - len(sampled)
    assert ep.branches == {"first": 1, "extends": 2}


def test_an_end_of_turn_token_the_model_emitted_is_not_fed_twice(tok: Any) -> None:
    """A template that closes assistant turns with the EOS the model samples: the delta starts after it."""
    template = ("{%- for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>\n{% endfor -%}"
                "{%- if add_generation_prompt %}assistant: {% endif -%}")
    chat_t = endpoint.chat.ChatTemplate(tok, template=template)
    first = endpoint.chat.plan(chat_t, [{"role": "user", "content": "a"}], None)
    sampled = tuple(tok.encode("x", add_special_tokens=False)) + (EOS,)
    prev = endpoint.chat.Turn(messages=first.messages, prompt_ids=first.prompt_ids, sampled_ids=sampled, content="x")
    nxt = endpoint.chat.plan(chat_t, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"},
                                      {"role": "user", "content": "b"}], prev)
    assert nxt.extends and nxt.delta_text == "\nuser: b<eos>\nassistant: "
    assert nxt.prompt_ids == first.prompt_ids + sampled + nxt.delta_ids
    full = chat_t.encode(chat_t.render(nxt.messages, generation_prompt=True))
    assert nxt.prompt_ids == full           # here the exact ids also equal a fresh tokenisation


def test_length_truncated_reply_then_extension(served: Any, tok: Any) -> None:
    ep, sampler = served
    eid = ep.open_episode()
    c = client(ep, eid)
    first = chat(c, [{"role": "user", "content": "q"}], max_tokens=2)
    assert first.choices[0].finish_reason == "length" and first.choices[0].message.content == "r1"
    chat(c, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r1"},
             {"role": "user", "content": "go on"}])
    branch = ep.close_episode(eid).branches[0]
    assert branch.calls[1].delta_text == "\nuser: go on\nassistant: "
    assert sampler.prompts[1] == sampler.prompts[0] + branch.calls[0].sampled_ids + branch.calls[1].delta_ids


def test_rewritten_history_starts_a_branch(served: Any) -> None:
    ep, _ = served
    eid = ep.open_episode()
    c = client(ep, eid)
    r1 = chat(c, [{"role": "user", "content": "q"}]).choices[0].message.content
    chat(c, [{"role": "user", "content": "q"}, {"role": "assistant", "content": r1 + " (edited)"},
             {"role": "user", "content": "next"}])
    chat(c, [{"role": "user", "content": "summary only"}])
    rec = ep.close_episode(eid)
    assert [b.reason for b in rec.branches] == ["first", "history_rewritten", "history_rewritten"]
    assert rec.final is rec.branches[-1] and len(rec.final.calls) == 1
    assert ep.branches["history_rewritten"] == 2


# ---------------------------------------------------------------- refusals, each counted


def test_refusals_have_status_and_count(served: Any) -> None:
    ep, _ = served
    eid = ep.open_episode()
    c = client(ep, eid)
    msgs = [{"role": "user", "content": "q"}]
    with pytest.raises(openai.NotFoundError):
        chat(client(ep, "nosuchepisode"), msgs)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=msgs)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="temperature=0.7 differs"):
        chat(c, msgs, temperature=0.7)
    with pytest.raises(openai.BadRequestError, match="n=2"):
        chat(c, msgs, n=2)
    with pytest.raises(openai.BadRequestError, match="stream must be"):
        chat(c, msgs, extra_body={"stream": "yes"})
    with pytest.raises(openai.BadRequestError, match="messages"):
        chat(c, [])
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        chat(c, msgs, logprobs=True, top_logprobs=2)
    chat(c, msgs, temperature=1.0, top_p=1.0)              # the job's own values are fine
    path = f"/episodes/{eid}/v1/chat/completions"
    assert raw(ep, "POST", path, b"{not json")[0] == 400
    assert raw(ep, "POST", path, b"[1, 2]")[0] == 400
    # an oversize body is refused from its header, unread (a tiny body here: no race with the closing socket)
    status, body = raw(ep, "POST", path, b"{}", headers={"Content-Length": str(ep.config.max_body_bytes + 1)})
    assert status == 413 and body["error"]["code"] == "body_too_large"
    assert raw(ep, "PUT", path)[0] == 405
    assert raw(ep, "GET", "/v2/other")[0] == 404
    assert raw(ep, "POST", "/v1/chat/completions", json.dumps({"model": "policy", "messages": msgs}).encode())[0] \
        == 404
    ep.close_episode(eid)
    with pytest.raises(openai.NotFoundError):
        chat(c, msgs)                                       # closed: gone
    assert ep.refused == {"unknown_episode": 3, "model_not_found": 1, "unsupported_sampling": 2, "unsupported": 1,
                          "invalid_request": 3, "bad_json": 1, "body_too_large": 1, "method_not_allowed": 1,
                          "not_found": 1}
    assert ep.answered == 1


def test_streaming_answers_the_same_record(served: Any) -> None:
    ep, sampler = served
    eid = ep.open_episode()
    c = client(ep, eid)
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
    chunks = list(chat(c, msgs, stream=True, stream_options={"include_usage": True}, logprobs=True))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    choices = [ch for ch in chunks if ch.choices]
    # the role, one chunk per sampled token (the scripted sampler's steps are single tokens), the finish
    assert choices[0].choices[0].delta.role == "assistant"
    assert [ch.choices[0].finish_reason for ch in choices] == [None] * (len(choices) - 1) + ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(content) + 1   # + <eos>
    assert len(choices) == 2 + chunks[-1].usage.completion_tokens
    streamed_lps = [t.logprob for ch in choices if ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    msgs += [{"role": "assistant", "content": content}, {"role": "user", "content": "more"}]
    chat(c, msgs)
    rec = ep.close_episode(eid)
    assert [call.reason for call in rec.branches[0].calls] == ["first", "extends"]
    assert rec.branches[0].calls[0].content == content == f"r{len(sampler.prompts[0])}"
    assert streamed_lps == list(rec.branches[0].calls[0].logprobs)


def test_models_route(served: Any) -> None:
    ep, _ = served
    assert [m.id for m in client(ep, ep.open_episode()).models.list()] == ["policy"]
    assert raw(ep, "GET", "/v1/models")[1]["data"][0]["id"] == "policy"


def test_limits_per_episode(tok: Any) -> None:
    sampler = ScriptedSampler(tok)
    ep = endpoint.server.Endpoint(sampler=sampler, chat=endpoint.chat.ChatTemplate(tok),
                                  config=endpoint.server.EndpointConfig(max_calls_per_episode=2, max_episode_tokens=40))
    try:
        c = client(ep, ep.open_episode())
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
        r = chat(c, msgs, max_tokens=50)                    # capped by the episode budget, not refused
        assert r.usage is not None and r.usage.completion_tokens == 4
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": "x" * 40}]
        with pytest.raises(openai.BadRequestError, match="episode holds"):
            chat(c, msgs)
        chat(c, [{"role": "user", "content": "fresh"}])     # a new branch has its own budget
        with pytest.raises(openai.BadRequestError, match="at most 2"):
            chat(c, [{"role": "user", "content": "third"}])
        sampler.max_model_len = 10
        with pytest.raises(openai.BadRequestError):
            chat(client(ep, ep.open_episode()), [{"role": "user", "content": "a long prompt"}])
        assert ep.refused == {"episode_token_budget": 1, "episode_call_limit": 1, "context_length_exceeded": 1}
    finally:
        ep.close()


def test_busy_episode_timeout_and_sampler_error(tok: Any) -> None:
    sampler = ScriptedSampler(tok)
    ep = endpoint.server.Endpoint(sampler=sampler, chat=endpoint.chat.ChatTemplate(tok),
                                  config=endpoint.server.EndpointConfig(request_timeout=1.0))
    try:
        eid = ep.open_episode()
        sampler.gate = threading.Event()
        first = threading.Thread(target=lambda: raw(ep, "POST", f"/episodes/{eid}/v1/chat/completions",
                                                    json.dumps({"model": "policy", "messages": [
                                                        {"role": "user", "content": "q"}]}).encode()))
        first.start()
        while ep.requests < 1:
            threading.Event().wait(0.01)
        threading.Event().wait(0.2)
        with pytest.raises(openai.ConflictError):
            chat(client(ep, eid), [{"role": "user", "content": "q"}])
        first.join(timeout=10)
        assert not first.is_alive()
        sampler.gate = None
        sampler.error = RuntimeError("engine died")
        with pytest.raises(openai.InternalServerError, match="engine died"):
            chat(client(ep, eid), [{"role": "user", "content": "q"}])
        assert ep.refused == {"episode_busy": 1, "sampler_timeout": 1, "sampler_error": 1}
    finally:
        ep.close()


def test_authentication_beyond_loopback(tok: Any) -> None:
    with pytest.raises(ValueError, match="without the job key"):
        endpoint.server.EndpointConfig(host="0.0.0.0")
    key = bytes(range(32))
    ep = endpoint.server.Endpoint(sampler=ScriptedSampler(tok), chat=endpoint.chat.ChatTemplate(tok),
                                  config=endpoint.server.EndpointConfig(host="127.0.0.1", key=key))
    try:
        eid = ep.open_episode()
        msgs = [{"role": "user", "content": "q"}]
        with pytest.raises(openai.AuthenticationError):
            chat(client(ep, eid, api_key="wrong"), msgs)
        with pytest.raises(openai.AuthenticationError):
            chat(client(ep, eid, api_key=key.hex()), msgs)      # the raw key is not the token
        assert chat(client(ep, eid, api_key=endpoint.server.api_key(key)), msgs).choices[0].message.content
        assert ep.refused == {"unauthorized": 2}
    finally:
        ep.close()


def test_recording_refuses_a_call_that_breaks_its_sequence() -> None:
    branch = endpoint.record.Branch()
    call = endpoint.record.Call(prompt_ids=(5, 6), delta_ids=(), delta_text="", sampled_ids=(7,), logprobs=(-1.0,),
                                content="a", finish_reason="stop", reason="first")
    branch.append(call, ())
    bad = endpoint.record.Call(prompt_ids=(5, 6, 9), delta_ids=(8,), delta_text="b", sampled_ids=(1,),
                               logprobs=(-1.0,), content="c", finish_reason="stop", reason="extends")
    with pytest.raises(ValueError, match="does not extend"):
        branch.append(bad, ())
