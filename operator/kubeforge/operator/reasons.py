"""Condition types, condition reasons and event reasons the operator writes (CamelCase, as Kubernetes wants).

Role: one documented home for every reason string, so status tables, events, docs and tests spell them alike.
Neighbours: ``status`` and ``lifecycle`` pick them; ``reconcile`` posts events with them.
"""
from __future__ import annotations

# ---- condition types ----
GANG_SCHEDULED = "GangScheduled"   # every pod of the current attempt is bound to a node
READY = "Ready"                    # every role has all replicas ready
SUSPENDED = "Suspended"            # spec.suspend is true
COMPLETE = "Complete"              # training finished (terminal)
FAILED = "Failed"                  # the job failed (terminal)
STALLED = "Stalled"                # the trainer's step has not moved for spec.failurePolicy.progressDeadlineSeconds
ADMITTED = "Admitted"              # Kueue admitted the job (only for an RLJob labelled kueue.x-k8s.io/queue-name)
GANG_SCHEDULING = "GangScheduling"  # gang.backend Auto: which gang the operator chose and why (True: a gang holds it)

# ---- reasons ----
WAITING_FOR_PODS = "WaitingForPods"      # pods of the attempt are not all created yet
UNSCHEDULABLE = "Unschedulable"          # the scheduler refused the gang (message copied from a pod)
SCHEDULED = "Scheduled"
ALL_ROLES_READY = "AllRolesReady"
ROLES_NOT_READY = "RolesNotReady"
JOB_SUSPENDED = "JobSuspended"
JOB_RESUMED = "JobResumed"
TRAINING_COMPLETE = "TrainingComplete"
DEADLINE_EXCEEDED = "DeadlineExceeded"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"
RESTARTING = "Restarting"                # a failure triggered a restart from checkpoint
ROLE_RESTARTED = "RoleRestarted"         # a RestartRole failure: only the failed pods come back
FAILURE_IGNORED = "FailureIgnored"       # event: an Ignore rule matched; nothing counted
FAILED_BY_RULE = "FailedByRule"          # a failurePolicy rule with action Fail matched
RESCALED = "Rescaled"                    # replicas changed: the job restarts with the new world
NO_PROGRESS = "NoProgress"
PROGRESSING = "Progressing"
NOT_FINISHED = "NotFinished"
NOT_SUSPENDED = "NotSuspended"
FINISHED = "Finished"                    # the job is over: nothing is scheduled any more
INVALID_SPEC = "InvalidSpec"             # event: the stored RLJob does not parse (API server and model disagree)
TTL_EXPIRED = "TTLExpired"               # event: a finished job was deleted after ttlSecondsAfterFinished
CHILDREN_APPLIED = "ChildrenApplied"     # condition: the API server accepted every child (False: ApplyFailed)
APPLY_FAILED = "ApplyFailed"             # condition reason and event: the API server refused a child, its message kept
# Kueue (condition Admitted's reasons, and events on their transitions)
QUEUED = "Queued"                        # waiting in its LocalQueue for quota (Kueue's message kept)
QUOTA_ADMITTED = "Admitted"              # Kueue admitted it: pods run with the flavors and counts assigned
PREEMPTED = "Preempted"                  # Kueue evicted it for a workload of higher priority: suspended, requeued
EVICTED = "Evicted"                      # Kueue evicted it for another reason (its message kept): suspended
QUEUE_INVALID = "QueueInvalid"           # the labels name what cannot admit it (e.g. no such WorkloadPriorityClass)
NODE_LOST = "NodeLost"                   # event (Warning): a node not Ready past the grace; its pods of the job force-deleted
CONTAINER_FAILED = "ContainerFailed"      # event: a container of the current attempt failed
# gang.backend Auto (condition GangScheduling's reasons, and the event when the choice is made; gangauto.py)
AUTO_CHOSE_KUEUE = "AutoChoseKueue"                # the RLJob carries a Kueue queue label: Kueue admits it whole
AUTO_CHOSE_COSCHEDULING = "AutoChoseCoscheduling"  # PodGroups served and the operator names their scheduler
AUTO_CHOSE_NONE = "AutoChoseNone"                  # neither: no gang, pods scheduled one by one
