"""Where environment steps run: the ``EnvironmentHost`` interface, and the outcome rules both hosts share.

```
 runner ──reset/step(batch of episodes)──▶ host ──▶ InProcessHost     (unit tests: calls in this process, a
                                             │                          thread per call so a hang is bounded)
                                             ├────▶ SubprocessHost    (a pool of worker processes, workers.py,
                                             │                          worker.py; msgpack over pipes)
                                             └────▶ RemoteHost        (the roles: the verifiers' environment
                                                     remote_host.py     servers, env_server.py, each running a
                                                                        SubprocessHost; ZeroMQ, CURVE)
 ◀── one Reply per episode: messages / StepResult, or a failure (env_error | env_timeout | env_garbage | env_flood
     | env_lost)
```

A step that raises (``env_error``), overruns ``turnTimeoutSeconds`` (``env_timeout``), answers something that is
not a step result (``env_garbage``) or an observation above ``maxObservationBytes`` (``env_flood``) ends that
episode only; the runner counts it by kind and goes on. Bounded: no call waits past the timeout, no observation
past the byte bound is kept (``SubprocessHost`` never even reads it whole).
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kubeforge.runtime import infra, types
from kubeforge.runtime.agents import protocol

ERROR, TIMEOUT, GARBAGE, FLOOD = "env_error", "env_timeout", "env_garbage", "env_flood"
LOST = infra.ENV_LOST    # the environment's server went silent or away (``remote_host``): its episodes end; an
                         # infrastructure loss, not the environment's failure: their groups are not trained on (infra)
FAILURES = (ERROR, TIMEOUT, GARBAGE, FLOOD, LOST)
DETAIL_CHARS = 300


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reply:
    """The answer for one episode: ``messages`` (reset), ``result`` (step), or ``failure`` with ``detail``."""

    messages: list[dict[str, str]] = dataclasses.field(default_factory=list)
    result: protocol.StepResult | None = None
    failure: str = ""
    detail: str = ""
    seconds: float = 0.0


class EnvironmentHost(Protocol):
    def reset(self, items: Sequence[tuple[int, types.Prompt]]) -> list[Reply]:
        """Start an environment per (episode id, prompt); their first messages."""

    def step(self, items: Sequence[tuple[int, str]]) -> list[Reply]:
        """One step per (episode id, policy turn text), run side by side where the host can."""

    def close(self, ids: Sequence[int]) -> None:
        """Forget these episodes' environments."""

    def shutdown(self) -> None: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bounds:
    timeout_s: float = 10.0
    max_observation_bytes: int = 4096


def judge_messages(value: Any, *, bounds: Bounds, seconds: float, where: str) -> Reply:
    """A reset's answer (chat messages) as a ``Reply``."""
    try:
        msgs = protocol.check_messages(value, where=where)
    except protocol.Garbage as e:
        return Reply(failure=GARBAGE, detail=str(e)[:DETAIL_CHARS], seconds=seconds)
    return _flood([*msgs], bounds, seconds) or Reply(messages=msgs, seconds=seconds)


def judge_result(value: Any, *, bounds: Bounds, seconds: float) -> Reply:
    """A step's answer as a ``Reply``: checked (``protocol.check_result``) and bounded."""
    try:
        result = protocol.check_result(value)
    except protocol.Garbage as e:
        return Reply(failure=GARBAGE, detail=str(e)[:DETAIL_CHARS], seconds=seconds)
    assert isinstance(result.observation, list)
    return _flood(result.observation, bounds, seconds) or Reply(result=result, seconds=seconds)


def _flood(msgs: list[dict[str, str]], bounds: Bounds, seconds: float) -> Reply | None:
    size = sum(len(m["content"].encode("utf-8", "replace")) for m in msgs)
    if size > bounds.max_observation_bytes:
        return Reply(failure=FLOOD, detail=f"{size} bytes of observation exceed {bounds.max_observation_bytes}",
                     seconds=seconds)
    return None


class InProcessHost:
    """Environments in this process (unit tests, and any caller that trusts them). Each call runs on a daemon thread
    joined for at most the timeout: a hung environment is abandoned (its thread left to finish or not, its episode
    ended); a process-level flood or crash is not contained here: the roles use ``workers.SubprocessHost``."""

    def __init__(self, make_env: Callable[[], Any], *, bounds: Bounds) -> None:
        self.make_env, self.bounds = make_env, bounds
        self.envs: dict[int, Any] = {}

    def reset(self, items: Sequence[tuple[int, types.Prompt]]) -> list[Reply]:
        out = []
        for i, prompt in items:
            def start(i: int = i, prompt: types.Prompt = prompt) -> Any:
                self.envs[i] = self.make_env()
                return self.envs[i].reset(prompt)

            value, failure, seconds = _bounded_call(start, self.bounds.timeout_s)
            out.append(failure or judge_messages(value, bounds=self.bounds, seconds=seconds, where="reset"))
        return out

    def step(self, items: Sequence[tuple[int, str]]) -> list[Reply]:
        out = []
        for i, text in items:
            env = self.envs.get(i)
            if env is None:
                out.append(Reply(failure=ERROR, detail="no environment (it failed before)"))
                continue
            value, failure, seconds = _bounded_call(_stepper(env, text), self.bounds.timeout_s)
            reply = failure or judge_result(value, bounds=self.bounds, seconds=seconds)
            if reply.failure:
                protocol.close(self.envs.pop(i, None))    # the episode ends: later steps are refused
            out.append(reply)
        return out

    def close(self, ids: Sequence[int]) -> None:
        for i in ids:
            protocol.close(self.envs.pop(i, None))

    def shutdown(self) -> None:
        self.close(list(self.envs))


def _stepper(env: Any, text: str) -> Callable[[], Any]:
    return lambda: env.step(text)


def _bounded_call(fn: Callable[[], Any], timeout_s: float) -> tuple[Any, Reply | None, float]:
    """``fn()`` on a daemon thread, waited for at most ``timeout_s``: (value, None, seconds) or (None, failure, s)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - an environment's failure is data here
            box["error"] = f"{type(e).__name__}: {e}"

    start = time.monotonic()
    t = threading.Thread(target=run, name="env-step", daemon=True)
    t.start()
    t.join(timeout_s)
    seconds = time.monotonic() - start
    if t.is_alive():
        return None, Reply(failure=TIMEOUT, detail=f"no answer within {timeout_s:g} s", seconds=seconds), seconds
    if "error" in box:
        return None, Reply(failure=ERROR, detail=str(box["error"])[:DETAIL_CHARS], seconds=seconds), seconds
    return box.get("value"), None, seconds
