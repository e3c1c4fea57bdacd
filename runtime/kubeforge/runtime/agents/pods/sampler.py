"""The generator's sampler for ``environment.type: Agent``: the user's agent program, in the agent pods, drives each
episode through this generator's endpoint; the endpoint's recordings become the groups.

```
 WORK(prompts) ─▶ primeintellect.sampler.VerifiersSampler.sample (the same groups, spans and figures)
      └─ AgentPods.run_group: groupSize episodes per prompt ─ open_episode ─ dispatch.offer({prompt, index})
             agent pod ─ POST /agents/claim ─▶ its program ─ model calls ─▶ endpoint (pod IP) ─▶ VllmSampler
      ◀─ dispatch.wait: per episode stop | env_error | env_timeout | agent_lost ─ close_episode ─▶ Recording
```

Reward: the agent reports none (``reward: Verifiers``): the verifier role scores the recorded final reply, as for
any episode. An ``agent_lost`` episode (its pod died, or none claimed it) keeps its group out of training
(``runtime/infra.py``); the others keep the tokens they sampled.

Neighbours: ``generator.start`` builds it (:func:`from_engine`); ``dispatch`` holds the hand-out; the endpoint
(``agents.endpoint.server``) serves the agent pods' routes and their model calls.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from kubeforge.api import contract
from kubeforge.runtime import config, metrics as kf_metrics, types
from kubeforge.runtime.agents import endpoint, runner
from kubeforge.runtime.agents.pods import dispatch
from kubeforge.runtime.agents.primeintellect import adapter, sampler as vf_sampler


class AgentPods:
    """``primeintellect.sampler.GroupRunner`` over the agent pods: one offered episode per task."""

    def __init__(self, handout: dispatch.Dispatch) -> None:
        self.handout = handout

    def run_group(self, ep: endpoint.server.Endpoint, tasks: Sequence[Any]) -> list[adapter.Outcome]:
        episodes = [ep.open_episode() for _ in tasks]
        try:
            for e, t in zip(episodes, tasks):
                self.handout.offer(e, dict(t))
            ends = self.handout.wait(episodes)
        finally:
            recordings = [ep.close_episode(e) for e in episodes]
        return [_outcome(t, ends.get(e, dispatch.LOST), rec) for e, t, rec in zip(episodes, tasks, recordings)]


def _outcome(task: Any, reason: str, recording: endpoint.record.Recording) -> adapter.Outcome:
    ok = reason == dispatch.STOP
    return adapter.Outcome(task=int(task.get("index", 0)), reward=None, rewards={}, ok=ok,
                           error=None if ok else reason, finish_reason=reason, recording=recording)


def task(prompt: types.Prompt) -> dict[str, Any]:
    """What an agent pod gets for an episode of ``prompt``: its text (the program's stdin) and its index."""
    return {"prompt": prompt.text, "index": prompt.index}


def from_engine(engine: Any, *, cfg: config.RoleConfig, on_sampled: Callable[[runner.Stats], None] | None = None,
                metrics: kf_metrics.Metrics | None = None,
                environ: dict[str, str] | None = None) -> vf_sampler.VerifiersSampler:
    """The sampler over a ``generator.engine.Engine``: the endpoint bound to the pod's IP (``ENV_POD_IP``; the
    role's bind host when unset: loopback locally) at ``PORT_AGENTS``, with the job key and the agent key."""
    env = dict(os.environ) if environ is None else environ
    spec = cfg.spec
    assert spec.environment is not None
    if cfg.job_key is None or not env.get(contract.ENV_AGENT_KEY):
        raise RuntimeError(f"environment.type Agent needs {contract.ENV_JOB_KEY} and {contract.ENV_AGENT_KEY} on "
                           "the generator: each episode's credential derives from the job key")
    algo = spec.algorithm
    vllm = endpoint.sampler.VllmSampler(engine, policy=endpoint.sampler.Policy(
        temperature=algo.temperature, top_p=algo.top_p, top_k=algo.top_k),
        queue_size=max(endpoint.sampler.DEFAULT_QUEUE, algo.prompts_per_step * algo.group_size))
    bounds = vf_sampler.Bounds.of(spec.environment, algo)
    handout = dispatch.Dispatch(episode_seconds=bounds.rollout_seconds)
    host = env.get(contract.ENV_POD_IP) or cfg.bind_host
    ep_cfg = endpoint.server.EndpointConfig(
        host=host, port=cfg.port(contract.PORT_AGENTS), key=cfg.job_key,
        agent_key=bytes.fromhex(env[contract.ENV_AGENT_KEY]), max_tokens_per_call=bounds.max_tokens_per_call,
        max_episode_tokens=bounds.max_episode_tokens, max_calls_per_episode=bounds.max_turns,
        request_timeout=spec.environment.turn_timeout_seconds, max_in_flight=4096)
    ep = endpoint.server.Endpoint(sampler=vllm, chat=endpoint.chat.ChatTemplate(engine.tokenizer), config=ep_cfg,
                                  metrics=metrics, handout=handout)
    print(f"{cfg.name}: agents endpoint on {host}:{ep.port}", file=sys.stderr, flush=True)

    def close() -> None:
        ep.close()
        vllm.close()

    return vf_sampler.VerifiersSampler(endpoint=ep, environment=AgentPods(handout), group_size=algo.group_size,
                                       fallback_prompt=vf_sampler.fallback_prompt(engine, spec), on_sampled=on_sampled, close=close, task_of=task,
                                       label="agents")
