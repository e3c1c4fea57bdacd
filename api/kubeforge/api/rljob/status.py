"""The observed state of an RLJob (``status``), written by the operator only."""
from __future__ import annotations

import enum
from typing import Literal

import pydantic
from pydantic import Field

from kubeforge.api.rljob.base import Model


class Phase(str, enum.Enum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Condition(Model):
    """A standard Kubernetes condition."""

    type: str = Field(description="Condition type (CamelCase).")
    status: Literal["True", "False", "Unknown"] = Field(description="True | False | Unknown.")
    reason: str = Field("", description="CamelCase reason.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str | None = Field(None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="Generation of the spec this was computed from.")


class RoleStatus(Model):
    """Observed state of one role."""

    replicas: int = Field(0, description="Desired pods.")
    ready: int = Field(0, description="Ready pods.")
    restarts: int = Field(0, description="Restarts counted against maxRestarts that this role's failures caused.")
    container_restarts: int = Field(0, description="Container restarts the kubelet made in the current attempt.")


class ExportInfo(Model):
    """An export served on request (the RLJob's annotation ``kubeforge.dev/export-request``)."""

    request: str = Field(description="The request's id: the annotation's value that asked for it.")
    path: str | None = Field(None, description="The HF folder written (inside the trainer's checkpoint volume).")
    step: int = Field(0, description="The optimizer step whose policy was exported.")


class Progress(Model):
    """Training progress reported by trainer rank 0."""

    step: int = Field(0, description="Last completed optimizer step.")
    mean_reward: float | None = Field(None, description="Mean reward of the last step.")
    policy_version: int = Field(0, description="Policy version the generators were last synced to.")
    logprob_mismatch_kl: float | None = Field(None, description="Trainer–sampler logprob mismatch of the last step "
                                              "before its update: k3 estimate of KL(behaviour || trainer) per "
                                              "token.")
    eval_accuracy: float | None = Field(None, description="Held-out greedy accuracy at the last evaluation "
                                        "(spec.evaluation).")
    episode_turns_mean: float | None = Field(None, description="Mean policy turns per episode of the last step "
                                             "(spec.environment; trainer rank 0's share).")
    tool_calls: int | None = Field(None, description="Tool calls of the last step's episodes (spec.environment; "
                                   "trainer rank 0's share).")
    infra_masked_rollouts: int = Field(0, description="Rollout groups kept out of training while the last step was "
                                       "collected because a pod they depended on was lost (an episode's environment "
                                       "server died, went silent or forgot it: env_lost), sampled again instead of "
                                       "trained on with reward 0 (trainer rank 0's share; docs/agents.md).")
    last_export: ExportInfo | None = Field(None, description="The last export served on request (set the "
                                           "annotation kubeforge.dev/export-request on the RLJob to a new id to "
                                           "ask for one); it stays once set.")


class FailureInfo(Model):
    """The last failure observed."""

    role: str = Field("", description="Role of the failed container.")
    pod: str = Field("", description="Pod name.")
    exit_code: int | None = Field(None, description="Container exit code.")
    reason: str = Field("", description="Container termination reason (Error, OOMKilled, ...).")
    action: str = Field("", description="What the failure policy did: RestartAll | RestartRole | Fail | Ignore.")
    attempt: int | None = Field(None, description="Attempt the failed pod belonged to.")
    time: str | None = Field(None, description="When it was observed.")
    node: str | None = Field(None, description="The node the pod was lost with (reason NodeLost: the node was not "
                             "Ready for the operator's node-loss grace; docs/node-loss.md).")


class FencedWrites(Model):
    """Writes refused because they came from a trainer epoch older than the current one (docs/fencing.md)."""

    checkpoints: int = Field(0, description="Checkpoint commits of stale trainer epochs the checkpoint store refused "
                             "(its fence records, as the current trainer reports them).")
    pushes: int = Field(0, description="Weight pushes of stale trainer epochs the generators refused (the highest "
                        "count each generator last reported to the current trainer; a generator restart forgets its "
                        "own).")
    reports: int = Field(0, description="Progress reports of stale trainer epochs the operator ignored (each "
                         "distinct report once).")
    last_report: str | None = Field(None, description="The last stale report counted (so a pass that sees it again "
                                    "does not count it twice).")


class RecoveryBreakdown(Model):
    """The last recovery in parts (docs/recovery.md): the operator fills it
    from what it observes (the failure, the replacement pods' scheduling, start and readiness) and what trainer 0
    reports (when the generators took the current policy, when the next step was trained). A part is null until
    it is known; ``seconds`` is set once the next step is trained (then the breakdown no longer changes)."""

    fault_time: str | None = Field(None, description="When the fault happened, as far as the operator can tell "
                                   "(a lost node's last heartbeat; a container's exit).")
    detected_time: str | None = Field(None, description="When the operator acted on it (the failure recorded).")
    step: int = Field(0, description="The trainer's reported step when it was detected (the recovery ends at the "
                      "first step record trainer 0 makes after the detection).")
    pod: str | None = Field(None, description="The replacement pod that was ready last (the parts below follow it).")
    detect: float | None = Field(None, description="Seconds from the fault to its detection.")
    reschedule: float | None = Field(None, description="Seconds from the detection to the replacement pod "
                                     "scheduled on a node.")
    pod_start: float | None = Field(None, description="Seconds from scheduled to its container running (image, "
                                    "volumes, sandbox).")
    engine_start: float | None = Field(None, description="Seconds from its container running to the pod Ready "
                                       "(a generator's vLLM engine, a trainer's model).")
    weights: float | None = Field(None, description="Seconds from the pod Ready to the generators holding the "
                                  "current policy (trainer 0's push after the resume, restart or join).")
    first_step: float | None = Field(None, description="Seconds from the current policy held (or the pod Ready) "
                                     "to the next trained step.")
    seconds: float | None = Field(None, description="Seconds from the fault to the next trained step: the sum of "
                                  "the known parts (a mark earlier than the one before it counts from that one).")


class RLJobStatus(Model):
    """Observed state of an RLJob, written by the operator only."""

    model_config = pydantic.ConfigDict(extra="ignore")

    phase: Phase = Field(Phase.PENDING, description="Pending | Starting | Running | Restarting | Suspended | "
                         "Succeeded | Failed.")
    observed_generation: int | None = Field(None, description="Generation of the spec last reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Conditions (Ready, Suspended, ...), one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    roles: dict[str, RoleStatus] = Field(default_factory=dict, description="Per-role replicas and readiness.")
    ready: str | None = Field(None, description="Ready roles as 'ready/total' (printer column).")
    restarts: int = Field(0, description="Job restarts so far.")
    attempt: int = Field(0, description="Current attempt (0 first).")
    trainer_epoch: int = Field(0, description="The epoch trainer pods created now carry (their label "
                               "kubeforge.dev/trainer-epoch): 1 first, one more at each new attempt and each "
                               "NodeLost failure; a write from an older epoch is refused (docs/fencing.md).")
    fenced_writes: FencedWrites = Field(default_factory=FencedWrites, description="Writes of stale trainer "
                                        "epochs refused so far.")
    last_failure: FailureInfo | None = Field(None, description="The last container failure observed.")
    recovery_breakdown: RecoveryBreakdown | None = Field(None, description="The last recovery from a failure, in "
                                                         "parts (seconds), from the fault to the next trained step.")
    handled_failures: dict[str, str] = Field(default_factory=dict, description="Per pod, the failure the "
                                             "failure policy last acted on (so none is acted on twice).")
    progress: Progress = Field(default_factory=Progress, description="Training progress.")
    last_progress_time: str | None = Field(None, description="When the trainer's reported step last moved (or "
                                           "the current attempt started); the Stalled condition counts from it.")
    start_time: str | None = Field(None, description="When the job first ran.")
    completion_time: str | None = Field(None, description="When the job finished.")
