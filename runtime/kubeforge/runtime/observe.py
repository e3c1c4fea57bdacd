"""Role observers backed by ``metrics.Metrics``: the loops report events, these turn them into Prometheus series.

Neighbours: the role loops (``generator.loop``, ``verifier.loop``, ``trainer.loop``) call the observer Protocols they
declare; each role's ``start`` builds these with the process's ``Metrics``; unit tests pass the same classes with a
private registry.
"""
from __future__ import annotations

import collections
import json
import math
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kubeforge.api import progress
from kubeforge.runtime import metrics as metrics_mod
from kubeforge.runtime import infra, types, wire


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

    def synced(self, *, version: int, result: types.SyncResult) -> None:
        self.m.policy_version.set(version)
        self.m.weight_sync_seconds.observe(result.seconds)
        self.m.weight_sync_bytes.inc(result.bytes)


def episodes(m: metrics_mod.Metrics, stats: Any) -> None:
    """An episode batch's figures (``agents.runner.Stats``) into the generator's metrics."""
    for st in stats.episodes:
        m.episode_turns.observe(st.turns)
        m.tool_calls.inc(st.tool_calls)
        m.tool_errors.inc(st.tool_errors)
    for seconds in stats.step_seconds:
        m.env_step_seconds.observe(seconds)
    m.env_masked_tokens.inc(stats.masked_tokens)
    for kind, n in stats.failures.items():
        m.env_failures.labels(kind=kind).inc(n)


class ScorerState(Protocol):
    """What the verifier observer reads from ``verifiers.Scorer`` (counters and the aggregation's state)."""

    @property
    def fallbacks(self) -> Mapping[str, int]: ...
    @property
    def cache_hits(self) -> int: ...
    @property
    def cache_misses(self) -> int: ...
    def state(self) -> Mapping[str, Mapping[str, float | None]]: ...


class VerifierObserver(Base):
    """Per scored group: reward and per-verifier score histograms, error/fallback/cache counters, the
    aggregation's per-verifier accuracy and weight gauges; with ``log_path`` also one JSON line per group (the
    run's verifier metrics: step, prompt, per-verifier mean scores, rewards, fallbacks, accuracies, weights)."""

    def __init__(self, metrics: metrics_mod.Metrics, errors: Mapping[str, int] | None = None, *,
                 scorer: ScorerState | None = None, log_path: pathlib.Path | None = None) -> None:
        super().__init__(metrics)
        self._errors = errors if errors is not None else {}
        self._seen: dict[str, int] = {}
        self._scorer = scorer
        self._fallbacks_seen: dict[str, int] = {}
        self._cache_seen = (0, 0)
        self._log = log_path.open("a", encoding="utf-8") if log_path is not None else None

    def scored(self, *, group: types.RolloutGroup, seconds: float) -> None:
        self.m.rollouts_received.inc()
        self.m.rollouts_sent.inc()
        self.m.phase_seconds.labels(phase="score").observe(seconds)
        new = {k: v - self._seen.get(k, 0) for k, v in self._errors.items()}
        self._seen = dict(self._errors)
        self.m.observe_scores(rewards=group.rewards or [], scores=group.scores, errors=new)
        if self._scorer is not None:
            self._scorer_metrics(group, seconds)

    def _scorer_metrics(self, group: types.RolloutGroup, seconds: float) -> None:
        sc = self._scorer
        assert sc is not None
        fb = {k: v - self._fallbacks_seen.get(k, 0) for k, v in sc.fallbacks.items()}
        self._fallbacks_seen = dict(sc.fallbacks)
        for name, n in fb.items():
            if n:
                self.m.verifier_fallbacks.labels(verifier=name).inc(n)
        hits, misses = sc.cache_hits, sc.cache_misses
        self.m.verifier_cache.labels(result="hit").inc(hits - self._cache_seen[0])
        self.m.verifier_cache.labels(result="miss").inc(misses - self._cache_seen[1])
        self._cache_seen = (hits, misses)
        state = sc.state()
        for name, acc in state.get("accuracy", {}).items():
            self.m.verifier_accuracy.labels(verifier=name).set(math.nan if acc is None else acc)
        for name, w in state.get("weight", {}).items():
            self.m.verifier_weight.labels(verifier=name).set(math.nan if w is None else w)
        if self._log is not None:
            rec = {"step": group.step, "prompt": group.prompt.index, "policy_version": group.policy_version,
                   "seconds": round(seconds, 6), "rewards": group.rewards,
                   "mean_scores": {k: (sum(v) / len(v) if v else None) for k, v in group.scores.items()},
                   "fallbacks": {k: v for k, v in fb.items() if v},
                   "accuracy": dict(state.get("accuracy", {})), "weight": dict(state.get("weight", {}))}
            self._log.write(json.dumps(rec) + "\n")
            self._log.flush()

    def failed(self, *, error: BaseException) -> None:
        print(f"verifier: scoring failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        self.m.verifier_errors.labels(verifier="*").inc()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class TrainerObserver(Base):
    def trained(self, *, record: progress.StepRecord) -> None:
        m = self.m
        m.step.set(record.step)
        m.policy_version.set(record.policy_version)
        for value, gauge in ((record.loss, m.loss), (record.kl, m.kl), (record.clip_fraction, m.clip_fraction),
                             (record.grad_norm, m.grad_norm), (record.mean_reward, m.reward_mean),
                             (record.logprob_mismatch_kl, m.logprob_mismatch_kl),
                             (record.logprob_mismatch_max_ratio, m.logprob_mismatch_max_ratio),
                             (record.mismatch_masked_fraction, m.mismatch_masked_fraction), (record.mfu, m.mfu),
                             (record.flops_per_second, m.flops_per_second),
                             (record.peak_flops_per_second, m.peak_flops_per_second)):
            if value is not None:
                gauge.set(value)
        for phase, secs in record.seconds.items():
            if phase in metrics_mod.PHASES:
                m.phase_seconds.labels(phase=phase).observe(secs)
        if record.weight_sync_seconds is not None:
            m.weight_sync_seconds.observe(record.weight_sync_seconds)
            m.weight_sync_bytes.inc(record.weight_sync_bytes or 0)
        m.rollouts_received.inc(record.groups)

    def dropped(self, *, reason: str) -> None:
        """A group the buffer dropped; one lost to infrastructure is counted apart (``infra``)."""
        family = self.m.infra_masked_rollouts if reason in infra.ENDS else self.m.rollouts_dropped
        family.labels(reason=reason).inc()
