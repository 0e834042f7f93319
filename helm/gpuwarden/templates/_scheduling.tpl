{{/* Names and pieces of live scheduling (scheduler-*.yaml) and the portal (portal.yaml), shared
with dashboard.yaml so that its additions stay one include each. */}}
{{- define "gpuwarden.scheduler.fullname" -}}
{{- printf "%s-scheduler" (include "gpuwarden.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuwarden.scheduler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuwarden.name" . }}-scheduler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: scheduler
{{- end -}}

{{- define "gpuwarden.scheduler.labels" -}}
{{ include "gpuwarden.commonLabels" . }}
{{ include "gpuwarden.scheduler.selectorLabels" . }}
{{- end -}}

{{/* The Secret holding the webhook's serving pair: cert-manager's Certificate writes it, or the scheduler. */}}
{{- define "gpuwarden.scheduler.webhookSecret" -}}
{{- printf "%s-webhook-cert" (include "gpuwarden.scheduler.fullname" . | trunc 50 | trimSuffix "-") -}}
{{- end -}}

{{- define "gpuwarden.scheduler.url" -}}
{{- printf "http://%s.%s.svc:%d" (include "gpuwarden.scheduler.fullname" .) .Release.Namespace (int .Values.scheduling.port) -}}
{{- end -}}

{{- define "gpuwarden.portal.labels" -}}
{{ include "gpuwarden.labels" . }}
app.kubernetes.io/name: {{ include "gpuwarden.name" . }}-portal
app.kubernetes.io/component: portal
{{- end -}}

{{/* The dashboard's API identity: its own service account while the portal creates Jobs, else none. */}}
{{- define "gpuwarden.dashboard.podIdentity" -}}
{{- if .Values.portal.teams -}}
serviceAccountName: {{ include "gpuwarden.dashboard.fullname" . }}
automountServiceAccountToken: true
{{- else -}}
automountServiceAccountToken: false
{{- end -}}
{{- end -}}

{{- define "gpuwarden.dashboard.schedulingEnv" -}}
{{- if .Values.scheduling.enabled }}
# The live queue (Queue page, portal positions) from the scheduler's /queue.
- name: GPUWARDEN_SCHEDULER_URL
  value: {{ include "gpuwarden.scheduler.url" . | quote }}
{{- end }}
{{- if .Values.portal.teams }}
# The teams' request templates (values: portal.teams).
- name: GPUWARDEN_PORTAL_TEMPLATES
  value: /etc/gpuwarden/portal/templates.yaml
{{- end }}
{{- end -}}

{{- define "gpuwarden.dashboard.portalVolumeMounts" -}}
{{- if .Values.portal.teams }}
- name: portal-templates
  mountPath: /etc/gpuwarden/portal
  readOnly: true
{{- end }}
{{- end -}}

{{- define "gpuwarden.dashboard.portalVolumes" -}}
{{- if .Values.portal.teams }}
- name: portal-templates
  configMap:
    name: {{ printf "%s-portal" (include "gpuwarden.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end -}}

{{/* NOTES.txt's lines on live scheduling and the portal. */}}
{{- define "gpuwarden.scheduler.notes" -}}
{{- if .Values.scheduling.enabled }}
Live scheduling: {{ include "gpuwarden.scheduler.fullname" . }} admits GPU pods of namespaces labelled gpuwarden.io/queue=<team>
(they are created behind the gate gpuwarden.io/admission; the webhook's failurePolicy is Ignore). Label a team:
  kubectl label namespace <ns> gpuwarden.io/queue=<team>
The live queue: gpuwarden queue --scheduler-url {{ include "gpuwarden.scheduler.url" . }}
Webhook certificate: {{ if .Values.scheduling.webhook.certManager.enabled }}cert-manager (Certificate {{ include "gpuwarden.scheduler.fullname" . }}-webhook){{ else }}made and rotated by the scheduler in Secret {{ include "gpuwarden.scheduler.webhookSecret" . }} (left behind by helm uninstall){{ end }}.
{{- if .Values.portal.teams }}
Portal: teams {{ keys .Values.portal.teams | sortAlpha | join ", " }} may request GPUs from the dashboard.
{{- if .Values.portal.groups }}
Portal submitters: an identity submits only for the teams its groups map to (portal.groups: {{ len .Values.portal.groups }} mapped groups).
{{- else }}
Portal submitters: any signed-in user may submit for any team; map identity provider groups to teams in portal.groups.
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
