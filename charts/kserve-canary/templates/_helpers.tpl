{{/* Chart name (the app.kubernetes.io/name label; also the job label of the ServiceMonitor);
nameOverride replaces it, as in every chart made by `helm create`. */}}
{{- define "kserve-canary.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: fullnameOverride, else <release>-<name> (just <release> when
it already contains the name). An umbrella chart sets these to keep its objects' names short. */}}
{{- define "kserve-canary.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels never include commonLabels: a selector cannot change after installation. */}}
{{- define "kserve-canary.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kserve-canary.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kserve-canary.labels" -}}
{{ include "kserve-canary.selectorLabels" . }}
app.kubernetes.io/part-of: kserve-canary
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- range $key, $value := .Values.commonLabels }}
{{ $key }}: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{/* Whether the prometheus-operator's kinds can be applied: asked of the cluster (helm install, or
helm template --api-versions monitoring.coreos.com/v1). Without them the objects are left out
instead of failing the whole release with "no matches for kind ServiceMonitor". */}}
{{- define "kserve-canary.monitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- end -}}

{{- define "kserve-canary.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kserve-canary.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kserve-canary.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* namespace -> ConfigMap name of its policies, as JSON (the chart's own and existing ones). */}}
{{- define "kserve-canary.policyConfigMaps" -}}
{{- $found := dict -}}
{{- range $namespace, $files := .Values.policies.files -}}
{{- $_ := set $found $namespace (printf "%s-policies-%s" (include "kserve-canary.fullname" $) $namespace | trunc 253) -}}
{{- end -}}
{{- range $namespace, $name := .Values.policies.existingConfigMaps -}}
{{- $_ := set $found $namespace $name -}}
{{- end -}}
{{- toJson $found -}}
{{- end -}}

{{- define "kserve-canary.notificationsSecret" -}}
{{- default (printf "%s-notifications" (include "kserve-canary.fullname" .)) .Values.notifications.existingSecret -}}
{{- end -}}

{{/* Where the controller reads its policies. */}}
{{- define "kserve-canary.policyDir" -}}
{{- if .Values.gitSync.enabled -}}
{{- trimSuffix "/" (printf "/git/current/%s" (.Values.gitSync.path | trimPrefix "/")) -}}
{{- else -}}
/etc/kserve-canary/policies
{{- end -}}
{{- end -}}

{{/*
The controller's permissions in a governed namespace: exactly the requests its code makes
(tests/deploy/test_rbac.py compares them with a run against the API emulator).
*/}}
{{- define "kserve-canary.controllerRules" -}}
- apiGroups: ["serving.kserve.io"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* git-sync flags shared by the init container and the sidecar. */}}
{{- define "kserve-canary.gitSyncArgs" -}}
- --repo={{ required "gitSync.repo is required when gitSync.enabled" .Values.gitSync.repo }}
- --ref={{ .Values.gitSync.ref }}
- --root=/git
- --link=current
- --depth={{ .Values.gitSync.depth }}
{{- with .Values.gitSync.auth.existingSecret }}
{{- if eq $.Values.gitSync.auth.type "ssh" }}
- --ssh-key-file=/etc/git-secret/ssh
- --ssh-known-hosts-file=/etc/git-secret/known_hosts
{{- else }}
- --password-file=/etc/git-secret/password
{{- end }}
{{- end }}
{{- range .Values.gitSync.extraArgs }}
- {{ . }}
{{- end }}
{{- end -}}

{{- define "kserve-canary.gitSyncContainer" -}}
image: {{ include "kserve-canary.gitSyncImage" .root }}
imagePullPolicy: {{ .root.Values.gitSync.image.pullPolicy }}
args:
  {{- include "kserve-canary.gitSyncArgs" .root | nindent 2 }}
  {{- if .oneTime }}
  - --one-time
  {{- else }}
  - --period={{ .root.Values.gitSync.period }}
  {{- end }}
env:
  # git writes its configuration under $HOME; the root filesystem is read-only.
  - name: HOME
    value: /tmp
  {{- if and .root.Values.gitSync.auth.existingSecret (ne .root.Values.gitSync.auth.type "ssh") }}
  - name: GITSYNC_USERNAME
    valueFrom:
      secretKeyRef: {name: {{ .root.Values.gitSync.auth.existingSecret }}, key: username}
  {{- end }}
resources:
  {{- toYaml .root.Values.gitSync.resources | nindent 2 }}
# git-sync's image has a passwd entry for 65533 (ssh needs one); the files it writes are
# world-readable, so the controller (65532) reads them.
securityContext:
  {{- toYaml (merge (dict "runAsUser" 65533 "runAsGroup" 65533) (deepCopy .root.Values.securityContext)) | nindent 2 }}
volumeMounts:
  - {name: git, mountPath: /git}
  - {name: tmp, mountPath: /tmp}
  {{- if .root.Values.gitSync.auth.existingSecret }}
  - {name: git-secret, mountPath: /etc/git-secret, readOnly: true}
  {{- end }}
{{- end -}}

{{/* git-sync by digest, always (values.yaml says how to find it). */}}
{{- define "kserve-canary.gitSyncImage" -}}
{{- $_ := required "gitSync.repo is required when gitSync.enabled" .Values.gitSync.repo -}}
{{- $digest := required "gitSync.image.digest is required when gitSync.enabled (values.yaml: how to find it)" .Values.gitSync.image.digest -}}
{{- if .Values.gitSync.image.tag -}}
{{- printf "%s:%s@%s" .Values.gitSync.image.repository .Values.gitSync.image.tag $digest -}}
{{- else -}}
{{- printf "%s@%s" .Values.gitSync.image.repository $digest -}}
{{- end -}}
{{- end -}}

{{- define "kserve-canary.leaseName" -}}
{{- default (include "kserve-canary.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}
