"""What a failure restarts and how often (``spec.failurePolicy``); the operator's ``failure_policy`` and the
local launcher apply the same rules."""
from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field

from kubeforge.api.rljob.base import Model
from kubeforge.api.rljob.roles import RoleName


class FailureAction(str, enum.Enum):
    RESTART_ALL = "RestartAll"       # every role restarts; trainers resume from the last complete checkpoint
    RESTART_ROLE = "RestartRole"     # only the failed pods restart; the rest of the job keeps running
    FAIL = "Fail"                    # the job fails at once with this failure as its reason
    IGNORE = "Ignore"                # not counted; the failed process is simply started again in place


class FailureReason(str, enum.Enum):
    """Why a container or pod ended (the Kubernetes termination reasons a rule can match)."""

    ERROR = "Error"                  # exited non-zero (a crash, kill -9: exit code 128+signal)
    OOM_KILLED = "OOMKilled"
    EVICTED = "Evicted"
    NODE_LOST = "NodeLost"
    UNHEALTHY = "Unhealthy"          # killed because its liveness probe failed (no progress within the deadline)
    PREEMPTED = "Preempted"          # preempted for a pod of higher priority (scheduler or kubelet): not counted


class FailureRule(Model):
    """One rule: when a failure matches every criterion given (an empty list matches anything), take ``action``."""

    action: FailureAction = Field(description="RestartAll | RestartRole | Fail | Ignore.")
    roles: list[RoleName] = Field(default_factory=list, max_length=3, description="Roles the rule applies to "
                                  "(empty: every role). RestartRole on a trainer restarts the whole job.")
    on_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=list, max_length=64, description="Container exit codes the rule applies to (empty: any).")
    on_reasons: list[FailureReason] = Field(default_factory=list, max_length=8, description="Termination "
                                            "reasons the rule applies to (empty: any): Error, OOMKilled, Evicted, "
                                            "NodeLost, Unhealthy, Preempted (a restart for a preemption is not "
                                            "counted against maxRestarts).")


START_ALLOWANCE_FACTOR = 3      # a role's start may take this many progress deadlines (FailurePolicySpec)


class FailurePolicySpec(Model):
    """What happens when a role's container fails: ordered rules, first match wins, no match restarts all."""

    max_restarts: int = Field(3, ge=0, le=10000, description="Restarts (RestartAll and RestartRole alike) before "
                              "the job fails with BackoffLimitExceeded.")
    rules: list[FailureRule] = Field(default_factory=list, max_length=32, description="Ordered rules; the first "
                                     "that matches a failure decides; no match: RestartAll.")
    progress_deadline_seconds: int = Field(
        600, ge=10, le=86400, description="A role that makes no progress (no step, no batch, no heartbeat) for this "
        "long is unhealthy: its liveness probe fails, the launcher restarts it, and the operator marks the job "
        "Stalled. Every wait in the roles is bounded by it. A role still starting (loading its model or vLLM "
        "engine) has 3 times as long (its startup probe) before it counts as hung.")

    peer_silence_seconds: int = Field(
        10, ge=2, le=600, description="Trainer rank 0 leaves a generator out (its prompts go to the live ones, the "
        "weight-sync group re-forms without it) once it has heard nothing from it for this long; generators beat "
        "every quarter of it. At most progressDeadlineSeconds. A generator left out joins again with its READY.")

    def peer_beat_seconds(self) -> float:
        """How often a generator tells trainer 0 it is alive: a quarter of ``peerSilenceSeconds``, so three beats
        can be lost before it is left out."""
        return self.peer_silence_seconds / 4

    def start_deadline_seconds(self) -> int:
        """How long a role may take to start (model or vLLM engine loaded, ready) before it counts as hung: the pod's
        startupProbe allowance, the local watchdog's bound during a start, and the trainer's bound on waiting for a
        generator's start. ``START_ALLOWANCE_FACTOR`` times ``progressDeadlineSeconds``: an engine start on loaded
        CPUs can outlast the progress deadline, and a start is not a hang."""
        return START_ALLOWANCE_FACTOR * self.progress_deadline_seconds
