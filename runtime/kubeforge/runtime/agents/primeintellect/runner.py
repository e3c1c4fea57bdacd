"""Runs episodes of a ``verifiers`` (0.4.x) environment against the endpoint: the process on the library's side.

Neighbours: ``adapter`` (our side) starts this module with the environments' interpreter (its own venv: the
library needs openai < 3, our stack pins openai 3; docs/agents-endpoint.md, "Verifiers"), hands it jobs on stdin and
reads results on stdout. It imports only the standard library and ``verifiers``: never kubeforge's other modules.

Protocol (JSON lines, bounded): stdin carries one JSON object ``{"environment": id, "model": name, "jobs":
[{"base_url": url, "task": index}, ...], "api_key_var": NAME, "args": {...}, "rollout_timeout": seconds}``
(``args``: the taskset's config fields, validated by the library's own config class; ``rollout_timeout``: each
rollout is cancelled past it, that rollout alone); stdout gets one line per job, in job order:
``{"task": index, "reward": float | null, "rewards": {name: value}, "ok": bool, "error": str | null,
"timed_out": bool, "tool_calls": int}``. With ``"check": true`` (and no jobs) the runner only loads the environment
and prints ``{"ok": true, "tasks": N}``: the generator's start-up check (a wrong name or argument fails the job at
start, naming the field, rather than every episode later). With ``--serve`` it stays up for many batches
(:func:`serve`; ``adapter.RunnerProcess`` drives it).
The library runs its own rollout loop (its Env, Taskset, Harness and interception server) with an OpenAI-compatible
client config whose ``base_url`` is the job's episode URL: every model call lands in that episode's record.
"""
from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

MAX_INPUT = 1 << 20


def load(spec: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The library's Env for the spec's taskset, and its tasks."""
    import verifiers.v1 as vf
    from verifiers.v1.utils import loaders

    taskset = loaders.taskset_config_type(spec["environment"]).model_validate(
        {**dict(spec.get("args") or {}), "id": spec["environment"]})      # the library refuses unknown args
    config = vf.SingleAgentEnvConfig(taskset=taskset,
                                     agent=vf.AgentConfig(runtime=vf.SubprocessConfig()))  # local: no tunnel
    env = loaders.load_environment(config)
    return env, list(env.taskset)


async def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    env, tasks = load(spec)
    async with env.serving():
        return await rollouts(env, tasks, spec)


async def rollouts(env: Any, tasks: list[Any], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """One result per job of ``spec``, in job order (a rollout past ``rollout_timeout`` is cancelled alone)."""
    import verifiers.v1 as vf

    if not tasks:
        raise ValueError(f"taskset {spec['environment']!r} yields no tasks")
    limit = spec.get("rollout_timeout")
    slots = []
    for job in spec["jobs"]:
        client = vf.EvalClientConfig(base_url=job["base_url"], api_key_var=spec.get("api_key_var", "OPENAI_API_KEY"))
        ctx = vf.ModelContext(model=spec["model"], client=client)
        slot = env.run_slot(env.slots(tasks[int(job["task"]) % len(tasks)])[0], ctx)
        slots.append(asyncio.wait_for(slot, float(limit)) if limit else slot)
    episodes = await asyncio.gather(*slots, return_exceptions=True)
    return [_result(job, ep) for job, ep in zip(spec["jobs"], episodes)]


async def serve() -> int:
    """``--serve``: one process for many batches (the library imported and the environment loaded once). Each
    stdin line is a spec as above (the first one's environment and args hold for the process); each answer is its
    result lines, then ``{"end": true}``. EOF ends the process."""
    loop = asyncio.get_running_loop()
    first = await loop.run_in_executor(None, sys.stdin.readline, MAX_INPUT + 1)
    if not first:
        return 0
    spec = json.loads(first)
    env, tasks = load(spec)
    async with env.serving():
        while True:
            for line in await rollouts(env, tasks, spec):
                print(json.dumps(line), flush=True)
            print(json.dumps({"end": True}), flush=True)
            raw = await loop.run_in_executor(None, sys.stdin.readline, MAX_INPUT + 1)
            if not raw:
                return 0
            spec = json.loads(raw)


def _result(job: dict[str, Any], ep: Any) -> dict[str, Any]:
    if isinstance(ep, BaseException):
        return {"task": job["task"], "reward": None, "rewards": {}, "ok": False,
                "error": f"{type(ep).__name__}: {ep}", "timed_out": isinstance(ep, TimeoutError), "tool_calls": 0}
    traces = list(ep.traces)
    rewards: dict[str, float] = {}
    for t in traces:
        for name, value in dict(getattr(t, "rewards", {}) or {}).items():
            number: Any = getattr(value, "value", value)
            if number is not None:
                rewards[str(name)] = float(number)
    reward = float(traces[-1].reward) if traces else None
    errors = [f"{e.type}: {e.message}" for e in getattr(ep, "errors", [])]
    errors += [f"{e.type}: {e.message}" for t in traces for e in (getattr(t, "errors", None) or [])]
    tools = sum(1 for t in traces for m in (getattr(t, "messages", None) or []) if getattr(m, "role", "") == "tool")
    return {"task": job["task"], "reward": reward, "rewards": rewards, "ok": bool(ep.ok),
            "error": "; ".join(errors) or None, "timed_out": False, "tool_calls": tools}


def main() -> int:
    if sys.argv[1:] == ["--serve"]:
        return asyncio.run(serve())
    raw = sys.stdin.read(MAX_INPUT + 1)
    if len(raw) > MAX_INPUT:
        print(json.dumps({"error": f"input over {MAX_INPUT} bytes"}), flush=True)
        return 2
    spec = json.loads(raw)
    if spec.get("check"):
        _, tasks = load(spec)
        print(json.dumps({"ok": bool(tasks), "tasks": len(tasks)}), flush=True)
        return 0 if tasks else 3
    for line in asyncio.run(run(spec)):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
