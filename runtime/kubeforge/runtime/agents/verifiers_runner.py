"""Runs episodes of a ``verifiers`` (0.4.x) environment against the endpoint: the process on the library's side.

Neighbours: ``verifiers_env`` (our side) starts this module with the environments' interpreter (its own venv: the
library needs openai < 3, our stack pins openai 3; docs/agents-endpoint.md, "Verifiers"), hands it jobs on stdin and
reads results on stdout. It imports only the standard library and ``verifiers``: never kubeforge's other modules.

Protocol (JSON lines, bounded): stdin carries one JSON object ``{"environment": id, "model": name, "jobs":
[{"base_url": url, "task": index}, ...], "api_key_var": NAME, "args": {...}}`` (``args``: the taskset's config
fields, validated by the library's own config class); stdout gets one line per job, in job order:
``{"task": index, "reward": float | null, "rewards": {name: value}, "ok": bool, "error": str | null}``.
The library runs its own rollout loop (its Env, Taskset, Harness and interception server) with an OpenAI-compatible
client config whose ``base_url`` is the job's episode URL: every model call lands in that episode's record.
"""
from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

MAX_INPUT = 1 << 20


async def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    import verifiers.v1 as vf
    from verifiers.v1.utils import loaders

    taskset = loaders.taskset_config_type(spec["environment"]).model_validate(
        {**dict(spec.get("args") or {}), "id": spec["environment"]})      # the library refuses unknown args
    config = vf.SingleAgentEnvConfig(taskset=taskset,
                                     agent=vf.AgentConfig(runtime=vf.SubprocessConfig()))  # local: no tunnel
    env = loaders.load_environment(config)
    tasks = list(env.taskset)
    out: list[dict[str, Any]] = []
    async with env.serving():
        slots = []
        for job in spec["jobs"]:
            client = vf.EvalClientConfig(base_url=job["base_url"],
                                         api_key_var=spec.get("api_key_var", "OPENAI_API_KEY"))
            ctx = vf.ModelContext(model=spec["model"], client=client)
            slots.append(env.run_slot(env.slots(tasks[int(job["task"]) % len(tasks)])[0], ctx))
        episodes = await asyncio.gather(*slots, return_exceptions=True)
    for job, ep in zip(spec["jobs"], episodes):
        out.append(_result(job, ep))
    return out


def _result(job: dict[str, Any], ep: Any) -> dict[str, Any]:
    if isinstance(ep, BaseException):
        return {"task": job["task"], "reward": None, "rewards": {}, "ok": False,
                "error": f"{type(ep).__name__}: {ep}"}
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
    return {"task": job["task"], "reward": reward, "rewards": rewards, "ok": bool(ep.ok),
            "error": "; ".join(errors) or None}


def main() -> int:
    raw = sys.stdin.read(MAX_INPUT + 1)
    if len(raw) > MAX_INPUT:
        print(json.dumps({"error": f"input over {MAX_INPUT} bytes"}), flush=True)
        return 2
    spec = json.loads(raw)
    for line in asyncio.run(run(spec)):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
