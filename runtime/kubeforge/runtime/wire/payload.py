"""The msgpack payload of every kind but the rollout groups: a map out, a typed and bounded reader in.

Neighbours: ``codec`` packs what :data:`ENCODERS` makes and hands each unpacked map to :data:`DECODERS`; ``frame``
has the bounds; ``messages`` the dataclasses.

Invariants: every field is type-checked exactly (a bool is not an int, an int is not a float), every integer and
length is bounded; unknown or missing keys are errors naming the field path (``WireError``, reason ``malformed``).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from kubeforge.runtime import types
from kubeforge.runtime.wire import frame, messages


def _prompt_out(p: types.Prompt) -> dict[str, Any]:
    return {"index": p.index, "text": p.text, "answer": p.answer}


def _fields_out(msg: Any) -> dict[str, Any]:
    return {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}


ENCODERS: dict[messages.Kind, Callable[[Any], dict[str, Any]]] = {
    messages.Kind.HELLO: _fields_out,
    messages.Kind.READY: _fields_out,
    messages.Kind.ACK: lambda m: {**_fields_out(m), "of": int(m.of)},
    messages.Kind.STOP: _fields_out,
    messages.Kind.WORK: lambda m: {"step": m.step, "policy_version": m.policy_version,
                          "prompts": [_prompt_out(p) for p in m.prompts]},
    messages.Kind.SYNC: _fields_out,
    messages.Kind.ENV_CALL: lambda m: {"call": m.call, "op": m.op, "ids": list(m.ids),
                                       "prompts": [_prompt_out(p) for p in m.prompts], "texts": list(m.texts)},
    messages.Kind.ENV_ANSWER: lambda m: {"call": m.call, "busy": m.busy, "replies": [
        {**_fields_out(r), "messages": [list(x) for x in r.messages]} for r in m.replies]},
}


class Reader:
    """Typed, bounded access to one msgpack map; every error names the field path."""

    def __init__(self, obj: Any, path: str) -> None:
        if type(obj) is not dict:
            raise frame.WireError(frame.REASON_MALFORMED, f"{path}: expected a map, got {type(obj).__name__}")
        self.obj: dict[str, Any] = obj
        self.path = path
        self.seen: set[str] = set()

    def child(self, obj: Any, path: str) -> Reader:
        return Reader(obj, path)

    def _get(self, key: str) -> Any:
        if key not in self.obj:
            raise frame.WireError(frame.REASON_MALFORMED, f"{self.path}.{key}: missing")
        self.seen.add(key)
        return self.obj[key]

    def fail(self, key: str, why: str) -> frame.WireError:
        return frame.WireError(frame.REASON_MALFORMED, f"{self.path}.{key}: {why}")

    def done(self) -> None:
        extra = sorted(str(k) for k in self.obj if k not in self.seen)
        if extra:
            raise frame.WireError(frame.REASON_MALFORMED, f"{self.path}: unknown field(s) {', '.join(extra)}")

    def integer(self, key: str, lo: int = 0, hi: int = frame.MAX_INT) -> int:
        v = self._get(key)
        if type(v) is not int:
            raise self.fail(key, f"expected an integer, got {type(v).__name__}")
        if not lo <= v <= hi:
            raise self.fail(key, f"{v} out of range [{lo}, {hi}]")
        return v

    def flag(self, key: str) -> bool:
        v = self._get(key)
        if type(v) is not bool:
            raise self.fail(key, f"expected a bool, got {type(v).__name__}")
        return v

    def text(self, key: str, max_len: int = frame.MAX_TEXT_CHARS) -> str:
        v = self._get(key)
        if type(v) is not str:
            raise self.fail(key, f"expected a string, got {type(v).__name__}")
        if len(v) > max_len:
            raise self.fail(key, f"{len(v)} characters exceed {max_len}")
        return v

    def real(self, key: str, *, optional: bool = False) -> float | None:
        """A finite float (None allowed when ``optional``); an int is not a float."""
        v = self._get(key)
        if v is None and optional:
            return None
        if type(v) is not float or not math.isfinite(v):
            raise self.fail(key, f"expected a finite float, got {type(v).__name__}")
        return v

    def sub(self, key: str) -> Reader:
        return self.child(self._get(key), f"{self.path}.{key}")

    def items(self, key: str, max_len: int) -> list[Any]:
        v = self._get(key)
        if type(v) is not list:
            raise self.fail(key, f"expected a list, got {type(v).__name__}")
        if len(v) > max_len:
            raise self.fail(key, f"{len(v)} items exceed {max_len}")
        return v


def _prompt_in(r: Reader) -> types.Prompt:
    p = types.Prompt(index=r.integer("index"), text=r.text("text"), answer=r.text("answer"))
    r.done()
    return p


def _hello_in(r: Reader) -> messages.Hello:
    m = messages.Hello(role=r.text("role", frame.MAX_NAME_CHARS), index=r.integer("index"))
    r.done()
    return m


def _ready_in(r: Reader) -> messages.Ready:
    m = messages.Ready(role=r.text("role", frame.MAX_NAME_CHARS), index=r.integer("index"),
                       policy_version=r.integer("policy_version"))
    r.done()
    return m


def _ack_in(r: Reader) -> messages.Ack:
    of = r.integer("of", 0, 255)
    if of not in messages.Kind._value2member_map_:
        raise r.fail("of", f"unknown kind {of}")
    m = messages.Ack(role=r.text("role", frame.MAX_NAME_CHARS), index=r.integer("index"), of=messages.Kind(of),
                     version=r.integer("version"), ok=r.flag("ok"), detail=r.text("detail"))
    r.done()
    return m


def _stop_in(r: Reader) -> messages.Stop:
    m = messages.Stop(reason=r.text("reason"))
    r.done()
    return m


def _work_in(r: Reader) -> messages.Work:
    raw = r.items("prompts", frame.MAX_PROMPTS)
    prompts = tuple(_prompt_in(r.child(p, f"{r.path}.prompts[{i}]")) for i, p in enumerate(raw))
    m = messages.Work(step=r.integer("step"), policy_version=r.integer("policy_version"), prompts=prompts)
    r.done()
    return m


def _sync_in(r: Reader) -> messages.Sync:
    backend = r.text("backend", 16)
    if backend not in ("gloo", "nccl"):
        raise r.fail("backend", f"{backend!r} is not gloo or nccl")
    m = messages.Sync(version=r.integer("version"), step=r.integer("step"),
                      host=r.text("host", frame.MAX_NAME_CHARS), port=r.integer("port", 1, frame.MAX_PORT),
                      world_size=r.integer("world_size", 1, 1 << 20), backend=backend,
                      timeout_s=r.integer("timeout_s", 1, 86400), epoch=r.integer("epoch"),
                      trainer_epoch=r.integer("trainer_epoch"), rank_base=r.integer("rank_base", 0, 1 << 20))
    r.done()
    return m


MAX_ENV_MESSAGES = 256      # chat messages in one environment reply (a reset's start or a step's observation)
MAX_TOOL_COUNT = 1000       # agents.protocol's bound on a step's tool calls and errors


def _env_call_in(r: Reader) -> messages.EnvCall:
    op = r.text("op", 16)
    if op not in messages.ENV_OPS:
        raise r.fail("op", f"{op!r} is not one of {', '.join(messages.ENV_OPS)}")
    ids = tuple(_id_at(r, i, v) for i, v in enumerate(r.items("ids", frame.MAX_PROMPTS)))
    raw = r.items("prompts", frame.MAX_PROMPTS)
    prompts = tuple(_prompt_in(r.child(p, f"{r.path}.prompts[{i}]")) for i, p in enumerate(raw))
    texts = tuple(r.child({"t": t}, f"{r.path}.texts[{i}]").text("t") for i, t in enumerate(r.items(
        "texts", frame.MAX_PROMPTS)))
    want = {"reset": (len(ids), 0), "step": (0, len(ids)), "close": (0, 0)}[op]
    if (len(prompts), len(texts)) != want:
        raise r.fail("ids", f"{op}: {len(ids)} ids with {len(prompts)} prompts and {len(texts)} texts")
    m = messages.EnvCall(call=r.integer("call"), op=op, ids=ids, prompts=prompts, texts=texts)
    r.done()
    return m


def _id_at(r: Reader, i: int, v: object) -> int:
    if type(v) is not int or not 0 <= v <= frame.MAX_INT:
        raise r.fail(f"ids[{i}]", "expected a non-negative integer")
    return v


def _env_reply_in(r: Reader) -> messages.EnvReply:
    msgs = []
    for i, m in enumerate(r.items("messages", MAX_ENV_MESSAGES)):
        if type(m) is not list or len(m) != 2:
            raise r.fail(f"messages[{i}]", "expected [role, content]")
        pair = r.child({"role": m[0], "content": m[1]}, f"{r.path}.messages[{i}]")
        msgs.append((pair.text("role", frame.MAX_NAME_CHARS), pair.text("content")))
    seconds = r.real("seconds")
    assert seconds is not None
    if seconds < 0:
        raise r.fail("seconds", "negative")
    m = messages.EnvReply(messages=tuple(msgs), stepped=r.flag("stepped"), done=r.flag("done"),
                          reward=r.real("reward", optional=True), tool_calls=r.integer("tool_calls", 0, MAX_TOOL_COUNT),
                          tool_errors=r.integer("tool_errors", 0, MAX_TOOL_COUNT),
                          failure=r.text("failure", frame.MAX_NAME_CHARS), detail=r.text("detail"), seconds=seconds)
    r.done()
    return m


def _env_answer_in(r: Reader) -> messages.EnvAnswer:
    raw = r.items("replies", frame.MAX_PROMPTS)
    replies = tuple(_env_reply_in(r.child(x, f"{r.path}.replies[{i}]")) for i, x in enumerate(raw))
    m = messages.EnvAnswer(call=r.integer("call"), busy=r.flag("busy"), replies=replies)
    if m.busy and m.replies:
        raise r.fail("busy", "a busy answer carries no replies")
    r.done()
    return m


DECODERS: dict[messages.Kind, Callable[[Reader], messages.Message]] = {
    messages.Kind.HELLO: _hello_in,
    messages.Kind.READY: _ready_in,
    messages.Kind.ACK: _ack_in,
    messages.Kind.STOP: _stop_in,
    messages.Kind.WORK: _work_in,
    messages.Kind.SYNC: _sync_in,
    messages.Kind.ENV_CALL: _env_call_in,
    messages.Kind.ENV_ANSWER: _env_answer_in,
}
