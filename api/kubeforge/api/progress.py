"""Progress in two typed shapes, one home: what the trainer records per step and what it reports to the cluster.

```
 trainer rank 0 ── StepRecord ──▶ metrics.jsonl (local)   ──▶ launcher: progress bar, summary, plot
               │               ─▶ Prometheus observer (gauges, histograms)
               └─ ProgressReport ─▶ pod annotation kubeforge.dev/progress ──▶ operator ──▶ status.progress
```

- :class:`StepRecord` is one optimizer step: the learner's figures (:class:`StepMetrics`: loss, reward, phase
  seconds, ...), the loop's (wait, weight sync, drops), evaluation and export-on-request. Its JSON is one line of ``metrics.jsonl`` with
  snake_case keys; the evaluation and export fields only when the step has them, every other field always.
- :class:`ProgressReport` is ``status.progress`` (:class:`kubeforge.api.rljob.Progress`) plus ``done``: the
  annotation's JSON in the API's camelCase, absent fields left out.

Invariants:
- A field of :class:`~kubeforge.api.rljob.Progress` that :class:`StepRecord` also has (same snake_case name) flows
  from the step to the annotation to the status with no further code: adding a progress field touches this module
  (the record) and ``rljob.Progress`` (the status), besides the code that computes its value.
- Decoding never raises: a torn or malformed line or annotation is "unknown" (``None``), because a killed writer
  or another version of kubeforge may have written it; unknown keys are ignored (a newer trainer may add some).
"""
from __future__ import annotations

import json
from typing import Any

import pydantic
from pydantic import Field

from kubeforge.api import rljob


#: StepRecord fields a line carries only when the step has them (evaluated, exported).
SPARSE = ("eval_accuracy", "eval_accuracy_base", "eval_seconds", "evaluated", "export", "export_request",
          "weights_at")


class StepMetrics(pydantic.BaseModel):
    """The train step's figures, global over every trainer rank: what the learner's step returns (``learner.base``),
    and the first part of every :class:`StepRecord` (its fields, in this order, are the record's first)."""

    model_config = pydantic.ConfigDict(extra="ignore", frozen=True)

    step: int = Field(description="Optimizer steps done after this one (1 after the first).")
    policy_version: int = Field(0, description="Version of the weights after this step.")
    loss: float | None = None
    kl: float | None = Field(None, description="Mean k3 KL per token (0 without a reference model).")
    clip_fraction: float | None = None
    ratio_mean: float | None = None
    entropy: float | None = Field(None, description="Mean next-token entropy (nats) over completion tokens.")
    grad_norm: float | None = Field(None, description="Before clipping.")
    mean_reward: float | None = None
    groups: int = 0
    completions: int = 0
    tokens: int = Field(0, description="Completion tokens trained on, all ranks (prompt tokens excluded).")
    zero_signal_groups: int = Field(0, description="Groups whose rewards were all equal (no gradient from them).")
    seconds: dict[str, float] = Field(default_factory=dict, description="Per train-step phase.")
    learning_rate: float = 0.0
    resampled_groups: int = Field(0, description="Dynamic sampling: groups whose rewards were all equal, dropped "
                                  "and replaced by a new prompt's group.")
    unfilled_groups: int = Field(0, description="Dynamic sampling: prompt slots still without signal after "
                                 "maxRounds refills (kept out of the loss when the rank has groups with signal).")
    resample_rounds: int = Field(0, description="Dynamic sampling: the most refills one slot of the step needed.")
    logprob_mismatch_kl: float | None = Field(None, description="Trainer–sampler mismatch before the update: k3 "
                                              "estimate of KL(behaviour || trainer) per token.")
    logprob_mismatch_max_ratio: float | None = Field(None, description="Largest token ratio trainer / behaviour "
                                                     "probability before the update.")
    mismatch_masked_fraction: float | None = Field(None, description="Completions masked by "
                                                   "spec.algorithm.mismatchMask (0 when off).")
    truncation_outside_tokens: int = Field(0, description="Sampled tokens outside the trainer's own topK/topP set "
                                           "(kept: learner/truncation.py).")
    flops: float | None = Field(None, description="Matmul FLOPs the step ran, forward and backward, all ranks "
                                "(counted from the model's shapes and the step's token shapes: learner/flops.py).")
    flops_per_second: float | None = Field(None, description="flops over the step's wall time.")
    peak_flops_per_second: float | None = Field(None, description="GEMM peak measured in the trainer's process, "
                                                "same cores, threads and compute dtype, summed over ranks "
                                                "(learner/peak.py).")
    mfu: float | None = Field(None, description="Model FLOPs utilisation: flops_per_second / "
                              "peak_flops_per_second (recomputation not counted).")


class StepRecord(StepMetrics):
    """One optimizer step as trainer rank 0 records it (a line of ``metrics.jsonl``): the learner's
    :class:`StepMetrics`, then the loop's figures, the episodes', evaluation and export on request."""

    model_config = pydantic.ConfigDict(extra="ignore", frozen=False)

    # the loop's figures
    time: float = Field(0.0, description="Wall clock (seconds since the epoch) when the step's record was made.")
    step_seconds: float | None = Field(None, description="The train step alone.")
    wait_seconds: float = Field(0.0, description="Waiting for the step's scored groups.")
    weight_sync_seconds: float | None = Field(None, description="The push that completed during this step.")
    weight_sync_bytes: int | None = None
    dropped_stale: int = Field(0, description="Groups dropped as stale (policy lag above maxPolicyLag) since the "
                               "previous step's record; trainer rank 0's share.")
    dropped_total: int = Field(0, description="Groups dropped for any reason since the previous step's record.")
    infra_masked_rollouts: int = Field(0, description="Rollout groups kept out of training since the previous "
                                       "step's record because a pod they depended on was lost (an episode's "
                                       "environment server: env_lost), not scored and sampled again; trainer rank "
                                       "0's share.")
    policy_lag: dict[str, int] = Field(default_factory=dict, description="Groups trained by their policy lag.")
    # partial rollouts (spec.algorithm.partialRollouts): tokens by policy version (trainer rank 0's share)
    token_lag_mean: float | None = Field(None, description="Mean policy lag of the completion tokens trained on.")
    old_version_token_fraction: float | None = Field(
        None, description="Share of tokens sampled under a version older than their group's newest.")
    masked_stale_tokens: int = Field(0, description="Tokens masked out of the loss: older than maxPolicyLag.")
    # multi-turn episodes (spec.environment; trainer rank 0's share)
    episode_turns_mean: float | None = Field(None, description="Mean policy turns per episode trained on.")
    tool_calls: int = Field(0, description="Tool calls of the episodes trained on.")
    tool_errors: int = Field(0, description="Tool calls that failed, of the episodes trained on.")
    env_masked_tokens: int = Field(0, description="Environment tokens: in context, masked out of the loss.")
    # evaluation (spec.evaluation)
    eval_accuracy: float | None = Field(None, description="Held-out accuracy at the latest evaluation.")
    eval_accuracy_base: float | None = Field(None, description="The base policy's (first record only).")
    eval_seconds: float | None = None
    evaluated: bool = Field(False, description="This step evaluated.")
    # export on request
    export: str | None = Field(None, description="The HF folder this step exported on request.")
    export_request: str | None = Field(None, description="The request's id this step served.")
    # fencing (docs/fencing.md; trainer rank 0)
    trainer_epoch: int = Field(0, description="The trainer epoch that trained the step (0: unfenced).")
    fenced_checkpoints: int = Field(0, description="Checkpoint commits of stale trainer epochs the store refused "
                                    "so far (its fence records).")
    fenced_pushes: int = Field(0, description="Weight pushes of stale trainer epochs the generators refused so "
                               "far, as they last reported them.")
    # recovery (docs/recovery.md; trainer rank 0)
    weights_at: float | None = Field(None, description="Wall clock when the generators last took the current "
                                     "policy outside the schedule (the push after a resume, a restart or a join of "
                                     "a generator): the end of a recovery's weights part.")

    @classmethod
    def of(cls, metrics: StepMetrics, rest: StepRecord) -> StepRecord:
        """The record whose first part is the learner's ``metrics`` and whose other fields are ``rest``'s."""
        return rest.model_copy(update=metrics.model_dump())

    def doc(self, *, only_set: bool = False) -> dict[str, Any]:
        """The line's JSON object; ``only_set``: just the fields the record was made with (the trainer's closing
        ``done`` record carries step, policy version, export and accuracy, no step figures)."""
        doc = self.model_dump(mode="json", exclude_unset=only_set)
        for key in SPARSE:
            if doc.get(key) is None or doc.get(key) is False:
                doc.pop(key, None)
        return doc

    def encode(self) -> str:
        """One JSONL line (without the newline)."""
        return json.dumps(self.doc())

    @classmethod
    def decode(cls, line: str | bytes) -> StepRecord | None:
        """A line of ``metrics.jsonl``; None when torn, malformed or without an integer ``step``."""
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        return cls.from_doc(doc)

    @classmethod
    def from_doc(cls, doc: Any) -> StepRecord | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("step"), int) or isinstance(doc["step"], bool):
            return None
        try:
            return cls.model_validate(doc)
        except pydantic.ValidationError:
            return None


#: ProgressReport fields that are not ``status.progress``: the operator reads them, the status does not hold them.
REPORT_ONLY = {"done", "trainer_epoch", "fenced_checkpoints", "fenced_pushes", "time", "weights_at",
               "silent_generators"}


class ProgressReport(rljob.Progress):
    """Trainer rank 0's progress annotation: ``status.progress`` plus whether the job is done, and the writer's
    trainer epoch with the stale writes refused so far (the operator fences and counts: docs/fencing.md)."""

    model_config = pydantic.ConfigDict(extra="ignore")

    done: bool = Field(False, description="The last step finished: the job has succeeded.")
    trainer_epoch: int = Field(0, description="The epoch of the trainer that wrote the report.")
    fenced_checkpoints: int = Field(0, description="StepRecord.fenced_checkpoints of the reported step.")
    fenced_pushes: int = Field(0, description="StepRecord.fenced_pushes of the reported step.")
    time: float = Field(0.0, description="StepRecord.time of the reported step (0: unknown).")
    weights_at: float | None = Field(None, description="StepRecord.weights_at of the reported step.")
    silent_generators: dict[int, float] = Field(
        default_factory=dict, description="Generators trainer rank 0 has heard nothing from for "
        "peerSilenceSeconds after they beat (docs/recovery.md): index -> wall clock when last heard. The operator "
        "fails such a generator's pod without waiting for the node controller (operator/peersilence.py).")

    @classmethod
    def of_step(cls, record: StepRecord, *, done: bool,
                last_export: rljob.ExportInfo | None = None) -> ProgressReport:
        """The report of a step: every ``rljob.Progress`` field the record also has; ``lastExport`` is the one
        given, else the record's own (when it served a request)."""
        shared = {name: getattr(record, name) for name in (*rljob.Progress.model_fields, *REPORT_ONLY)
                  if name in StepRecord.model_fields}
        if record.episode_turns_mean is None:       # no episodes: no tool calls to report (not "0 calls")
            shared["tool_calls"] = None
        if last_export is None and record.export_request is not None:
            last_export = rljob.ExportInfo(request=record.export_request, path=record.export, step=record.step)
        return cls(**shared, last_export=last_export, done=done)

    def encode(self) -> str:
        """The annotation's value: compact camelCase JSON; ``evalAccuracy``, ``lastExport`` and the episode fields
        only once known, the fencing fields and ``infraMaskedRollouts`` only when not 0."""
        doc = self.model_dump(mode="json", by_alias=True)
        for key in ("evalAccuracy", "lastExport", "episodeTurnsMean", "toolCalls"):
            if doc.get(key) is None:
                doc.pop(key, None)
        for key in ("trainerEpoch", "fencedCheckpoints", "fencedPushes", "time", "infraMaskedRollouts"):   # 0: none
            if doc.get(key) == 0:
                doc.pop(key, None)
        if doc.get("weightsAt") is None:
            doc.pop("weightsAt", None)
        if not doc.get("silentGenerators"):
            doc.pop("silentGenerators", None)
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | None) -> ProgressReport | None:
        """The annotation as a report; None when absent or malformed. A malformed ``lastExport`` alone is dropped
        (the rest of the progress still counts)."""
        if not text:
            return None
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        export = doc.get("lastExport")
        if export is not None and not (isinstance(export, dict) and isinstance(export.get("request"), str)
                                       and export["request"]):
            doc = {k: v for k, v in doc.items() if k != "lastExport"}     # a request needs its id
        for attempt in (doc, {k: v for k, v in doc.items() if k != "lastExport"}):
            try:
                return cls.model_validate(attempt)
            except pydantic.ValidationError:
                continue
        return None

    def status(self, previous: rljob.Progress) -> rljob.Progress:
        """``status.progress`` from this report; ``lastExport`` stays once set."""
        doc = self.model_dump(exclude=REPORT_ONLY)
        if self.last_export is None:
            doc["last_export"] = previous.last_export
        return rljob.Progress.model_validate(doc)
