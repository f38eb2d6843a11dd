{{/* Names: every object is <release>-gpupool-<component> unless the release is called gpupool. */}}
{{- define "gpupool.fullname" -}}
{{- if contains "gpupool" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-gpupool" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpupool.name" -}}
{{- printf "%s-%s" (include "gpupool.fullname" .root) .component -}}
{{- end -}}

{{/* Labels on every object: `helm uninstall` leaves none of these behind. */}}
{{- define "gpupool.labels" -}}
app.kubernetes.io/name: gpupool
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/component: {{ .component }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "gpupool.selector" -}}
app.kubernetes.io/name: gpupool
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* registry/repository:tag; tag defaults to the chart's appVersion. */}}
{{- define "gpupool.image" -}}
{{- $tag := .image.tag | default .root.Chart.AppVersion -}}
{{- if .root.Values.imageRegistry -}}
{{- printf "%s/%s:%s" .root.Values.imageRegistry .image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "gpupool.podDefaults" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  runAsGroup: 1000
  fsGroup: 1000
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "gpupool.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  capabilities: {drop: [ALL]}
{{- end -}}

{{/* Egress to the Kubernetes API server and DNS (NetworkPolicy rules). */}}
{{- define "gpupool.egressApiAndDns" -}}
- ports:
    - {protocol: UDP, port: 53}
    - {protocol: TCP, port: 53}
- ports:
  {{- range .Values.networkPolicy.apiServerPorts }}
    - {protocol: TCP, port: {{ . }}}
  {{- end }}
  {{- with .Values.networkPolicy.apiServerCIDRs }}
  to:
    {{- range . }}
    - ipBlock: {cidr: {{ . }}}
    {{- end }}
  {{- end }}
{{- end -}}
