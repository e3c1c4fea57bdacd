"""Condition types, condition reasons and event reasons the operator writes (CamelCase, as Kubernetes wants), and the
troubleshooting text of each.

Role: one documented home for every reason string, so status tables, events, docs and tests spell them alike.
Neighbours: ``status`` and ``lifecycle`` pick them; ``reconcile`` posts events with them; ``docs/refdocs.py``
renders ``CONDITIONS`` and ``REFERENCE`` into docs/troubleshooting.md (`make refdocs`).
Invariants (tests/test_refdocs.py): every condition type is in ``CONDITION_TYPES`` with a line in ``CONDITIONS``;
every other string constant here, every kubelet reason ``observed.STUCK_REASONS`` passes on and every
``rljob.FailureReason`` has a ``REFERENCE`` entry, and ``REFERENCE`` holds nothing else.
"""
from __future__ import annotations

import dataclasses

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
NOT_SUSPENDED = "NotSuspended"
FINISHED = "Finished"                    # the job is over: nothing is scheduled any more
INVALID_SPEC = "InvalidSpec"             # event: the stored RLJob does not parse (API server and model disagree)
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
POOL_NOT_FOUND = "PoolNotFound"          # event (Warning): the GeneratorPool the job names does not exist: no pods
# gang.backend Auto (condition GangScheduling's reasons, and the event when the choice is made; gangauto.py)
AUTO_CHOSE_KUEUE = "AutoChoseKueue"                # the RLJob carries a Kueue queue label: Kueue admits it whole
AUTO_CHOSE_COSCHEDULING = "AutoChoseCoscheduling"  # PodGroups served and the operator names their scheduler
AUTO_CHOSE_NONE = "AutoChoseNone"                  # neither: no gang, pods scheduled one by one
# Phase changes (event reasons: the new phase's name; ``status._PHASE_EVENT`` gives each its event type)
PHASE_PENDING = "Pending"
PHASE_STARTING = "Starting"
PHASE_RUNNING = "Running"
PHASE_RESTARTING = "Restarting"          # the same string as RESTARTING: one entry covers both events
PHASE_SUSPENDED = "Suspended"
PHASE_SUCCEEDED = "Succeeded"
PHASE_FAILED = "Failed"

#: Every condition type the operator writes on an RLJob (the other constants above are reasons).
CONDITION_TYPES = (GANG_SCHEDULED, GANG_SCHEDULING, READY, SUSPENDED, ADMITTED, STALLED, COMPLETE, FAILED, CHILDREN_APPLIED)


# ---- the troubleshooting reference (docs/troubleshooting.md is generated from it: `make refdocs`) ----

@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """What one reason string means where the operator writes it, what to check and what to run. One entry per
    string: a string written in several places (``Preempted``: a condition's reason, an event, a failure) has one
    entry that names each place."""

    conditions: tuple[str, ...] = ()   # "Type=Status" of each condition that can carry it
    event: str = ""                    # the type of the events posted with it (Normal | Warning), "" when none
    failure: bool = False              # a failure reason: status.lastFailure.reason, a rule's onReasons
    meaning: str
    check: str
    run: tuple[str, ...] = ()          # commands; <ns>, <job>, <pod>, <node> stand for the names


#: What each condition type says (docs/troubleshooting.md's first table).
CONDITIONS: dict[str, str] = {
    GANG_SCHEDULED: "True once every gang-held pod of the current attempt is bound to a node (the gang minimum).",
    READY: "True while every role has all its replicas ready; its reason says which roles lag, or why a container "
           "cannot start.",
    SUSPENDED: "True while the job holds no pods: `spec.suspend` is true, or Kueue has not admitted it (or evicted "
               "it).",
    ADMITTED: "Only on an RLJob labelled `kueue.x-k8s.io/queue-name`: True while Kueue admits its Workload.",
    STALLED: "True while the trainer's step has not moved for `spec.failurePolicy.progressDeadlineSeconds` (three "
             "times that before the first step). A report only: the roles' liveness probes restart a hung role.",
    COMPLETE: "Written once training finished (phase Succeeded); terminal.",
    FAILED: "Written once the job failed (phase Failed); terminal.",
    GANG_SCHEDULING: "Only on an RLJob whose `spec.gang.backend` is Auto (the default): which gang the operator "
                     "chose and why, once, at the first pass; True when a gang holds the job (Kueue or Coscheduling).",
    CHILDREN_APPLIED: "Written (False) only when the API server refused a child object for good; it goes with the "
                      "next pass that applies everything.",
}

_DESCRIBE = "kubectl -n <ns> describe rljob <job>"
_PODS = "kubectl -n <ns> get pods -l kubeforge.dev/job=<job> -o wide"
_POD = "kubectl -n <ns> describe pod <pod>"
_LOGS = "kubectl -n <ns> logs <pod> --previous"
_LAST_FAILURE = "kubectl -n <ns> get rljob <job> -o jsonpath='{.status.lastFailure}'"
_PROGRESS = "kubectl -n <ns> get rljob <job> -o jsonpath='{.status.progress}'"
_OPERATOR_LOG = "kubectl -n kubeforge-system logs -l app.kubernetes.io/component=operator --tail=200"
_WORKLOAD = "kubectl -n <ns> get workload <job> -o yaml"
_QUEUES = "kubectl -n <ns> get localqueue; kubectl get clusterqueue"
_GANG = "kubectl -n <ns> get podgroup <job> -o yaml"
_NODES = "kubectl get nodes; kubectl describe node <node>"

_IMAGE = ("The image of `spec.roles.<role>.image` (else the operator's `--runtime-image`, the chart's "
          "`runtimeImage`): its name and tag, that the node can reach the registry, and "
          "`spec.roles.<role>.imagePullSecrets` for a private one.")
_STUCK_CHECK = "The kubelet's message in the condition; the pod's events."


def _stuck(meaning: str, check: str) -> Entry:
    """A kubelet waiting reason the operator passes on (``observed.STUCK_REASONS``): the kubelet retries it forever,
    so the operator says it on the Ready condition and in one Warning event per change."""
    return Entry(conditions=(f"{READY}=False",), event="Warning", meaning=meaning + " The kubelet retries without "
                 "end: the job waits until the cause is fixed.", check=check,
                 run=(_PODS, _POD))


def _phase(event: str, became: str, check: str, *run: str) -> Entry:
    """A phase change's event (``status._PHASE_EVENT``): its reason is the new phase."""
    return Entry(event=event, meaning=f"The phase became {became}", check=check, run=run)


#: One entry per reason string the operator writes (tests/test_refdocs.py: no reason without one, none extra).
REFERENCE: dict[str, Entry] = {
    # ---- GangScheduled ----
    WAITING_FOR_PODS: Entry(
        conditions=(f"{GANG_SCHEDULED}=False",),
        meaning="Not every gang-held pod of the current attempt is bound to a node yet (the message counts them). "
                "Normal for a few seconds after a start or a restart.",
        check="Whether the StatefulSets made their pods (a quota or an admission webhook can refuse them: the "
              "StatefulSet's events say so), and whether the pods wait on the gang scheduler of `spec.gang.backend` "
              "(its PodGroup, named like the job, for Coscheduling, Volcano and KAI).",
        run=(_PODS, "kubectl -n <ns> describe statefulset <job>-trainer", _GANG)),
    UNSCHEDULABLE: Entry(
        conditions=(f"{GANG_SCHEDULED}=False",),
        meaning="The scheduler refused a pod of the gang; the message is the scheduler's (e.g. `0/3 nodes are "
                "available: 3 Insufficient nvidia.com/gpu`). While a gang is being created a gang scheduler marks "
                "its pods Unschedulable until all are there, so a brief flip with WaitingForPods is normal.",
        check="The roles' requests against what the nodes have free (GPUs, memory), "
              "`spec.roles.<role>.nodeSelector` and `spec.roles.<role>.tolerations` against the nodes' labels and "
              "taints, and the gang object's minimum.",
        run=(_POD, "kubectl describe nodes", _GANG)),
    SCHEDULED: Entry(
        conditions=(f"{GANG_SCHEDULED}=True",),
        meaning="Every gang-held pod of the current attempt is bound to a node.",
        check="Nothing; if the job still is not Running, see the Ready condition."),
    FINISHED: Entry(
        conditions=(f"{GANG_SCHEDULED}=False",),
        meaning="The job is over (Succeeded or Failed): nothing is scheduled any more.",
        check="The Complete or Failed condition for why it ended."),
    # ---- GangScheduling (gang.backend Auto) ----
    AUTO_CHOSE_KUEUE: Entry(
        conditions=(f"{GANG_SCHEDULING}=True",), event="Normal",
        meaning="The RLJob carries the `kueue.x-k8s.io/queue-name` label: Kueue admits the whole job (its admission "
                "is the gang), so the pods carry no gang object. Kept for the job's life.",
        check="The Admitted condition and the job's Workload; delete and re-create the job to decide again.",
        run=(_DESCRIBE, _WORKLOAD, _QUEUES)),
    AUTO_CHOSE_COSCHEDULING: Entry(
        conditions=(f"{GANG_SCHEDULING}=True",), event="Normal",
        meaning="The API server serves podgroups.scheduling.x-k8s.io and the operator names the scheduler that serves "
                "them (`--coscheduling-scheduler-name`, the chart's `gang.coschedulingSchedulerName`): the job's pods "
                "form a PodGroup and carry that `schedulerName`. Kept for the job's life.",
        check="That the named scheduler runs and serves PodGroups (pods Pending with no events mean it does not).",
        run=(_GANG, _PODS, "kubectl api-resources --api-group=scheduling.x-k8s.io")),
    AUTO_CHOSE_NONE: Entry(
        conditions=(f"{GANG_SCHEDULING}=False",), event="Normal",
        meaning="Neither a Kueue queue label nor a served PodGroup API with a named scheduler: no gang, the pods are "
                "scheduled one by one (a partial start waits, holding what it got). The message says which was "
                "missing. Kept for the job's life.",
        check="For a gang: label the job for Kueue, or install Coscheduling and set the chart's "
              "`gang.coschedulingSchedulerName`, then re-create the job.",
        run=(_DESCRIBE, "kubectl api-resources --api-group=scheduling.x-k8s.io")),
    # ---- Ready ----
    ALL_ROLES_READY: Entry(
        conditions=(f"{READY}=True",),
        meaning="Every role has all its replicas ready.",
        check="Nothing."),
    ROLES_NOT_READY: Entry(
        conditions=(f"{READY}=False",),
        meaning="Some role has fewer ready pods than replicas (the message lists them, e.g. `generator 1/2`), or no "
                "pods are wanted now (suspended, queued, finished, or an old attempt draining). A role is ready once "
                "its `/readyz` answers 200: the generator's vLLM engine has loaded, the trainer's model is built.",
        check="The lagging role's pods: Pending (see GangScheduled), starting (a large model loads for minutes; the "
              "start allowance is three times `spec.failurePolicy.progressDeadlineSeconds`), or restarting "
              "(their logs).",
        run=(_PODS, "kubectl -n <ns> logs <pod>", _LOGS)),
    "ErrImagePull": _stuck("The kubelet could not pull a role's image.", _IMAGE),
    "ImagePullBackOff": _stuck("The kubelet backs off pulling a role's image after failed pulls.", _IMAGE),
    "InvalidImageName": _stuck("A role's image reference does not parse.", _IMAGE),
    "CreateContainerConfigError": _stuck(
        "The kubelet could not build a container's configuration: most often a Secret or ConfigMap it references "
        "is missing.",
        "The message names what is missing: a Secret in `spec.roles.<role>.env` (`valueFrom`), the job key Secret "
        "`<job>-key` (the operator creates it once), or a volume's source."),
    "CreateContainerError": _stuck(
        "The container runtime could not create a container (a bad mount, a security setting the runtime "
        "refuses).",
        "The message; `spec.roles.<role>.volumes` and their mounts; the node's container runtime log."),
    "RunContainerError": _stuck(
        "The container runtime could not start the container's process (a missing executable, a bad "
        "`spec.roles.<role>.command`). A container that did start and exit is a failure too (see Error).",
        "The message, and `spec.roles.<role>.command` against what the image holds."),
    # ---- Suspended ----
    JOB_SUSPENDED: Entry(
        conditions=(f"{SUSPENDED}=True", f"{GANG_SCHEDULED}=False"),
        meaning="`spec.suspend` is true: every role is at 0 replicas and the gang object is gone. Resuming starts the "
                "trainers from the last checkpoint and restarts the `spec.activeDeadlineSeconds` clock.",
        check="Who set `spec.suspend` (the RLJob's managedFields).",
        run=("kubectl -n <ns> patch rljob <job> --type merge -p '{\"spec\": {\"suspend\": false}}'",)),
    NOT_SUSPENDED: Entry(
        conditions=(f"{SUSPENDED}=False",),
        meaning="The job is neither suspended nor held by Kueue.",
        check="Nothing."),
    # ---- Kueue (Admitted; also Suspended's and GangScheduled's reason while not admitted) ----
    QUEUED: Entry(
        conditions=(f"{ADMITTED}=False", f"{SUSPENDED}=True", f"{GANG_SCHEDULED}=False"), event="Normal",
        meaning="The job waits in its LocalQueue for quota; no pod exists and the phase is Pending. The message is "
                "Kueue's (its Workload's QuotaReserved message), or says the Workload is being created.",
        check="The LocalQueue named by the `kueue.x-k8s.io/queue-name` label exists and points at a ClusterQueue "
              "with quota for every role's requests; what else holds that quota.",
        run=(_WORKLOAD, _QUEUES)),
    QUOTA_ADMITTED: Entry(
        conditions=(f"{ADMITTED}=True",), event="Normal",
        meaning="Kueue admitted the job: its pods run with the counts and the flavors' node labels and tolerations "
                "Kueue assigned (the message gives the counts per role).",
        check="Nothing; a job admitted with fewer generators than asked grows as quota frees."),
    PREEMPTED: Entry(
        conditions=(f"{ADMITTED}=False", f"{SUSPENDED}=True", f"{GANG_SCHEDULED}=False"), event="Warning", failure=True,
        meaning="Three places, one cause: something of higher priority took the job's place. Admitted=False: Kueue "
                "evicted the Workload for a higher-priority one; the pods stop (the trainer writes a stop "
                "checkpoint), the phase is Suspended and Kueue requeues it. The event also comes when a pod of the "
                "gang was preempted by the scheduler or the kubelet; as a failure (`status.lastFailure.reason`) the "
                "restart that follows is not counted against `spec.failurePolicy.maxRestarts`.",
        check="The WorkloadPriorityClass or PriorityClass of the job against the jobs that took its place.",
        run=(_WORKLOAD, _LAST_FAILURE, "kubectl get priorityclass,workloadpriorityclass")),
    EVICTED: Entry(
        conditions=(f"{ADMITTED}=False", f"{SUSPENDED}=True", f"{GANG_SCHEDULED}=False"), event="Warning", failure=True,
        meaning="Admitted=False: Kueue evicted the Workload for another reason than preemption (its message kept, "
                "e.g. the ClusterQueue stopped); the pods stop and the phase is Suspended. As a failure: the kubelet "
                "or the Eviction API evicted a pod (node pressure, a drain); the failure policy acts on it.",
        check="Kueue's message on the Workload; for a pod, the node's conditions (memory or disk pressure) and who "
              "drained it.",
        run=(_WORKLOAD, _LAST_FAILURE, _NODES)),
    QUEUE_INVALID: Entry(
        conditions=(f"{ADMITTED}=False", f"{SUSPENDED}=True", f"{GANG_SCHEDULED}=False"), event="Warning",
        meaning="A Kueue label names what cannot admit the job (no such WorkloadPriorityClass for "
                "`kueue.x-k8s.io/priority-class`): no Workload is made and the job stays Pending.",
        check="The label's value against the cluster's WorkloadPriorityClasses.",
        run=("kubectl get workloadpriorityclass", "kubectl -n <ns> get rljob <job> --show-labels")),
    # ---- Stalled ----
    NO_PROGRESS: Entry(
        conditions=(f"{STALLED}=True",),
        meaning="The trainer's reported step has not moved for `spec.failurePolicy.progressDeadlineSeconds` "
                "(three times that before the first step); the message gives the seconds and the limit. A report: a "
                "role that stops making progress is restarted by its liveness probe, which the failure policy sees.",
        check="Trainer 0's log (is it waiting for scored groups?), the generators' and the verifiers' logs, and "
              "their series `kubeforge_rollouts_received_total` and `kubeforge_rollouts_dropped_total` "
              "(docs/metrics.md).",
        run=(_PROGRESS, "kubectl -n <ns> logs <job>-trainer-0", "kubectl -n <ns> logs <job>-generator-0")),
    PROGRESSING: Entry(
        conditions=(f"{STALLED}=False",),
        meaning="The trainer's step moved within the deadline (or the job is not running).",
        check="Nothing."),
    # ---- Complete / Failed ----
    TRAINING_COMPLETE: Entry(
        conditions=(f"{COMPLETE}=True",),
        meaning="Trainer 0 reported done after its final checkpoint; the phase is Succeeded and every role is at 0.",
        check="`status.progress.lastExport` for the exported model.",
        run=(_PROGRESS,)),
    DEADLINE_EXCEEDED: Entry(
        conditions=(f"{FAILED}=True",),
        meaning="The job ran longer than `spec.activeDeadlineSeconds` (counted from `status.startTime`, which a "
                "suspension resets).",
        check="The deadline against the steps asked for and the step rate in `status.progress`.",
        run=(_PROGRESS,)),
    BACKOFF_LIMIT_EXCEEDED: Entry(
        conditions=(f"{FAILED}=True",),
        meaning="A failure would have restarted the job after `spec.failurePolicy.maxRestarts` counted restarts; "
                "the job failed instead. The message names the last failure.",
        check="`status.lastFailure` (role, pod, exit code, reason) and the failed container's log; "
              "`status.roles.<role>.restarts` says which role failed most.",
        run=(_LAST_FAILURE, _LOGS, _DESCRIBE)),
    FAILED_BY_RULE: Entry(
        conditions=(f"{FAILED}=True",),
        meaning="A `spec.failurePolicy.rules` entry with action Fail matched a failure; the message names the rule's "
                "index and the failure.",
        check="The rule, and the failure in `status.lastFailure` with its container's log.",
        run=(_LAST_FAILURE, _LOGS)),
    # ---- ChildrenApplied ----
    APPLY_FAILED: Entry(
        conditions=(f"{CHILDREN_APPLIED}=False",), event="Warning",
        meaning="The API server refused a child object for good (invalid, forbidden, or an API the cluster does not "
                "serve); its message is kept and the pass is retried with backoff. A 404 for the gang backend's API "
                "says which scheduler to install, or to set `spec.gang.backend: None`.",
        check="The message: a PodGroup API not served (install the backend's CRDs and scheduler), RBAC of the "
              "operator's ServiceAccount, an admission policy of the namespace (Pod Security).",
        run=(_DESCRIBE, _OPERATOR_LOG, "kubectl api-resources | grep -i podgroup")),
    # ---- events ----
    CONTAINER_FAILED: Entry(
        event="Warning",
        meaning="A container of the current attempt failed (the message gives the pod, exit code and reason); the "
                "failure policy's decision follows in another event.",
        check="The container's log before its restart; exit code 137 is a SIGKILL (out of memory, or the liveness "
              "probe after no progress), 143 a SIGTERM.",
        run=(_LOGS, _LAST_FAILURE)),
    RESTARTING: Entry(
        event="Warning",
        meaning="A failure restarts the whole job: a new attempt, whose pods start once every pod of the old one is "
                "gone; the trainers resume from the last complete checkpoint. Also the phase-change event when the "
                "phase becomes Restarting (an old attempt's pods drain, after a restart or a rescale).",
        check="The ContainerFailed or NodeLost event before it, and `status.restarts` against "
              "`spec.failurePolicy.maxRestarts`.",
        run=(_DESCRIBE, _LAST_FAILURE)),
    ROLE_RESTARTED: Entry(
        event="Warning",
        meaning="A RestartRole rule matched: only the failed pods come back (the kubelet restarts the container, the "
                "StatefulSet re-creates a lost pod); counted against maxRestarts.",
        check="The failed pod's log; `status.roles.<role>.restarts`.",
        run=(_LOGS,)),
    FAILURE_IGNORED: Entry(
        event="Normal",
        meaning="A failure came back without being counted: an Ignore rule matched, or the pods of a RestartRole "
                "were preempted (a preemption is never counted).",
        check="Nothing, unless it repeats: then the pod's log.",
        run=(_LOGS,)),
    RESCALED: Entry(
        event="Normal",
        meaning="`spec.roles.verifier.replicas` changed: a new attempt starts with the new world, not counted as a "
                "restart. (A generator change needs none: generators are elastic.)",
        check="Nothing."),
    NODE_LOST: Entry(
        event="Warning", failure=True,
        meaning="A node holding pods of the job has not been Ready for the grace "
                "(`--node-loss-grace-seconds`, 60 s by default): its pods count as failures with reason NodeLost "
                "(the failure policy acts: RestartAll by default) and are force-deleted so they can start "
                "elsewhere (docs/node-loss.md). As a failure it is also read from a pod the taint manager deleted "
                "for its node.",
        check="The node named in the message; whether it was only partitioned (its pods may still run there).",
        run=(_NODES, _LAST_FAILURE)),
    POOL_NOT_FOUND: Entry(
        event="Warning",
        meaning="The job names a GeneratorPool (`spec.generatorPool.name`) that does not exist in its namespace: "
                "its roles would have no generator to dial, so it gets no pods (its StatefulSets stay at 0 replicas, "
                "no gang object) until the pool is created; then it starts (docs/generator-pool.md).",
        check="The pool's name and namespace: `kubectl -n <ns> get generatorpools`; create the pool, or fix the name.",
        run=("kubectl -n <ns> get generatorpools", _DESCRIBE)),
    INVALID_SPEC: Entry(
        event="Warning",
        meaning="The stored RLJob does not match the operator's API model: the CRD installed and the operator's "
                "version disagree (the admission webhook, when on, refuses such a spec before it is stored). "
                "Nothing is reconciled for it.",
        check="The operator's log names the field; the CRD against the operator image's version.",
        run=(_OPERATOR_LOG, "kubectl -n <ns> get rljob <job> -o yaml > job.yaml; kubeforge validate job.yaml")),
    # ---- phase changes ----
    PHASE_PENDING: _phase("Normal", "Pending: the gang is not placed yet, or Kueue has not admitted the job.",
                          "The GangScheduled and Admitted conditions."),
    PHASE_STARTING: _phase("Normal", "Starting: the gang is placed, not every role is ready.", "The Ready condition."),
    PHASE_RUNNING: _phase("Normal", "Running: every role has at least its gang minimum ready.",
                          "Nothing; `status.progress` shows the steps."),
    PHASE_SUSPENDED: _phase("Normal", "Suspended: `spec.suspend` is true, or Kueue evicted the job.",
                            "The Suspended condition's reason."),
    PHASE_SUCCEEDED: _phase("Normal", "Succeeded (condition Complete).", "Nothing."),
    PHASE_FAILED: _phase("Warning", "Failed; the message is the Failed condition's.",
                         "The Failed condition's reason (its entry here).", _DESCRIBE),
    # ---- failure reasons the operator reads from pods (rljob.FailureReason; see Preempted, Evicted, NodeLost) ----
    "Error": Entry(
        failure=True,
        meaning="A container exited non-zero (a crash, or a kill: exit code 128 + the signal).",
        check="The container's log before the restart. 137 (SIGKILL) or 143 (SIGTERM) with the kubelet's "
              "`Unhealthy` event on the pod is its liveness probe: no progress within "
              "`spec.failurePolicy.progressDeadlineSeconds`.",
        run=(_LOGS, _LAST_FAILURE, _POD)),
    "OOMKilled": Entry(
        failure=True,
        meaning="The kernel killed a container for exceeding its memory limit.",
        check="`spec.roles.<role>.resources` against the model's size, the batch and, for generators, vLLM's "
              "memory settings.",
        run=(_LAST_FAILURE, "kubectl -n <ns> top pod -l kubeforge.dev/job=<job>")),
    "Unhealthy": Entry(
        failure=True,
        meaning="The local launcher's watchdog killed a process that made no progress within the deadline (`kubeforge "
                "run`). In a cluster the liveness probe's kill reads as Error (see there).",
        check="The process's log in the run directory, and what it was waiting for."),
}
