"""Streaming and the endpoint's Prometheus series, without vLLM: the text each step may send (stop strings, split
characters), the chunks' shapes and framing over real HTTP, a client that leaves mid-stream, an engine error after
the 200 went out, and every counter against the requests that made it.

The samplers here implement ``endpoint.sampler.Sampler``: :class:`DripSampler` answers one token per step from a
thread of its own (as the engine does), so a test can leave between two steps; the scripted one is
``test_agents_endpoint``'s. Real vLLM: ``test_agents_endpoint_vllm.py``.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any

import openai
import pytest

from kubeforge.runtime.agents import endpoint
from kubeforge.runtime.models import tiny
from test_agents_endpoint import EOS, ScriptedSampler

Stream = endpoint.stream
BASE = {"role": "endpoint", "replica": "0"}


def value(ep: endpoint.server.Endpoint, name: str, **labels: str) -> float:
    got = ep.metrics.registry.get_sample_value(name, BASE | labels)
    return 0.0 if got is None else got


class DripSampler:
    """``n`` tokens ("a" ... then <eos>), one per ``period`` seconds from its own thread; stops when cancelled."""

    def __init__(self, tokenizer: Any, *, n: int = 40, period: float = 0.02, fail_after: int | None = None) -> None:
        self.policy, self.max_model_len = endpoint.sampler.Policy(), 512
        self.token = tokenizer.encode("a", add_special_tokens=False)[0]
        self.n, self.period, self.fail_after = n, period, fail_after
        self.ended: list[endpoint.sampler.Sample] = []
        self.done = threading.Event()

    def submit(self, request: endpoint.sampler.SampleRequest, *, timeout: float) -> endpoint.sampler.Pending:
        pending = endpoint.sampler.Pending(request)
        threading.Thread(target=self._drip, args=(pending,), daemon=True).start()
        return pending

    def _drip(self, pending: endpoint.sampler.Pending) -> None:
        ids: list[int] = []
        reason = "length"
        for i in range(min(self.n, pending.request.max_tokens)):
            time.sleep(self.period)
            if pending.cancelled:
                reason = endpoint.sampler.CANCELLED
                break
            if self.fail_after is not None and i == self.fail_after:
                pending.fail(RuntimeError("engine died"))
                self.done.set()
                return
            tok = EOS if i == self.n - 1 else self.token
            ids.append(tok)
            pending.push(endpoint.sampler.Step(token_ids=(tok,), logprobs=(-0.5,)))
        sample = endpoint.sampler.Sample(token_ids=tuple(ids), logprobs=tuple(-0.5 for _ in ids),
                                         finish_reason=reason)
        self.ended.append(sample)
        pending.end(sample)
        self.done.set()


@pytest.fixture
def tok() -> Any:
    return tiny.tokenizer()


def body(**kw: Any) -> bytes:
    return json.dumps({"model": "policy", "messages": [{"role": "user", "content": "q"}]} | kw).encode()


def read_events(ep: endpoint.server.Endpoint, eid: str, payload: bytes) -> tuple[http.client.HTTPResponse,
                                                                                   list[bytes]]:
    conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=10)
    conn.request("POST", f"/episodes/{eid}/v1/chat/completions", body=payload)
    resp = conn.getresponse()
    raw = resp.read()                       # http.client undoes the chunked coding
    conn.close()
    return resp, [e for e in raw.split(b"\n\n") if e]


# ---------------------------------------------------------------- the text of each step


def test_text_deltas_hold_back_split_characters_and_stop_prefixes(tok: Any) -> None:
    pieces = {1: "Hel", 2: "lo", 3: " EN", 4: "D", 5: "\u00e9"}
    decode = lambda ids: "".join(pieces[i] for i in ids)      # noqa: E731
    d = Stream.TextDeltas(decode=decode, stops=["END"])
    assert d.feed([1]) == "Hel" and d.feed([2]) == "lo"
    assert d.feed([3]) == " "               # "EN" may begin the stop string: held
    assert d.feed([4]) == ""                # it did: nothing after the stop is ever sent
    assert d.finish("Hello ") == "" and d.sent == "Hello "
    d = Stream.TextDeltas(decode=decode, stops=["END"])
    assert d.feed([1, 3]) == "Hel " and d.finish("Hel ENé") == "ENé"    # no stop after all: the rest at the end
    half = Stream.TextDeltas(decode=lambda ids: "ab" + Stream.REPLACEMENT * (len(ids) == 1), stops=())
    assert half.feed([1]) == "ab" and half.feed([2]) == ""             # a character's first byte waits for its rest


def test_chunks_and_framing() -> None:
    c = Stream.Chunks(ident="chatcmpl-x-1", created=5, model="policy")
    assert c.role()["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert c.finish("", finish_reason="stop")["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                                                 "finish_reason": "stop"}
    assert c.usage(prompt_tokens=3, completion_tokens=2) == {
        "id": "chatcmpl-x-1", "object": "chat.completion.chunk", "created": 5, "model": "policy", "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    assert Stream.event({"a": 1}) == b'data: {"a": 1}\n\n' and Stream.DONE == b"data: [DONE]\n\n"


# ---------------------------------------------------------------- over HTTP


def test_stream_is_chunked_sse_and_each_step_leaves_as_it_is_sampled(tok: Any) -> None:
    sampler = DripSampler(tok, n=6, period=0.05)
    ep = endpoint.server.Endpoint(sampler=sampler, chat=endpoint.chat.ChatTemplate(tok))
    try:
        eid = ep.open_episode()
        conn = http.client.HTTPConnection("127.0.0.1", ep.port, timeout=10)
        conn.request("POST", f"/episodes/{eid}/v1/chat/completions", body=body(stream=True))
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
        assert resp.getheader("Transfer-Encoding") == "chunked" and resp.getheader("Content-Length") is None
        arrivals, raw = [], b""
        while not raw.endswith(b"data: [DONE]\n\n"):
            raw += resp.read1(65536)
            arrivals.append(time.monotonic())
        assert resp.read() == b"" and resp.isclosed()           # then the chunked body's end
        # the same connection serves the next call (keep-alive after a chunked body)
        conn.request("GET", f"/episodes/{eid}/v1/models")
        assert conn.getresponse().status == 200
        conn.close()
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    events = [json.loads(e.removeprefix(b"data: ")) for e in raw.split(b"\n\n") if e and e != b"data: [DONE]"]
    texts = [e["choices"][0]["delta"].get("content") for e in events]
    assert texts == ["", "a", "a", "a", "a", "a", None]       # the role, five "a", the finish (<eos>: no text)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert arrivals[-1] - arrivals[0] > 0.1                      # not one write at the end
    assert rec.branches[0].calls[0].content == "aaaaa"


def test_client_leaving_mid_stream_cancels_and_is_recorded(tok: Any) -> None:
    sampler = DripSampler(tok, n=200, period=0.02)
    ep = endpoint.server.Endpoint(sampler=sampler, chat=endpoint.chat.ChatTemplate(tok),
                                  config=endpoint.server.EndpointConfig(max_tokens_per_call=200))
    try:
        eid = ep.open_episode()
        sock = socket.create_connection(("127.0.0.1", ep.port), timeout=10)
        payload = body(stream=True)
        sock.sendall(b"POST /episodes/%s/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                     % (eid.encode(), len(payload), payload))
        got = b""
        while got.count(b"data: ") < 3:                           # the role and two tokens
            got += sock.recv(65536)
        sock.close()
        assert sampler.done.wait(10)
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    assert rec.branches == [] and len(rec.disconnected) == 1
    call = rec.disconnected[0]
    assert call.finish_reason == endpoint.sampler.CANCELLED and 2 <= len(call.sampled_ids) < 200
    assert call.sampled_ids == sampler.ended[0].token_ids           # what the sampler produced, to the abort
    assert ep.disconnected == 1 and ep.answered == 0
    assert value(ep, "kubeforge_endpoint_requests_total", outcome="disconnected") == 1
    assert value(ep, "kubeforge_endpoint_tokens_total", kind="completion") == len(call.sampled_ids)


def test_engine_error_after_the_200_is_the_streams_last_event(tok: Any) -> None:
    ep = endpoint.server.Endpoint(sampler=DripSampler(tok, n=10, fail_after=3),
                                  chat=endpoint.chat.ChatTemplate(tok))
    try:
        eid = ep.open_episode()
        resp, events = read_events(ep, eid, body(stream=True))
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    assert resp.status == 200 and events[-1] == b"data: [DONE]"
    error = json.loads(events[-2].removeprefix(b"data: "))["error"]
    assert error["code"] == "sampler_error" and "engine died" in error["message"]
    assert rec.refused == {"sampler_error": 1} and rec.branches == []
    assert value(ep, "kubeforge_endpoint_refusals_total", reason="sampler_error") == 1
    assert value(ep, "kubeforge_endpoint_requests_total", outcome="refused") == 1


def test_openai_client_reads_the_mid_stream_error(tok: Any) -> None:
    ep = endpoint.server.Endpoint(sampler=DripSampler(tok, n=10, fail_after=2),
                                  chat=endpoint.chat.ChatTemplate(tok))
    try:
        c = openai.OpenAI(base_url=ep.base_url(ep.open_episode()), api_key="x", max_retries=0, timeout=10)
        with pytest.raises(openai.APIError, match="engine died"):
            list(c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}],
                                           stream=True))
    finally:
        ep.close()


# ---------------------------------------------------------------- the counters


def test_every_request_counted_once_by_outcome_with_reasons_tokens_and_latency(tok: Any) -> None:
    sampler = ScriptedSampler(tok)
    ep = endpoint.server.Endpoint(sampler=sampler, chat=endpoint.chat.ChatTemplate(tok))
    try:
        eid = ep.open_episode()
        c = openai.OpenAI(base_url=ep.base_url(eid), api_key="x", max_retries=0, timeout=10)
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "q"}]
        r1 = c.chat.completions.create(model="policy", messages=msgs)  # type: ignore[arg-type]
        msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "n"}]
        list(c.chat.completions.create(model="policy", messages=msgs, stream=True))  # type: ignore[arg-type]
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "other"}])
        for bad in ({"temperature": 0.5}, {"n": 3}):
            with pytest.raises(openai.BadRequestError):
                c.chat.completions.create(model="policy", messages=msgs, **bad)  # type: ignore[arg-type]
        c.models.list()
        rec = ep.close_episode(eid)
    finally:
        ep.close()
    calls = [call for b in rec.branches for call in b.calls]
    assert value(ep, "kubeforge_endpoint_requests_total", outcome="answered") == 4          # 3 calls + models
    assert value(ep, "kubeforge_endpoint_requests_total", outcome="refused") == 2 == ep.requests - 4
    assert value(ep, "kubeforge_endpoint_refusals_total", reason="unsupported_sampling") == 2
    for reason, n in {"first": 1, "extends": 1, "history_rewritten": 1}.items():
        assert value(ep, "kubeforge_endpoint_branches_total", reason=reason) == n == ep.branches[reason]
    assert value(ep, "kubeforge_endpoint_tokens_total", kind="prompt") == sum(len(x.prompt_ids) for x in calls)
    assert value(ep, "kubeforge_endpoint_tokens_total", kind="completion") == sum(len(x.sampled_ids) for x in calls)
    assert value(ep, "kubeforge_endpoint_request_seconds_count", stream="false") == 2
    assert value(ep, "kubeforge_endpoint_request_seconds_count", stream="true") == 1
    assert value(ep, "kubeforge_endpoint_first_token_seconds_count") == 1
    assert value(ep, "kubeforge_endpoint_request_seconds_sum", stream="true") >= \
        value(ep, "kubeforge_endpoint_first_token_seconds_sum") > 0


def test_the_roles_registry_serves_the_endpoints_series(tok: Any) -> None:
    from kubeforge.runtime import metrics

    m = metrics.Metrics(role="generator", replica=1)
    ep = endpoint.server.Endpoint(sampler=ScriptedSampler(tok), chat=endpoint.chat.ChatTemplate(tok), metrics=m)
    server = metrics.serve(m, host="127.0.0.1", port_base=0)
    try:
        c = openai.OpenAI(base_url=ep.base_url(ep.open_episode()), api_key="x", max_retries=0, timeout=10)
        c.chat.completions.create(model="policy", messages=[{"role": "user", "content": "q"}])
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        server.stop()
        ep.close()
    assert 'kubeforge_endpoint_requests_total{outcome="answered",replica="1",role="generator"} 1.0' in text
    assert 'kubeforge_endpoint_branches_total{reason="first",replica="1",role="generator"} 1.0' in text
