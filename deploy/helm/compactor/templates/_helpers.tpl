{{- define "compactor.fullname" -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{- define "compactor.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "compactor.proxySelectorLabels" -}}
{{ include "compactor.selectorLabels" . }}
app.kubernetes.io/component: proxy
{{- end }}

{{- define "compactor.labels" -}}
{{ include "compactor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "compactor.secretName" -}}
{{- if .Values.existingSecret }}{{ .Values.existingSecret }}{{ else }}{{ include "compactor.fullname" . }}{{ end -}}
{{- end }}
