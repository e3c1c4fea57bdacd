"""An OpenAI-compatible endpoint in front of a generator's engine that records every call into its episode.

Neighbours: ``request`` validates a body, ``chat`` turns messages into prompt ids without re-tokenisation drift,
``sampler`` samples (vLLM, batched), ``record`` keeps the episode's calls.
Its users: the ``Verifiers`` adapter (``primeintellect.adapter``) and any agent written against the ``openai`` client.

Routes (``<id>``: an episode opened with :meth:`Endpoint.open_episode`; its ``base_url`` is
``http://host:port/episodes/<id>/v1``, so an unchanged ``openai`` client attributes every call to it)::

    POST /episodes/<id>/v1/chat/completions   one completion, recorded into episode <id> (``stream: true``:
                                               server-sent events, each engine step's text as it is sampled)
    GET  /episodes/<id>/v1/models, /v1/models  the one served model

Threads::

    ThreadingHTTPServer ─ one thread per connection ─▶ Endpoint.complete ─▶ sampler.submit ─▶ Pending
      (serve_forever in "kf-endpoint")                  (episode lock: one call at a time per episode)
                                                        Pending.steps (bounded wait) ─▶ one event per step (stream)
                                                        or its whole Sample ─▶ one JSON body

Invariants:
- Every refusal has an HTTP status and an OpenAI-style ``error.code`` and is counted in :attr:`Endpoint.refused` by
  that code: unknown episode 404, bad JSON 400, body over ``max_body_bytes`` 413 (not read), no Content-Length 411,
  wrong or missing key 401, a second concurrent call into one episode 409, more than ``max_in_flight`` calls 503,
  sampling the trainer cannot honour 400 (``request``), sampler queue full 503, sampler timeout 504.
- Every wait is bounded: reading a body and writing an event (``read_timeout``: the socket's), a sample
  (``request_timeout``), ``close``.
- A streamed call records exactly what a whole one does (the sampled ids and logprobs, ``stream.py``'s text
  invariant). A client that leaves mid-stream cancels the sample; the call goes to ``Recording.disconnected``, not
  into a branch, and the request counts as ``disconnected``.
- Counters: :attr:`refused`, :attr:`branches`, :attr:`answered`, :attr:`tool_parses` here, and the same as
  Prometheus series in :attr:`metrics` (the role's registry when given: ``endpoint_*`` in docs/metrics.md), with
  the tokens, the latency and, for streams, the time to the first content.
- Tool calls: with ``tools`` (and a ``tool_choice`` other than none) a reply's text is read in the model's
  tool-call format (``agents.toolcalls``) into OpenAI ``tool_calls``; the recorded ids stay what vLLM sampled
  (the parse is a view over their text), and markup that does not parse is returned as content, counted.
- Authentication: bound to loopback by default (the agent runs in the same pod). Any other bind address needs the
  job key; then every call carries ``Authorization: Bearer <api_key(key)>`` (an ``openai`` client's ``api_key``),
  an HMAC of the job key, checked in constant time (docs/agents-endpoint.md, "Authentication"), or, into episode
  ``<id>``, that episode's own ``episode_key(key, id)``: the credential an agent pod gets with the episode, good
  for that episode only (another open episode's: 403 ``wrong_episode``, counted).
- Agent pods (``spec.agent``; docs/agents.md, "Agents in their own pods"): with ``EndpointConfig.agent_key`` and a
  ``handout`` (``agents.pods.dispatch.Dispatch``) it also serves::

    POST /agents/claim                      Bearer <agent key>: the next waiting episode (long poll, bounded)
    POST /agents/episodes/<id>/heartbeat    Bearer <episode key>: the pod still runs it ({"open": false}: stop)
    POST /agents/episodes/<id>/done         Bearer <episode key>: its program ended ({"exit_code", "timed_out"})
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import http.server
import ipaddress
import json
import re
import secrets
import threading
import time
from typing import Any, Protocol

from kubeforge.runtime import metrics as metrics_mod
from kubeforge.runtime.agents.endpoint import chat, record, request, sampler, stream
from kubeforge.runtime.agents.toolcalls import choice as tool_choice

Refusal = request.Refusal
ANSWERED, REFUSED, DISCONNECTED = "answered", "refused", "disconnected"     # endpoint_requests_total's outcomes
ROUTE = re.compile(r"^(?:/episodes/(?P<episode>[A-Za-z0-9_-]{1,64}))?/v1/(?P<op>models|chat/completions)/?$")
AGENT_ROUTE = re.compile(r"^/agents/(?:(?P<claim>claim)|episodes/(?P<episode>[A-Za-z0-9_-]{1,64})/"
                         r"(?P<op>heartbeat|done))/?$")


class Handout(Protocol):
    """Where agent pods claim episodes (``agents.pods.dispatch.Dispatch``)."""

    def claim(self, *, wait: float) -> Any: ...

    def beat(self, episode_id: str) -> bool: ...

    def touch(self, episode_id: str) -> None: ...

    def done(self, episode_id: str, *, exit_code: int, timed_out: bool) -> bool: ...


def api_key(key: bytes) -> str:
    """The bearer token a client presents when the endpoint is bound beyond loopback: derived from the job key,
    so the key itself never travels."""
    return hmac.new(key, b"kubeforge/agents-endpoint", hashlib.sha256).hexdigest()


def episode_key(key: bytes, episode_id: str) -> str:
    """The credential of one episode (an agent pod gets it with the episode): derived from the job key and the
    episode's id, so it opens that episode only, and the job key never leaves the generator."""
    return hmac.new(key, b"kubeforge/agents-episode/" + episode_id.encode(), hashlib.sha256).hexdigest()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class EndpointConfig:
    host: str = "127.0.0.1"
    port: int = 0                          # 0: an ephemeral port (Endpoint.port tells which)
    model: str = "policy"                  # the name /v1/models serves and requests must name
    key: bytes | None = None               # the job key: required unless bound to loopback
    agent_key: bytes | None = None         # agent pods' credential for /agents/claim (None: no such routes)
    max_body_bytes: int = 1 << 20
    max_tokens_per_call: int = 256
    max_episode_tokens: int = 4096         # tokens after a branch's first prompt (policy + environment)
    max_calls_per_episode: int = 64
    max_in_flight: int = 64
    request_timeout: float = 120.0
    read_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.key is None and not is_loopback(self.host):
            raise ValueError(f"endpoint bound to {self.host!r} without the job key: bind to 127.0.0.1 or set "
                             "KUBEFORGE_JOB_KEY (docs/agents-endpoint.md, Authentication)")
        if self.agent_key is not None and self.key is None:
            raise ValueError("agent pods need the job key: each episode's credential derives from it")


@dataclasses.dataclass(kw_only=True)
class _Episode:
    recording: record.Recording
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class Endpoint:
    """The HTTP server, the open episodes and the counters."""

    def __init__(self, *, sampler: sampler.Sampler, chat: chat.ChatTemplate, config: EndpointConfig | None = None,
                 metrics: metrics_mod.Metrics | None = None, handout: Handout | None = None) -> None:
        self.sampler, self.chat = sampler, chat
        self.config = config or EndpointConfig()
        self.handout = handout if self.config.agent_key is not None else None
        self._episodes: dict[str, _Episode] = {}
        self._tokens: dict[str, str] = {}      # open episodes' credentials -> their ids (to tell a wrong episode)
        self._lock = threading.Lock()
        self._in_flight = threading.BoundedSemaphore(self.config.max_in_flight)
        self.refused: collections.Counter[str] = collections.Counter()
        self.requests = 0
        self.answered = 0
        self.branches: collections.Counter[str] = collections.Counter()
        self.disconnected = 0
        self.tool_parses: collections.Counter[str] = collections.Counter()    # by toolcalls.choice outcome
        # the role's registry (served on the pod's /metrics) or one of its own (tests read ep.metrics)
        self.metrics = metrics or metrics_mod.Metrics(role="endpoint", replica=0)
        self._httpd = _Server((self.config.host, self.config.port), _handler(self))
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="kf-endpoint", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ episodes

    def open_episode(self) -> str:
        """A new episode; its id is unguessable (128 random bits), so one agent cannot write into another's."""
        episode_id = secrets.token_urlsafe(16)
        with self._lock:
            self._episodes[episode_id] = _Episode(recording=record.Recording(episode_id=episode_id))
            if self.config.key is not None:
                self._tokens[episode_key(self.config.key, episode_id)] = episode_id
        return episode_id

    def base_url(self, episode_id: str, *, host: str | None = None) -> str:
        return f"http://{host or self.config.host}:{self.port}/episodes/{episode_id}/v1"

    def close_episode(self, episode_id: str) -> record.Recording:
        """Stop serving the episode (later calls: 404) and hand over what it recorded."""
        with self._lock:
            ep = self._episodes.pop(episode_id)
            if self.config.key is not None:
                self._tokens.pop(episode_key(self.config.key, episode_id), None)
        # a call still running finishes its record first (it ends within request_timeout: the sampler's bound)
        if not ep.lock.acquire(timeout=self.config.request_timeout + 5.0):
            raise TimeoutError(f"episode {episode_id!r}: a call still running after {self.config.request_timeout:g} s")
        ep.lock.release()
        return ep.recording

    def close(self, timeout: float = 10.0) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=timeout)

    def stats(self) -> dict[str, Any]:
        return {"requests": self.requests, "answered": self.answered, "refused": dict(self.refused),
                "branches": dict(self.branches), "disconnected": self.disconnected,
                "tool_parses": dict(self.tool_parses),
                "episodes_open": len(self._episodes)}

    # ------------------------------------------------------------ one call

    def complete(self, episode_id: str | None, body: Any) -> dict[str, Any]:
        """One chat completion in process (no HTTP: tests, in-process agents): the whole response, also when the
        body asks for a stream. A Refusal otherwise."""
        reply = _Whole()
        self.serve(episode_id, {**body, "stream": False} if isinstance(body, dict) else body, reply)
        return reply.payload

    def serve(self, episode_id: str | None, body: Any, reply: stream.Reply) -> str:
        """One chat completion into ``episode_id``, answered through ``reply`` (a Refusal before anything was sent,
        or, mid-stream, to be sent as an error event). Returns the outcome: ``answered`` or ``disconnected``."""
        if episode_id is None:
            raise Refusal(404, "unknown_episode", "no episode in the URL: use the base_url "
                                                  "http://host:port/episodes/<id>/v1 given for the episode")
        with self._lock:
            ep = self._episodes.get(episode_id)
        if ep is None:
            raise Refusal(404, "unknown_episode", f"episode {episode_id!r} is not open (never opened, or closed)")
        if self.handout is not None:
            self.handout.touch(episode_id)      # a model call is as good as a heartbeat
        if not ep.lock.acquire(blocking=False):
            raise Refusal(409, "episode_busy", "another call of this episode is running: one call at a time")
        try:
            req = request.parse(body, model=self.config.model, policy=self.sampler.policy,
                                tool_calls=self.chat.tool_format is not None)
            return self._complete(ep.recording, req, reply)
        except Refusal as refusal:     # the episode's owner reads why its calls stopped (a bound, a bad request)
            ep.recording.refused[refusal.code] += 1
            raise
        finally:
            ep.lock.release()

    def _complete(self, rec: record.Recording, req: request.ChatRequest, reply: stream.Reply) -> str:
        started, cfg = time.monotonic(), self.config
        if rec.calls >= cfg.max_calls_per_episode:
            raise Refusal(400, "episode_call_limit", f"the episode made {rec.calls} calls: at most "
                                                     f"{cfg.max_calls_per_episode}")
        plan = chat.plan(self.chat, req.messages, rec.previous(), tools=req.tools)
        max_tokens = self._max_tokens(rec, plan, req)
        sample_req = sampler.SampleRequest(prompt_ids=plan.prompt_ids, max_tokens=max_tokens, stop=req.stop,
                                           seed=req.seed)
        try:
            pending = self.sampler.submit(sample_req, timeout=cfg.request_timeout)
        except Exception as exc:  # noqa: BLE001 - refused with the sampler's reason, counted
            raise _sampler_refusal(exc) from None
        if req.stream:
            return self._stream(rec, req, plan, pending, reply, started)
        try:
            sample = pending.result(timeout=cfg.request_timeout)
        except Exception as exc:  # noqa: BLE001
            raise _sampler_refusal(exc) from None
        call = self._record(rec, plan, sample, req)
        reply.send(200, self._response(rec, call, logprobs=req.logprobs))
        self._observe(call, started=started, stream=False)
        return ANSWERED

    def _stream(self, rec: record.Recording, req: request.ChatRequest, plan: chat.Plan, pending: sampler.Pending,
                reply: stream.Reply, started: float) -> str:
        """Each engine step's text as it is sampled (stream.py's diagram). A client that goes away cancels the
        sample; what vLLM sampled for it is kept in ``Recording.disconnected`` (in no branch: the agent never got
        it whole, so it cannot extend it)."""
        shapes = stream.Chunks(ident=f"chatcmpl-{rec.episode_id}-{rec.calls + 1}", created=int(time.time()),
                               model=self.config.model)
        fmt = self.chat.tool_format if req.tools and req.tool_choice.parses else None
        text = stream.TextDeltas(decode=lambda ids: self.chat.decode(ids, skip_special=True), stops=req.stop,
                                 holds=fmt.opens if fmt is not None else ())
        alive = reply.open_stream() and reply.event(shapes.role())
        first: float | None = None
        try:
            for step in pending.steps(timeout=self.config.request_timeout):
                if not alive:
                    pending.cancel()             # drained on: the engine ends it at its next step
                    continue
                new = text.feed(step.token_ids)
                lps = self._logprobs(step.token_ids, step.logprobs) if req.logprobs else None
                if new or lps:
                    alive = reply.event(shapes.delta(new, logprobs=lps))
                    first = first if first is not None or not new else time.monotonic()
        except Exception as exc:  # noqa: BLE001 - sent as an error event while the client listens
            raise _sampler_refusal(exc) from None
        assert pending.sample is not None
        if not alive:
            return self._disconnected(rec, plan, pending.sample, req.stop)
        call = self._record(rec, plan, pending.sample, req)
        alive = self._finish_stream(reply, shapes, text, call)
        if alive and req.stream_usage:
            alive = reply.event(shapes.usage(prompt_tokens=len(call.prompt_ids),
                                             completion_tokens=len(call.sampled_ids)))
        if alive:
            reply.end_stream()
        self._observe(call, started=started, stream=True, first=first)
        return ANSWERED

    @staticmethod
    def _finish_stream(reply: stream.Reply, shapes: stream.Chunks, text: stream.TextDeltas,
                       call: record.Call) -> bool:
        """The last choice chunks: the rest of the content, then the tool calls when the reply has them."""
        message = call.message()
        rest = text.finish(message["content"] or "")
        if not call.reply:
            return reply.event(shapes.finish(rest, finish_reason=call.finish_reason))
        alive = not rest or reply.event(shapes.delta(rest, logprobs=None))
        alive = alive and reply.event(shapes.tool_calls(message["tool_calls"]))
        return alive and reply.event(shapes.finish("", finish_reason=tool_choice.TOOL_CALLS))

    def _record(self, rec: record.Recording, plan: chat.Plan, sample: sampler.Sample,
                req: request.ChatRequest) -> record.Call:
        call = self._read_tools(self._call(plan, sample, req.stop), req)
        rec.add(call, plan.messages)
        with self._lock:
            self.branches[plan.reason] += 1
            self.answered += 1
        self.metrics.endpoint_branches.labels(reason=plan.reason).inc()
        return call

    def _call(self, plan: chat.Plan, sample: sampler.Sample, stops: tuple[str, ...]) -> record.Call:
        content = _cut_at_stop(self.chat.decode(sample.token_ids, skip_special=True), stops, sample)
        return record.Call(prompt_ids=plan.prompt_ids, delta_ids=plan.delta_ids, delta_text=plan.delta_text,
                           sampled_ids=sample.token_ids, logprobs=sample.logprobs, content=content,
                           finish_reason=sample.finish_reason, reason=plan.reason)

    def _read_tools(self, call: record.Call, req: request.ChatRequest) -> record.Call:
        """The call with its text read for tool calls when the request offered tools (counted by outcome)."""
        fmt = self.chat.tool_format
        if fmt is None or not req.tools or not req.tool_choice.parses:
            return call
        offered = {t["function"]["name"] for t in req.tools}
        got = tool_choice.reply(fmt, call.content, offered=offered, choice=req.tool_choice)
        with self._lock:
            self.tool_parses[got.outcome] += 1
        self.metrics.endpoint_tool_parses.labels(outcome=got.outcome).inc()
        return dataclasses.replace(call, reply=got.message() if got.calls else None, tool_outcome=got.outcome)

    def _disconnected(self, rec: record.Recording, plan: chat.Plan, sample: sampler.Sample,
                      stops: tuple[str, ...]) -> str:
        call = self._call(plan, sample, stops)
        rec.disconnected.append(call)
        with self._lock:
            self.disconnected += 1
        self._count_tokens(call)
        return DISCONNECTED

    def _observe(self, call: record.Call, *, started: float, stream: bool, first: float | None = None) -> None:
        m = self.metrics
        self._count_tokens(call)
        m.endpoint_request_seconds.labels(stream=str(stream).lower()).observe(time.monotonic() - started)
        if first is not None:
            m.endpoint_first_token_seconds.observe(first - started)

    def _count_tokens(self, call: record.Call) -> None:
        self.metrics.endpoint_tokens.labels(kind="prompt").inc(len(call.prompt_ids))
        self.metrics.endpoint_tokens.labels(kind="completion").inc(len(call.sampled_ids))

    def _max_tokens(self, rec: record.Recording, plan: chat.Plan,
                    req: request.ChatRequest) -> int:
        cfg = self.config
        used = (len(rec.final.token_ids()) if rec.final is not None and plan.extends else 0) + len(plan.delta_ids)
        room = self.sampler.max_model_len - len(plan.prompt_ids)
        if room < 1:
            raise Refusal(400, "context_length_exceeded", f"the prompt is {len(plan.prompt_ids)} tokens: the model "
                                                          f"takes {self.sampler.max_model_len}")
        if cfg.max_episode_tokens - used < 1:
            raise Refusal(400, "episode_token_budget", f"the episode holds {used} tokens: at most "
                                                       f"{cfg.max_episode_tokens}")
        return min(req.max_tokens or cfg.max_tokens_per_call, cfg.max_tokens_per_call, room,
                   cfg.max_episode_tokens - used)

    def _response(self, rec: record.Recording, call: record.Call, *,
                  logprobs: bool) -> dict[str, Any]:
        finish = tool_choice.TOOL_CALLS if call.reply else call.finish_reason
        choice: dict[str, Any] = {"index": 0, "message": call.message(), "finish_reason": finish, "logprobs": None}
        if logprobs:
            choice["logprobs"] = {"content": self._logprobs(call.sampled_ids, call.logprobs)}
        n_prompt, n_out = len(call.prompt_ids), len(call.sampled_ids)
        return {"id": f"chatcmpl-{rec.episode_id}-{rec.calls}", "object": "chat.completion",
                "created": int(time.time()), "model": self.config.model, "choices": [choice],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}}

    def _logprobs(self, ids: tuple[int, ...], logprobs: tuple[float, ...]) -> list[dict[str, Any]]:
        return stream.token_logprobs([self.chat.decode([i], skip_special=False) for i in ids], logprobs)

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.config.model, "object": "model", "created": 0,
                                            "owned_by": "kubeforge"}]}

    def refuse(self, code: str) -> None:
        with self._lock:
            self.refused[code] += 1
        self.metrics.endpoint_refusals.labels(reason=code).inc()

    def count(self, outcome: str) -> None:
        """One HTTP request's outcome: answered, refused or disconnected (``endpoint_requests_total``)."""
        self.metrics.endpoint_requests.labels(outcome=outcome).inc()


class _Server(http.server.ThreadingHTTPServer):
    # a batch's agents connect at once (hundreds of rollouts): socketserver's default listen backlog is 5
    request_queue_size = 1024
    daemon_threads = True


class _Whole:
    """``stream.Reply`` of an in-process call: keeps the one JSON body."""

    payload: dict[str, Any] = {}

    def send(self, status: int, payload: dict[str, Any]) -> None:
        self.payload = payload

    def open_stream(self) -> bool:
        raise AssertionError("an in-process call is answered whole")

    def event(self, payload: dict[str, Any]) -> bool:
        raise AssertionError("an in-process call is answered whole")

    def end_stream(self) -> None:
        raise AssertionError("an in-process call is answered whole")


def _sampler_refusal(exc: Exception) -> Refusal:
    """The sampler's failure as the caller's error, counted by its code."""
    if isinstance(exc, Refusal):
        return exc
    if isinstance(exc, sampler.SamplerBusy):
        return Refusal(503, "sampler_busy", str(exc))
    if isinstance(exc, sampler.SamplerTimeout):
        return Refusal(504, "sampler_timeout", str(exc))
    return Refusal(500, "sampler_error", f"{type(exc).__name__}: {exc}")


def _cut_at_stop(text: str, stops: tuple[str, ...], sample: sampler.Sample) -> str:
    """OpenAI's content ends before a stop string (the sampled ids keep it: they are what vLLM sampled)."""
    if sample.finish_reason != "stop" or not stops:
        return text
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[:min(cuts)] if cuts else text


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value == value:
        raise Refusal(400, "invalid_request", f"{name}: a number", param=name)
    return float(value)


def _claimed(endpoint: Endpoint, claim: Any) -> dict[str, Any]:
    """A claim's answer: the episode's path, its own credential, the served model, the task and its time."""
    if claim is None:
        return {"episode": None}
    key = endpoint.config.key
    assert key is not None
    return {"episode": claim.episode_id, "path": f"/episodes/{claim.episode_id}/v1",
            "api_key": episode_key(key, claim.episode_id), "model": endpoint.config.model, "task": claim.task,
            "seconds": claim.seconds}


def _handler(endpoint: Endpoint) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = endpoint.config.read_timeout
        # headers and body leave in two writes: with Nagle on, a kept-alive connection waits for the client's
        # delayed ACK (~40 ms a call; bench/probes/endpoint_overhead.py)
        disable_nagle_algorithm = True
        _streaming = False    # a stream's 200 left: errors go out as its last event
        _dead = False         # the client left a stream: nothing more is written

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._serve(post=False)

        def do_POST(self) -> None:  # noqa: N802
            self._serve(post=True)

        def do_PUT(self) -> None:  # noqa: N802
            self._fail(Refusal(405, "method_not_allowed", "GET /v1/models or POST /v1/chat/completions"))
            endpoint.count(REFUSED)

        do_DELETE = do_PATCH = do_PUT

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: counters tell
            return

        def _serve(self, *, post: bool) -> None:
            with endpoint._lock:
                endpoint.requests += 1
            self._streaming = self._dead = False
            try:
                outcome = self._route(post=post)
            except Refusal as refusal:
                self._fail(refusal)
                outcome = REFUSED
            endpoint.count(outcome)

        def _route(self, *, post: bool) -> str:
            path = self.path.split("?", 1)[0]
            agent = AGENT_ROUTE.match(path) if endpoint.handout is not None else None
            if agent is not None:
                if not post:
                    raise Refusal(405, "method_not_allowed", "POST")
                return self._agents(agent)
            match = ROUTE.match(path)
            if match is None:
                raise Refusal(404, "not_found", f"no route {self.path!r}")
            self._authenticate(match["episode"])
            if match["op"] == "models":
                if post:
                    raise Refusal(405, "method_not_allowed", "GET /v1/models")
                self.send(200, endpoint.models())
                return ANSWERED
            if not post:
                raise Refusal(405, "method_not_allowed", "POST /v1/chat/completions")
            body = self._body()
            if not endpoint._in_flight.acquire(blocking=False):
                raise Refusal(503, "overloaded", f"{endpoint.config.max_in_flight} calls in flight already")
            try:
                return endpoint.serve(match["episode"], body, self)
            finally:
                endpoint._in_flight.release()

        def _authenticate(self, episode_id: str | None) -> None:
            key = endpoint.config.key
            if key is None:
                return
            given = self.headers.get("Authorization", "").encode()
            if hmac.compare_digest(given, f"Bearer {api_key(key)}".encode()):
                return
            if episode_id is not None and hmac.compare_digest(given, f"Bearer {episode_key(key, episode_id)}".encode()):
                return
            token = given.decode(errors="replace").removeprefix("Bearer ")
            with endpoint._lock:
                other = endpoint._tokens.get(token)
            if other is not None:
                raise Refusal(403, "wrong_episode", "this credential belongs to another episode")
            raise Refusal(401, "unauthorized", "missing or wrong bearer token (the job's endpoint key, or the "
                                               "episode's own)")

        def _agents(self, match: re.Match[str]) -> str:
            """An agent pod's claim, heartbeat or end (the module docstring's routes)."""
            handout, cfg = endpoint.handout, endpoint.config
            assert handout is not None and cfg.agent_key is not None and cfg.key is not None
            given = self.headers.get("Authorization", "").encode()
            episode_id = match["episode"]
            want = cfg.agent_key.hex() if episode_id is None else episode_key(cfg.key, episode_id)
            if not hmac.compare_digest(given, f"Bearer {want}".encode()):
                if episode_id is not None:       # the claim route's wrong keys are plain 401s
                    self._authenticate(episode_id)    # 403 wrong_episode when it is another episode's
                raise Refusal(401, "unauthorized", "missing or wrong bearer token (the agent key, or the "
                                                   "episode's own)")
            body = self._body()
            if not isinstance(body, dict):
                raise Refusal(400, "invalid_request", "the body must be a JSON object")
            if episode_id is None:
                self.send(200, _claimed(endpoint, handout.claim(wait=_number(body, "wait", 0.0))))
            elif match["op"] == "heartbeat":
                self.send(200, {"open": handout.beat(episode_id)})
            else:
                code = body.get("exit_code")
                if not isinstance(code, int) or isinstance(code, bool):
                    raise Refusal(400, "invalid_request", "exit_code: an integer", param="exit_code")
                self.send(200, {"open": handout.done(episode_id, exit_code=code,
                                                     timed_out=body.get("timed_out") is True)})
            return ANSWERED

        def _body(self) -> Any:
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self.close_connection = True
                raise Refusal(411, "length_required", "a Content-Length is required (no chunked bodies)")
            if int(length) > endpoint.config.max_body_bytes:
                self.close_connection = True     # the body is never read
                raise Refusal(413, "body_too_large", f"{length} bytes: at most {endpoint.config.max_body_bytes}")
            try:
                raw = self.rfile.read(int(length))
            except TimeoutError:
                self.close_connection = True
                raise Refusal(408, "read_timeout", "the body did not arrive in time") from None
            try:
                return json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise Refusal(400, "bad_json", f"the body is not JSON: {exc}") from None

        def _fail(self, refusal: Refusal) -> None:
            endpoint.refuse(refusal.code)
            kind = "invalid_request_error" if refusal.status < 500 else "server_error"
            error = {"error": {"message": refusal.message, "type": kind, "code": refusal.code,
                               "param": refusal.param}}
            if self._streaming:           # the 200 left already: the error is the stream's last event
                if self.event(error):
                    self.end_stream()
                return
            if self._dead:                # a stream whose client left: nobody to tell
                return
            self.send(refusal.status, error)

        # -- stream.Reply
        def send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def open_stream(self) -> bool:
            # chunked transfer coding: each event leaves as it is made, and the connection stays usable after
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self._streaming = True
            try:
                self.end_headers()
            except OSError:
                return self._gone()
            return True

        def event(self, payload: dict[str, Any]) -> bool:
            return self._chunk(stream.event(payload))

        def end_stream(self) -> None:
            if self._chunk(stream.DONE):
                self._chunk(b"")
            self._streaming = False

        def _chunk(self, data: bytes) -> bool:
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError:               # BrokenPipe, ConnectionReset, a send timeout: the client is gone
                return self._gone()
            return True

        def _gone(self) -> bool:
            self.close_connection = self._dead = True
            self._streaming = False
            return False

    return Handler
