{{/* The release's base name: <release> when it already contains the chart name, else <release>-gpuwarden. */}}
{{- define "gpuwarden.fullname" -}}
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

{{- define "gpuwarden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwarden.exporter.fullname" -}}
{{- printf "%s-exporter" (include "gpuwarden.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwarden.actuator.fullname" -}}
{{- printf "%s-actuator" (include "gpuwarden.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object, less app.kubernetes.io/instance (in the selector labels or gpuwarden.labels). */}}
{{- define "gpuwarden.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: {{ include "gpuwarden.name" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpuwarden.labels" -}}
{{ include "gpuwarden.commonLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The exporter pods' selector; app.kubernetes.io/name matches docs/prometheus.md's scrape config. */}}
{{- define "gpuwarden.exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwarden.name" . }}-exporter
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: exporter
{{- end -}}

{{- define "gpuwarden.exporter.labels" -}}
{{ include "gpuwarden.commonLabels" . }}
{{ include "gpuwarden.exporter.selectorLabels" . }}
{{- end -}}

{{- define "gpuwarden.actuator.labels" -}}
{{ include "gpuwarden.labels" . }}
app.kubernetes.io/name: {{ include "gpuwarden.name" . }}-actuator
app.kubernetes.io/component: actuator
{{- end -}}

{{- define "gpuwarden.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The image's non-root user (Containerfile, scripts/image/install.py). */}}
{{- define "gpuwarden.imageUID" -}}10001{{- end -}}

{{/* The exporter container's securityContext: the values' one, plus who it runs as unless given there:
UID 0 only while pod attribution or pod memory reads root-only host files, else the image's UID. */}}
{{- define "gpuwarden.exporter.securityContext" -}}
{{- $e := .Values.exporter -}}
{{- $uid := int (include "gpuwarden.imageUID" .) -}}
{{- $auto := dict "runAsUser" $uid "runAsGroup" $uid "runAsNonRoot" true -}}
{{- if or $e.podAttribution.enabled $e.podMemory.enabled -}}
{{- $auto = dict "runAsUser" 0 "runAsGroup" 0 "runAsNonRoot" false -}}
{{- end -}}
{{- $context := merge (deepCopy ($e.securityContext | default dict)) $auto -}}
{{- if and $context.runAsNonRoot (eq (int $context.runAsUser) 0) -}}
{{- fail "exporter.securityContext.runAsNonRoot=true: the exporter runs as UID 0 while exporter.podAttribution or exporter.podMemory is enabled (the kubelet socket and host files are root-only); turn both off, or set exporter.securityContext.runAsUser to a UID that can read them" -}}
{{- end -}}
{{- toYaml $context -}}
{{- end -}}

{{- define "gpuwarden.pricing.fullname" -}}
{{- printf "%s-pricing" (include "gpuwarden.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* The environment naming the pricing ConfigMap's files (gpuwarden.analytics.pricing_files). */ -}}
{{- define "gpuwarden.pricing.env" -}}
{{- $p := .Values.pricing -}}
{{- if or $p.priceBook $p.inventory }}
- name: GPUWARDEN_PRICING_SOURCE
  value: {{ printf "ConfigMap %s/%s" .Release.Namespace (include "gpuwarden.pricing.fullname" .) | quote }}
{{- end }}
{{- if $p.priceBook }}
- name: GPUWARDEN_PRICE_BOOK
  value: /etc/gpuwarden/pricing/pricebook.yaml
{{- end }}
{{- if $p.inventory }}
- name: GPUWARDEN_INVENTORY
  value: /etc/gpuwarden/pricing/inventory.yaml
{{- end }}
{{- end -}}

{{- define "gpuwarden.dashboard.fullname" -}}
{{- printf "%s-dashboard" (include "gpuwarden.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwarden.dashboard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwarden.name" . }}-dashboard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: dashboard
{{- end -}}

{{- define "gpuwarden.dashboard.labels" -}}
{{ include "gpuwarden.commonLabels" . }}
{{ include "gpuwarden.dashboard.selectorLabels" . }}
{{- end -}}
