"""An OpenEnv server as an environment, over its HTTP protocol only (no import of openenv-core, which does not
resolve beside the stack: ../shared/notes/agents.md).

Neighbours: the episode runner (``agents.runner``, docs/agents.md) drives an environment through ``reset(prompt)``
and ``step(assistant_text)``; this class speaks OpenEnv's routes for it:

    POST /reset  {}                  -> {"observation": {...}, "reward": float | null, "done": bool}
    GET  /schema                     -> {"action": <JSON schema>, "observation": ..., "state": ...}
    POST /step   {"action": {...}}   -> like /reset; 422 when the action does not fit the schema

The policy sees each observation as one user message: JSON ``{"observation": ..., "action_schema": ...}``. Its reply
is the action: a JSON object, or plain text when the action schema has exactly one required field (the text
becomes that field). A reply that is no action, or that the server refuses (422), is a tool error the policy sees
as feedback; the episode goes on. The reward is the sum of the steps' rewards, reported when the server says done.

Invariants: every request is bounded in time (``timeout``) and in response size (``max_bytes``: an observation past
it fails the episode with ``env_flood``); a server that errors, hangs or answers garbage raises
:class:`OpenEnvError` with the finish reason (``env_error``, ``env_timeout``, ``env_garbage``, ``env_flood``): the
runner ends that episode only. One instance per episode (an OpenEnv HTTP server holds one session: give each
concurrent episode its own server URL).
"""
from __future__ import annotations

import dataclasses
import json
import socket
import urllib.error
import urllib.request
from typing import Any

DEFAULT_TIMEOUT = 30.0
DEFAULT_MAX_BYTES = 1 << 20


class OpenEnvError(RuntimeError):
    """The server failed the episode; ``reason`` is the episode's finish reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One environment step (the fields of the protocol's ``StepResult``, docs/agents.md)."""

    observation: list[dict[str, Any]]
    done: bool
    reward: float | None = None
    tool_calls: int = 0
    tool_errors: int = 0


class OpenEnvHttp:
    """One episode against an OpenEnv HTTP server."""

    def __init__(self, base_url: str, *, timeout: float = DEFAULT_TIMEOUT, max_bytes: int = DEFAULT_MAX_BYTES,
                 reset_args: dict[str, Any] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout, self.max_bytes = timeout, max_bytes
        self.reset_args = dict(reset_args or {})
        self.schema: dict[str, Any] = {}
        self.total = 0.0

    def reset(self, prompt: Any = None) -> list[dict[str, Any]]:
        schema = self._call("GET", "/schema", None)
        action = schema.get("action") if isinstance(schema, dict) else None
        if not isinstance(action, dict):
            raise OpenEnvError("env_garbage", "/schema has no action schema")
        self.schema, self.total = action, 0.0
        return self._messages(self._result(self._call("POST", "/reset", self.reset_args)))

    def step(self, assistant_text: str) -> Step:
        try:
            action = parse_action(assistant_text, self.schema)
        except ValueError as exc:
            return Step(observation=[_user(f"not an action: {exc}")], done=False, tool_calls=1, tool_errors=1)
        try:
            result = self._result(self._call("POST", "/step", {"action": action}))
        except _Refused as exc:
            return Step(observation=[_user(f"the environment refused the action: {exc}")], done=False,
                        tool_calls=1, tool_errors=1)
        self.total += float(result["reward"] or 0.0)
        done = bool(result["done"])
        return Step(observation=self._messages(result), done=done, reward=self.total if done else None, tool_calls=1)

    # ------------------------------------------------------------ HTTP

    def _messages(self, result: dict[str, Any]) -> list[dict[str, Any]]:
        return [_user(json.dumps({"observation": result["observation"], "action_schema": self.schema}))]

    def _result(self, raw: Any) -> dict[str, Any]:
        if not isinstance(raw, dict) or "observation" not in raw or not isinstance(raw.get("done", False), bool):
            raise OpenEnvError("env_garbage", "not an OpenEnv observation (observation, reward, done)")
        reward = raw.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise OpenEnvError("env_garbage", f"reward {reward!r} is not a number")
        return {"observation": raw["observation"], "reward": reward, "done": bool(raw.get("done", False))}

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - our configured URL
                raw = resp.read(self.max_bytes + 1)
        except urllib.error.HTTPError as exc:
            if exc.code == 422:
                raise _Refused(exc.read(4096).decode(errors="replace")) from None
            raise OpenEnvError("env_error", f"{method} {path}: HTTP {exc.code}") from None
        except (TimeoutError, socket.timeout):
            raise OpenEnvError("env_timeout", f"{method} {path}: no answer in {self.timeout:g} s") from None
        except (urllib.error.URLError, ConnectionError) as exc:
            raise OpenEnvError("env_error", f"{method} {path}: {exc}") from None
        if len(raw) > self.max_bytes:
            raise OpenEnvError("env_flood", f"{method} {path}: answer over {self.max_bytes} bytes")
        try:
            return json.loads(raw)
        except ValueError:
            raise OpenEnvError("env_garbage", f"{method} {path}: not JSON") from None


class _Refused(Exception):
    """The server refused the action (HTTP 422): feedback for the policy, not a failed episode."""


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def parse_action(text: str, schema: dict[str, Any]) -> dict[str, Any]:
    """The policy's reply as an action: a JSON object, else the text as the one required field."""
    stripped = text.strip()
    try:
        value = json.loads(stripped)
    except ValueError:
        value = stripped
    if isinstance(value, dict):
        return value
    required = schema.get("required") or []
    if len(required) != 1:
        raise ValueError("reply with a JSON object matching action_schema")
    if not stripped:
        raise ValueError("an empty reply")
    return {str(required[0]): value}
