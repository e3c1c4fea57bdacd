"""Role observers backed by ``metrics.Metrics``: the loops report events, these turn them into Prometheus series.

Neighbours: ``roles.generator``/``verifier``/``trainer`` call the observer Protocols they declare; ``roles.main``
builds these with the process's ``Metrics``; unit tests pass the same classes with a private registry.
"""
from __future__ import annotations

import collections
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from kubeforge.runtime import metrics as metrics_mod
from kubeforge.runtime import types, wire
from kubeforge.runtime.roles import generator as generator_role


class Base:
    def __init__(self, metrics: metrics_mod.Metrics) -> None:
        self.m = metrics
        self.unexpected_kinds: collections.Counter[str] = collections.Counter()

    def unexpected(self, *, kind: str) -> None:
        """A valid message of a kind this role does not take: counted as malformed input, skipped."""
        self.unexpected_kinds[kind] += 1
        self.m.rollouts_dropped.labels(reason="malformed").inc()


class GeneratorObserver(Base):
    def sampled(self, *, groups: Sequence[types.RolloutGroup], seconds: float) -> None:
        self.m.generate_seconds.observe(seconds)
        self.m.phase_seconds.labels(phase="generate").observe(seconds)
        n = sum(len(g.completions) for g in groups)
        self.m.completions_generated.inc(n)
        self.m.tokens_generated.inc(sum(len(c.token_ids) for g in groups for c in g.completions))
        self.m.rollouts_sent.inc(len(groups))

    def sync_failed(self, *, version: int, error: BaseException) -> None:
        print(f"generator-{self.m.replica}: weight sync v{version} failed ({error}); waiting for the next epoch",
              file=sys.stderr, flush=True)

    def skipped(self, *, work: wire.Work, version: int) -> None:
        """WORK expecting a policy this generator does not have yet (it just restarted): the trainer re-issues it."""
        self.m.rollouts_dropped.labels(reason="stale").inc(len(work.prompts))

    def synced(self, *, version: int, result: generator_role.SyncResult) -> None:
        self.m.policy_version.set(version)
        self.m.weight_sync_seconds.observe(result.seconds)
        self.m.weight_sync_bytes.inc(result.bytes)


class VerifierObserver(Base):
    def __init__(self, metrics: metrics_mod.Metrics, errors: Mapping[str, int] | None = None) -> None:
        super().__init__(metrics)
        self._errors = errors if errors is not None else {}
        self._seen: dict[str, int] = {}

    def scored(self, *, group: types.RolloutGroup, seconds: float) -> None:
        self.m.rollouts_received.inc()
        self.m.rollouts_sent.inc()
        self.m.phase_seconds.labels(phase="score").observe(seconds)
        new = {k: v - self._seen.get(k, 0) for k, v in self._errors.items()}
        self._seen = dict(self._errors)
        self.m.observe_scores(rewards=group.rewards or [], scores=group.scores, errors=new)

    def failed(self, *, error: BaseException) -> None:
        print(f"verifier: scoring failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        self.m.verifier_errors.labels(verifier="*").inc()


class TrainerObserver(Base):
    def trained(self, *, record: Mapping[str, Any]) -> None:
        m = self.m
        m.step.set(record.get("step", 0))
        m.policy_version.set(record.get("policy_version", 0))
        for key, gauge in (("loss", m.loss), ("kl", m.kl), ("clip_fraction", m.clip_fraction),
                           ("grad_norm", m.grad_norm), ("mean_reward", m.reward_mean)):
            if record.get(key) is not None:
                gauge.set(record[key])
        for phase, secs in (record.get("seconds") or {}).items():
            if phase in metrics_mod.PHASES:
                m.phase_seconds.labels(phase=phase).observe(secs)
        if record.get("weight_sync_seconds") is not None:
            m.weight_sync_seconds.observe(record["weight_sync_seconds"])
            m.weight_sync_bytes.inc(record.get("weight_sync_bytes") or 0)
        m.rollouts_received.inc(record.get("groups", 0))

    def dropped(self, *, reason: str) -> None:
        self.m.rollouts_dropped.labels(reason=reason).inc()
