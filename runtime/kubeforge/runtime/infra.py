"""Infrastructure faults are not the policy's fault: which rollout groups are kept out of training because a pod
they depended on was lost, not because of anything the policy did (issue 39 item 3; docs/agents.md, docs/failures.md).

```
 generator: an episode's environment server dies, goes silent past its bound, or restarted and forgot the
            episode (agents.hosts.remote_host / env_server) ─▶ the episode ends ``env_lost``; its agent pod
            (spec.agent) stops its heartbeats or never claims it (agents.pods.dispatch) ─▶ ``agent_lost``; its
            group goes on as any group (each completion's finish reason travels on the wire)
 verifier:  reason(group) set ─▶ not scored (unscored: placeholder rewards, nothing observed)
 trainer:   buffer.add ─▶ dropped with the reason, counted apart (kubeforge_infra_masked_rollouts_total{reason},
            the step record's infra_masked_rollouts), its prompt re-issued by the buffer's usual rule
```

Why the whole group: GRPO's advantages are relative to the group's other episodes; one episode scored 0 for a lost
pod moves every advantage of its group. The group is sampled again (re-issued), so its step still trains on a whole
group for that prompt. The environment's own failures (``env_error``, ``env_timeout``, ``env_garbage``,
``env_flood``) are the policy's business (what it wrote made the environment fail, hang or flood): they are not in
:data:`ENDS`, stay scored (0 under ``reward: Environment``) and trained on, and are counted in
``kubeforge_env_failures_total`` as before.

Pure: no I/O. Neighbours: ``agents.hosts.host`` names ``env_lost`` from here; ``verifier.loop`` and
``trainer.buffer`` call :func:`reason`; ``observe`` counts the buffer's drops of these reasons apart.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kubeforge.runtime import types

ENV_LOST = "env_lost"     # the episode's environment server went away, silent, or forgot the episode
AGENT_LOST = "agent_lost"  # the episode's agent pod died or went silent, or no agent pod claimed it in time
ENDS = (ENV_LOST, AGENT_LOST)   # finish reasons that name an infrastructure loss (also the counter's reasons)


def finish_reasons(completions: Sequence[types.Completion]) -> list[str]:
    """The completions' finish reasons, without making ``Completion`` objects of a decoded group."""
    if isinstance(completions, types.CompletionColumns):
        return completions.finish_reasons
    return [c.finish_reason for c in completions]


def reason(group: types.RolloutGroup) -> str | None:
    """The infrastructure loss that keeps ``group`` out of training (the first such finish reason), or None."""
    return next((r for r in finish_reasons(group.completions) if r in ENDS), None)


def unscored(group: types.RolloutGroup) -> types.RolloutGroup:
    """``group`` as the verifier passes on a group it does not score: rewards 0.0 as placeholders (a SCORED frame
    needs finite rewards) and no verifier scores. Nothing reads them: the trainer drops the group by :func:`reason`
    before anything else."""
    return dataclasses.replace(group, rewards=[0.0] * len(group.completions), scores={})
