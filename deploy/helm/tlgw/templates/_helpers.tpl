{{/* The release's base name: <release>-tlgw, or the release name when it already says tlgw. */}}
{{- define "tlgw.fullname" -}}
{{- if contains "tlgw" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-tlgw" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tlgw.selectorLabels" -}}
app.kubernetes.io/name: tlgw
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end -}}

{{- define "tlgw.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: tlgw
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tlgw.etcdName" -}}
{{- printf "%s-etcd" (include "tlgw.fullname" .) -}}
{{- end -}}

{{- define "tlgw.etcdSelectorLabels" -}}
app.kubernetes.io/name: tlgw
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: etcd
{{- end -}}

{{/* The etcd client endpoints as a TOML array: the in-release StatefulSet's members, or the external ones. */}}
{{- define "tlgw.etcdEndpoints" -}}
{{- $eps := list -}}
{{- if .Values.etcd.enabled -}}
{{- $name := include "tlgw.etcdName" . -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $eps = append $eps (printf "%s-%d.%s.%s.svc.%s:2379" $name $i $name $.Release.Namespace $.Values.clusterDomain) -}}
{{- end -}}
{{- else -}}
{{- $eps = .Values.etcd.externalEndpoints -}}
{{- end -}}
[{{ range $i, $e := $eps }}{{ if $i }}, {{ end }}{{ $e | quote }}{{ end }}]
{{- end -}}

{{- define "tlgw.cluster" -}}
{{- or .Values.etcd.enabled (gt (len .Values.etcd.externalEndpoints) 0) -}}
{{- end -}}

{{/* A TOML array of strings. */}}
{{- define "tlgw.tomlStrings" -}}
[{{ range $i, $s := . }}{{ if $i }}, {{ end }}{{ $s | quote }}{{ end }}]
{{- end -}}

{{/* Checks of values the gateway could only refuse at start-up. */}}
{{- define "tlgw.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (ne (include "tlgw.cluster" .) "true") -}}
{{- fail "replicaCount > 1 needs a shared control plane: set etcd.enabled or etcd.externalEndpoints" -}}
{{- end -}}
{{- if and .Values.etcd.enabled (gt (len .Values.etcd.externalEndpoints) 0) -}}
{{- fail "etcd.enabled and etcd.externalEndpoints are mutually exclusive" -}}
{{- end -}}
{{- if regexMatch "(?m)^\\s*(http_listen|registry_listen|shutdown_grace)\\s*=" .Values.config.gateway -}}
{{- fail "config.gateway must not set http_listen, registry_listen or shutdown_grace: the chart sets them from ports and shutdownGraceSeconds" -}}
{{- end -}}
{{- if regexMatch "(?m)^\\s*\\[(auth|cluster)\\]|^\\s*\\[\\[auth\\.keys\\]\\]" .Values.config.tables -}}
{{- fail "config.tables must not hold [[auth.keys]] or [cluster]: use apiKeys and etcd" -}}
{{- end -}}
{{- if regexMatch "(?m)^\\s*\\[registry\\]" .Values.config.tables -}}
{{- fail "config.tables must not hold [registry]: use registryTokens and registryConfig" -}}
{{- end -}}
{{- if lt (int .Values.shutdownGraceSeconds) 1 -}}
{{- fail "shutdownGraceSeconds must be at least 1" -}}
{{- end -}}
{{- end -}}
