{{/* The chart's name, overridable with nameOverride. */}}
{{- define "gpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The objects' name: fullnameOverride, else the release name when it already contains the chart's
name (`helm install gpu-exporter ...` gives `gpu-exporter`), else `<release>-<name>`.
*/}}
{{- define "gpu-exporter.fullname" -}}
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

{{- define "gpu-exporter.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* Selector labels: upstream's three (name, instance, component), so a selector written for
dcgm-exporter's chart matches with nameOverride: dcgm-exporter. */}}
{{- define "gpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ include "gpu-exporter.name" . }}
{{- end -}}

{{- define "gpu-exporter.labels" -}}
{{ include "gpu-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "gpu-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpu-exporter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository[:tag][@digest]; the tag defaults to the chart's appVersion. */}}
{{- define "gpu-exporter.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- if .Values.image.tag -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- end -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* "true" when the exporter gets a web config file (TLS and/or basic auth). */}}
{{- define "gpu-exporter.webConfig" -}}
{{- if or .Values.tlsServerConfig.enabled .Values.basicAuth.users -}}true{{- end -}}
{{- end -}}

{{- define "gpu-exporter.tlsSecretName" -}}
{{- if .Values.tlsServerConfig.existingSecret -}}
{{- tpl .Values.tlsServerConfig.existingSecret $ -}}
{{- else -}}
{{- printf "%s-tls" (include "gpu-exporter.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the container runtime's CRI socket is needed (per-container usage, pod UIDs, pod labels). */}}
{{- define "gpu-exporter.needsRuntime" -}}
{{- if and .Values.kubernetes.enabled (or .Values.processUsage.enabled .Values.kubernetes.enablePodUID .Values.kubernetes.enablePodLabels) -}}true{{- end -}}
{{- end -}}

{{/* Where the metrics CSV ConfigMap is mounted. */}}
{{- define "gpu-exporter.metricsConfigDir" -}}/etc/gpu-exporter{{- end -}}

{{/* The ConfigMap upstream's chart creates for customMetrics (a fixed name, key `metrics`). */}}
{{- define "gpu-exporter.upstreamMetricsConfigMap" -}}exporter-metrics-config-map{{- end -}}

{{/* "true" when the values name exporter-metrics-config-map: an extraConfigMapVolumes entry (as
upstream's defaults do) or an argument (-m NAMESPACE:exporter-metrics-config-map). */}}
{{- define "gpu-exporter.upstreamMetricsConfigMapUsed" -}}
{{- $cm := include "gpu-exporter.upstreamMetricsConfigMap" . -}}
{{- $used := false -}}
{{- range .Values.extraConfigMapVolumes -}}
{{- if and .configMap (eq (toString .configMap.name) $cm) -}}{{- $used = true -}}{{- end -}}
{{- end -}}
{{- range .Values.arguments -}}
{{- if contains $cm (toString .) -}}{{- $used = true -}}{{- end -}}
{{- end -}}
{{- if $used -}}true{{- end -}}
{{- end -}}

{{/* "true" when the chart makes RBAC for reading pods (upstream's condition, less DRA, which is
node-local here): kubernetes.rbac.create with pod labels or pod UIDs. */}}
{{- define "gpu-exporter.podRbac" -}}
{{- $k := .Values.kubernetes -}}
{{- if and $k.enabled (dig "rbac" "create" false $k) (or $k.enablePodLabels $k.enablePodUID) -}}true{{- end -}}
{{- end -}}

{{/* The NAMESPACE:NAME of `-m` / `--configmap-data` in the arguments (with or without `=`; the
last one counts) or else of DCGM_EXPORTER_CONFIGMAP_DATA in extraEnv (a flag wins over the
variable, as in the exporter); "" when neither names one (or "none"). */}}
{{- define "gpu-exporter.configMapData" -}}
{{- $out := "" -}}
{{- range .Values.extraEnv -}}
{{- if eq (toString .name) "DCGM_EXPORTER_CONFIGMAP_DATA" -}}{{- $out = toString .value -}}{{- end -}}
{{- end -}}
{{- $args := .Values.arguments | default list -}}
{{- range $i, $a := $args -}}
{{- $a = toString $a -}}
{{- if has $a (list "-m" "--m" "-configmap-data" "--configmap-data") -}}
{{- if lt (add1 $i) (len $args) -}}{{- $out = toString (index $args (add1 $i)) -}}{{- end -}}
{{- else if or (hasPrefix "-m=" $a) (hasPrefix "--m=" $a) (hasPrefix "-configmap-data=" $a) (hasPrefix "--configmap-data=" $a) -}}
{{- $out = index (splitn "=" 2 $a) "_1" -}}
{{- end -}}
{{- end -}}
{{- if and (ne $out "") (ne $out "none") (contains ":" $out) -}}{{ $out }}{{- end -}}
{{- end -}}

{{/* "true" when the chart makes RBAC for the `-m` ConfigMap (as upstream's chart, which grants
get on exporter-metrics-config-map always): kubernetes.rbac.create and a ConfigMap named. */}}
{{- define "gpu-exporter.configMapRbac" -}}
{{- if and (dig "rbac" "create" false .Values.kubernetes) (include "gpu-exporter.configMapData" .) -}}true{{- end -}}
{{- end -}}

{{/* The pod's automountServiceAccountToken. */}}
{{- define "gpu-exporter.automountToken" -}}
{{- if or .Values.serviceAccount.automountServiceAccountToken (include "gpu-exporter.podRbac" .) (include "gpu-exporter.configMapRbac" .) -}}true{{- else -}}false{{- end -}}
{{- end -}}
