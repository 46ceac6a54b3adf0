{{/* Names: release "shardcache" gives shardcache-hub and shardcache-spoke, as deploy/k8s. */}}
{{- define "shardcache.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shardcache.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "shardcache.hub" -}}{{ include "shardcache.fullname" . | trunc 59 }}-hub{{- end }}
{{- define "shardcache.spoke" -}}{{ include "shardcache.fullname" . | trunc 57 }}-spoke{{- end }}

{{- define "shardcache.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "shardcache.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shardcache
{{- end }}

{{/* Selector labels of one component: (list $ "hub") */}}
{{- define "shardcache.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shardcache.name" (index . 0) }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "shardcache.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}{{ default (include "shardcache.fullname" .) .Values.serviceAccount.name }}
{{- else }}{{ default "default" .Values.serviceAccount.name }}{{ end }}
{{- end }}

{{/* Image of one component: (list $ "hub") */}}
{{- define "shardcache.image" -}}
{{- $v := (index . 0).Values.image }}
{{- printf "%s%s:%s" $v.registry (get $v (index . 1)).repository (default (index . 0).Chart.AppVersion $v.tag) }}
{{- end }}

{{- define "shardcache.scheme" -}}{{ if .Values.tls.enabled }}https{{ else }}http{{ end }}{{- end }}

{{- define "shardcache.hubURL" -}}
{{- default (printf "%s://%s:7070" (include "shardcache.scheme" .) (include "shardcache.hub" .)) .Values.spoke.hubURL }}
{{- end }}

{{/* Secret names of the cert-manager Certificates. */}}
{{- define "shardcache.certSecret" -}}{{ include "shardcache.fullname" (index . 0) }}-{{ index . 1 }}-tls{{- end }}

{{/*
The spoke's --capacity: spoke.capacity, else spoke.capacityPercent of spoke.cache.size
in whole MiB, written in the largest binary unit that divides it (2000Gi at 90% is
1800GiB). Only binary quantities: Kubernetes' 2T is 10^12 bytes, the spoke's 2T is 2 TiB.
*/}}
{{- define "shardcache.capacity" -}}
{{- if .Values.spoke.capacity }}
{{- .Values.spoke.capacity }}
{{- else }}
{{- $size := toString .Values.spoke.cache.size }}
{{- if not (regexMatch "^[0-9]+(Mi|Gi|Ti)$" $size) }}
{{- fail (printf "spoke.cache.size %q: write it in Mi, Gi or Ti to derive --capacity, or set spoke.capacity" $size) }}
{{- end }}
{{- $mib := mul (regexFind "^[0-9]+" $size | int64) (get (dict "Mi" 1 "Gi" 1024 "Ti" 1048576) (regexFind "[A-Za-z]+$" $size)) }}
{{- $cap := div (mul $mib (int64 .Values.spoke.capacityPercent)) 100 }}
{{- if and (gt $cap 0) (eq (mod $cap 1048576) 0) }}{{ div $cap 1048576 }}TiB
{{- else if eq (mod $cap 1024) 0 }}{{ div $cap 1024 }}GiB
{{- else }}{{ $cap }}MiB
{{- end }}
{{- end }}
{{- end }}

{{/*
"true" when a component's server wants a client certificate in every TLS handshake:
TLS with tls.verifyClients (--client-ca) and no token file of its own (with one, a
client may present a certificate or a token, and health needs neither). Its metrics
listener has the same TLS, so its scrapers need a client certificate too. (list $ "hub")
*/}}
{{- define "shardcache.requiresClientCert" -}}
{{- $ := index . 0 }}
{{- $v := $.Values }}
{{- $tokenFile := get (dict "hub" $v.tokens.hubTokenFile "spoke" $v.tokens.spokeTokenFile) (index . 1) }}
{{- if and $v.tls.enabled $v.tls.verifyClients (not (and $v.tokens.secretName $tokenFile)) }}true{{ end }}
{{- end }}

{{/* "true" when an enabled server wants client certificates: the `client` certificate is then mounted or rendered for probes and scrapes. */}}
{{- define "shardcache.clientCertUsed" -}}
{{- if or (and .Values.hub.enabled (include "shardcache.requiresClientCert" (list . "hub"))) (and .Values.spoke.enabled (include "shardcache.requiresClientCert" (list . "spoke"))) }}true{{ end }}
{{- end }}

{{/*
The health probe: the CLI asks grpc.health.v1 (the built-in gRPC probe cannot speak TLS),
with a client certificate where the server requires one: the hub's `client` (mounted for
that), a spoke's own spoke-client. (list $ "hub" PORT)
*/}}
{{- define "shardcache.probes" -}}
{{- $ := index . 0 }}
{{- $component := index . 1 }}
{{- $command := list "shardcache" "--endpoint" (printf "%s://localhost:%d" (include "shardcache.scheme" $) (index . 2)) }}
{{- if $.Values.tls.enabled }}{{ $command = concat $command (list "--ca" "/tls/ca.pem") }}{{ end }}
{{- if include "shardcache.requiresClientCert" (list $ $component) }}
{{- $cert := ternary "client" "spoke-client" (eq $component "hub") }}
{{- $command = concat $command (list "--cert" (printf "/tls/%s.pem" $cert) "--key" (printf "/tls/%s.key" $cert)) }}
{{- end }}
{{- $command = append $command "health" -}}
readinessProbe:
  exec:
    command: {{ toJson $command }}
  periodSeconds: 10
  timeoutSeconds: 5
livenessProbe:
  exec:
    command: {{ toJson $command }}
  initialDelaySeconds: 10
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
{{- end }}

{{/* prometheus.io annotations for a pod serving metrics on PORT: (list $ PORT) */}}
{{- define "shardcache.scrapeAnnotations" -}}
{{- if (index . 0).Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ index . 1 | quote }}
prometheus.io/path: /metrics
prometheus.io/scheme: {{ include "shardcache.scheme" (index . 0) }}
{{- end }}
{{- end }}

{{/*
The TLS volume of one component: only its own keys and the CA certificate, at the paths
deploy/k8s uses, from the one Secret or from cert-manager's; the hub also the `client`
certificate when it requires client certificates (its probes present it). (list $ "hub")
*/}}
{{- define "shardcache.tlsVolume" -}}
{{- $ := index . 0 }}
{{- $component := index . 1 }}
{{- $tls := $.Values.tls }}
{{- $probeClient := and (eq $component "hub") (include "shardcache.requiresClientCert" (list $ "hub")) -}}
- name: tls
  projected:
    defaultMode: 0440
    sources:
    {{- if $tls.certManager.enabled }}
      - secret:
          name: {{ include "shardcache.certSecret" (list $ $component) }}
          items:
            - {key: ca.crt, path: ca.pem}
            - {key: tls.crt, path: {{ $component }}.pem}
            - {key: tls.key, path: {{ $component }}.key}
      {{- if eq $component "spoke" }}
      - secret:
          name: {{ include "shardcache.certSecret" (list $ "spoke-client") }}
          items:
            - {key: tls.crt, path: spoke-client.pem}
            - {key: tls.key, path: spoke-client.key}
      {{- end }}
      {{- if $probeClient }}
      - secret:
          name: {{ include "shardcache.certSecret" (list $ "client") }}
          items:
            - {key: tls.crt, path: client.pem}
            - {key: tls.key, path: client.key}
      {{- end }}
    {{- else }}
      - secret:
          name: {{ $tls.secretName }}
          items:
            - {key: ca.pem, path: ca.pem}
            - {key: {{ $component }}.pem, path: {{ $component }}.pem}
            - {key: {{ $component }}.key, path: {{ $component }}.key}
            {{- if eq $component "spoke" }}
            - {key: spoke-client.pem, path: spoke-client.pem}
            - {key: spoke-client.key, path: spoke-client.key}
            {{- end }}
            {{- if $probeClient }}
            - {key: client.pem, path: client.pem}
            - {key: client.key, path: client.key}
            {{- end }}
    {{- end }}
{{- end }}

{{/* The tokens volume: the keys of tokens.secretName one component reads. (list $ KEYS) */}}
{{- define "shardcache.tokensVolume" -}}
{{- with index . 1 -}}
- name: tokens
  secret:
    secretName: {{ (index $ 0).Values.tokens.secretName }}
    defaultMode: 0440
    items:
    {{- range . }}
      - {key: {{ . }}, path: {{ . }}}
    {{- end }}
{{- end }}
{{- end }}

{{- define "shardcache.checks" -}}
{{- if and .Values.tokens.secretName (not .Values.tls.enabled) }}
{{- fail "tokens.secretName needs tls.enabled: bearer tokens must not cross the network in the clear" }}
{{- end }}
{{- if and .Values.hub.enabled (not (or .Values.hub.source .Values.hub.data.existingClaim .Values.hub.data.hostPath)) }}
{{- fail "the hub needs hub.source (s3://...) or hub.data (a volume)" }}
{{- end }}
{{- if and .Values.hub.source (or .Values.hub.data.existingClaim .Values.hub.data.hostPath) }}
{{- fail "set hub.source (S3) or hub.data (a volume), not both" }}
{{- end }}
{{- if and .Values.spoke.enabled (not .Values.hub.enabled) (not .Values.spoke.hubURL) }}
{{- fail "without hub.enabled the spokes need spoke.hubURL" }}
{{- end }}
{{- end }}
