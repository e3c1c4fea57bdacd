{{/* Names and labels shared by every template. */}}

{{- define "kubeforge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kubeforge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "kubeforge.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "kubeforge.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kubeforge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubeforge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kubeforge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kubeforge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubeforge
{{- end -}}

{{- define "kubeforge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kubeforge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- /* The Secret holding the pool master key the operator mounts: the chart's own, or poolMasterKey.existingSecret. */}}
{{- define "kubeforge.poolMasterKeySecret" -}}
{{- default (printf "%s-pool-master-key" (include "kubeforge.fullname" .)) .Values.poolMasterKey.existingSecret -}}
{{- end -}}

{{- define "kubeforge.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The operator's rules on namespaced resources (used by the ClusterRole, or by one Role per watched namespace).
Least privilege for what it does (every write is a server-side apply or merge PATCH, so no `update` anywhere):
- rljobs: watch (kopf), patch (kopf keeps its progress in annotations), delete (ttlSecondsAfterFinished);
  rljobs/status: the typed status, merge-patched once per pass.
- children (incl. the job's NetworkPolicy), applied server-side (create + patch), deleted when a job is
  suspended, restarted or finished.
- pods: watched for readiness and failures; get/patch because the per-job Role the operator creates grants
  exactly these on the job's own pods by name (trainer rank 0 patches its progress annotation; RBAC lets one grant
  only what one holds). The operator's only pod write is the export request it copies from an RLJob's annotation
  onto that job's trainer 0 pod (one merge patch of an annotation). In cluster-wide mode this is pods patch in every
  namespace: narrowing it needs the `escalate` verb (broader), a `bind` to a fixed ClusterRole (every pod of the
  job's namespace for the job's account) or progress off the pod (docs/install.md, "RBAC").
  delete: the forced delete (grace period 0, UID precondition) of a job's pod whose node was not Ready for
  nodeLossGraceSeconds (docs/node-loss.md); the operator deletes no other pod.
- secrets: create only (the job's key Secret, never read back).
- events: one per transition (core/v1 Events: the operator's and kopf's).
- podgroups of each supported gang backend (Coscheduling, Volcano, KAI).
*/}}
{{- define "kubeforge.namespacedRules" -}}
- apiGroups: ["kubeforge.dev"]
  resources: ["rljobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: ["kubeforge.dev"]
  resources: ["rljobs/status"]
  verbs: ["get", "patch"]
# GeneratorPools (docs/generator-pool.md): watched, read, their finalizer patched; their status written
- apiGroups: ["kubeforge.dev"]
  resources: ["generatorpools"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kubeforge.dev"]
  resources: ["generatorpools/status"]
  verbs: ["get", "patch"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["scheduling.x-k8s.io", "scheduling.volcano.sh", "scheduling.run.ai"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Kueue (an RLJob labelled kueue.x-k8s.io/queue-name): its Workload, the admission written back (eviction, Finished);
# the flavors and priority classes it reads are cluster-scoped (kubeforge.clusterRules)
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}

{{/*
The operator's reads of cluster-scoped resources (a ClusterRole in both modes): kopf's scanning (it lists and
watches namespaces and CRDs, and starts a watch once a resource is served: Kueue's Workloads); the nodes of a job's
not-ready pods, by name (docs/node-loss.md); Kueue's ResourceFlavors (an admitted flavor's node labels and
tolerations) and WorkloadPriorityClasses (the class a job's label names).
*/}}
{{- define "kubeforge.clusterRules" -}}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors", "workloadpriorityclasses"]
  verbs: ["get"]
{{- end -}}

{{- define "kubeforge.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicas) 1) }}true{{ end -}}
{{- end -}}
