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

{{- define "kubeforge.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
The operator's rules on namespaced resources (used by the ClusterRole, or by one Role per watched namespace).
Least privilege for what it does:
- rljobs: watch (kopf), patch (kopf keeps its progress in annotations), delete (ttlSecondsAfterFinished);
  rljobs/status: the typed status, merge-patched once per pass.
- children (incl. the job's NetworkPolicy), applied server-side (create + patch), deleted when a job is
  suspended, restarted or finished.
- pods: watched for readiness and failures; get/patch because the per-job Role the operator creates grants
  exactly these to the job's own pods (RBAC allows granting only what one holds).
- events: one per transition.
- podgroups of each supported gang backend (Coscheduling, Volcano, KAI).
*/}}
{{- define "kubeforge.namespacedRules" -}}
- apiGroups: ["kubeforge.dev"]
  resources: ["rljobs"]
  verbs: ["get", "list", "watch", "patch", "update", "delete"]
- apiGroups: ["kubeforge.dev"]
  resources: ["rljobs/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: ["scheduling.x-k8s.io", "scheduling.volcano.sh", "scheduling.run.ai"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{- define "kubeforge.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicas) 1) }}true{{ end -}}
{{- end -}}
