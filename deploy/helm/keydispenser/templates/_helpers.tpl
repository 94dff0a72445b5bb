{{/* Names, labels and the wiring every process shares. */}}

{{- define "keydispenser.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "keydispenser.fullname" -}}
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

{{- define "keydispenser.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "keydispenser.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: keydispenser
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selects one process's pods: (dict "root" $ "tier" "keygen"). `tier` is also what
the ServiceMonitor copies onto every series (the stalled-loop alerts use it). */}}
{{- define "keydispenser.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keydispenser.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .tier }}
{{ include "keydispenser.tierLabels" . }}
{{- end }}
{{- end -}}

{{- define "keydispenser.tierLabels" -}}
app.kubernetes.io/component: {{ . }}
tier: {{ . }}
{{- end -}}

{{- define "keydispenser.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "keydispenser.configName" -}}
{{- printf "%s-config" (include "keydispenser.fullname" .) -}}
{{- end -}}

{{/* The Secrets: the one named by existingSecret, else the one the chart creates from
the value given; neither is an error (the chart never creates an empty Secret). */}}
{{- define "keydispenser.permutationSecret" -}}
{{- $s := .Values.secrets.permutationKey -}}
{{- if $s.existingSecret -}}{{ $s.existingSecret }}
{{- else if $s.value -}}{{ printf "%s-permutation" (include "keydispenser.fullname" .) }}
{{- else -}}{{ fail "secrets.permutationKey: set existingSecret (a Secret you created, key KD_PERMUTATION_KEY) or value" }}
{{- end -}}
{{- end -}}

{{- define "keydispenser.postgresSecret" -}}
{{- $s := .Values.secrets.postgres -}}
{{- if $s.existingSecret -}}{{ $s.existingSecret }}
{{- else -}}
{{- range $process := list "migrate" "keygen" "keysync" "dispenser" -}}
{{- if not (index $s.dsn $process) -}}
{{- fail (printf "secrets.postgres: set existingSecret (a Secret with one DSN per process) or dsn.%s (each process its own role: deploy/postgres/roles.sql)" $process) -}}
{{- end -}}
{{- end -}}
{{- printf "%s-postgres" (include "keydispenser.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Bitnami's naming of a dependency's objects: (dict "root" $ "chart" "redis"). */}}
{{- define "keydispenser.dependencyFullname" -}}
{{- $values := index .root.Values .chart -}}
{{- if $values.fullnameOverride -}}{{ $values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else -}}
{{- $name := default .chart $values.nameOverride -}}
{{- if contains $name .root.Release.Name -}}{{ .root.Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .root.Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* keydispenser.yaml: `config`, plus the dependency's addresses when one is on and
the configuration names no other. */}}
{{- define "keydispenser.config" -}}
{{- $config := deepCopy .Values.config -}}
{{- if not $config.id_types -}}
{{- fail "config.id_types: name at least one ID type (deploy/README.md has an example)" -}}
{{- end -}}
{{- $cluster := index .Values "redis-cluster" -}}
{{- if and .Values.redis.enabled $cluster.enabled -}}
{{- fail "redis.enabled and redis-cluster.enabled: choose one" -}}
{{- end -}}
{{- if and .Values.redis.enabled (not (hasKey $config "redis_sentinel")) -}}
{{- $name := include "keydispenser.dependencyFullname" (dict "root" . "chart" "redis") -}}
{{- $sentinels := list -}}
{{- range $i := until (int .Values.redis.replica.replicaCount) -}}
{{- $sentinels = append $sentinels (printf "%s-node-%d.%s-headless:26379" $name $i $name) -}}
{{- end -}}
{{- $_ := set $config "redis_sentinel" (dict "sentinels" $sentinels "master_name" .Values.redis.sentinel.masterSet) -}}
{{- $_ := unset $config "redis_url" -}}
{{- end -}}
{{- if and $cluster.enabled (not (hasKey $config "redis_cluster")) -}}
{{- $name := include "keydispenser.dependencyFullname" (dict "root" . "chart" "redis-cluster") -}}
{{- $nodes := list -}}
{{- range $i := until (int $cluster.cluster.nodes) -}}
{{- $nodes = append $nodes (printf "%s-%d.%s-headless:6379" $name $i $name) -}}
{{- end -}}
{{- $_ := set $config "redis_cluster" (dict "nodes" $nodes "slot_per" "type") -}}
{{- $_ := unset $config "redis_url" -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Where the Redis password comes from: the Secret named in secrets.redis, else the
enabled dependency's own. (dict "secret" ... "passwordKey" ... "sentinelPasswordKey" ...) */}}
{{- define "keydispenser.redisAuth" -}}
{{- $s := .Values.secrets.redis -}}
{{- $cluster := index .Values "redis-cluster" -}}
{{- if $s.existingSecret -}}
{{- toYaml (dict "secret" $s.existingSecret "urlKey" $s.urlKey "passwordKey" $s.passwordKey "sentinelPasswordKey" $s.sentinelPasswordKey "userKeys" ($s.userKeys | default dict)) -}}
{{- else if and .Values.redis.enabled .Values.redis.auth.enabled -}}
{{- $sentinelKey := ternary "redis-password" "" (and .Values.redis.sentinel.enabled .Values.redis.auth.sentinel) -}}
{{- $secret := default (include "keydispenser.dependencyFullname" (dict "root" . "chart" "redis")) .Values.redis.auth.existingSecret -}}
{{- toYaml (dict "secret" $secret "urlKey" "" "passwordKey" (default "redis-password" .Values.redis.auth.existingSecretPasswordKey) "sentinelPasswordKey" $sentinelKey) -}}
{{- else if $cluster.enabled -}}
{{- toYaml (dict "secret" (include "keydispenser.dependencyFullname" (dict "root" . "chart" "redis-cluster")) "urlKey" "" "passwordKey" "redis-password" "sentinelPasswordKey" "") -}}
{{- else -}}
{{- toYaml (dict "secret" "") -}}
{{- end -}}
{{- end -}}

{{/* The environment of one process: (dict "root" $ "process" "keygen"). Each Secret
reaches only the processes that use it: the permutation key migrate and keygen; the
PostgreSQL DSN each process its own role's; Redis credentials the three that talk to
Redis (migrate does not); API keys the dispenser. */}}
{{- define "keydispenser.env" -}}
{{- $root := .root -}}
{{- $p := .process -}}
- name: KD_CONFIG
  value: /etc/keydispenser/keydispenser.yaml
- name: KD_POSTGRES_DSN
  valueFrom:
    secretKeyRef:
      name: {{ include "keydispenser.postgresSecret" $root }}
      key: {{ index $root.Values.secrets.postgres.keys $p }}
{{- if has $p (list "migrate" "keygen") }}
- name: KD_PERMUTATION_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "keydispenser.permutationSecret" $root }}
      key: {{ $root.Values.secrets.permutationKey.key }}
{{- end }}
{{- if ne $p "migrate" }}
{{- $auth := include "keydispenser.redisAuth" $root | fromYaml -}}
{{- if $auth.secret }}
{{- $config := include "keydispenser.config" $root | fromYaml -}}
{{- $mode := "" -}}
{{- if hasKey $config "redis_sentinel" -}}{{- $mode = "REDIS_SENTINEL" -}}
{{- else if hasKey $config "redis_cluster" -}}{{- $mode = "REDIS_CLUSTER" -}}
{{- end -}}
{{- /* A Redis ACL user of its own (secrets.redis.userKeys): its URL, or its password
     as <redis_namespace>-<process>; else the shared urlKey / passwordKey. */ -}}
{{- $own := index ($auth.userKeys | default dict) $p -}}
{{- $urlKey := ternary $own $auth.urlKey (and (eq $mode "") (not (empty $own))) -}}
{{- $passwordKey := ternary $own $auth.passwordKey (and (ne $mode "") (not (empty $own))) -}}
{{- if $urlKey }}
- name: KD_REDIS_URL
  valueFrom:
    secretKeyRef: {name: {{ $auth.secret }}, key: {{ $urlKey }}}
{{- end }}
{{- if and (not $mode) $auth.passwordKey -}}
{{- fail "secrets.redis.passwordKey: for redis_sentinel or redis_cluster; with redis_url, give the whole URL (urlKey)" -}}
{{- end -}}
{{- if and $mode $own }}
- name: KD_{{ $mode }}__USERNAME
  value: {{ printf "%s-%s" (default "kd" $config.redis_namespace) $p | quote }}
{{- end }}
{{- if and $mode $passwordKey }}
- name: KD_{{ $mode }}__PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $auth.secret }}, key: {{ $passwordKey }}}
{{- end }}
{{- if and (eq $mode "REDIS_SENTINEL") $auth.sentinelPasswordKey }}
- name: KD_REDIS_SENTINEL__SENTINEL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ $auth.secret }}, key: {{ $auth.sentinelPasswordKey }}}
{{- end }}
{{- end }}
{{- end }}
{{- if and (eq $p "dispenser") $root.Values.secrets.apiKeys.existingSecret }}
- name: KD_DISPENSER__AUTH__API_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ $root.Values.secrets.apiKeys.existingSecret }}
      key: {{ $root.Values.secrets.apiKeys.key }}
{{- end }}
{{- if has $p (list "keygen" "keysync") }}
# Prometheus and the probes: /healthz (the loop beat within two minutes), /readyz
# (its last iteration reached its stores), /metrics.
- name: KD_{{ upper $p }}__METRICS_HOST
  value: 0.0.0.0
- name: KD_{{ upper $p }}__METRICS_PORT
  value: {{ (index $root.Values $p).metricsPort | quote }}
{{- end }}
{{- if eq $p "dispenser" }}
# The port the Service and the probes use (the environment wins over config).
- name: KD_DISPENSER__HOST
  value: 0.0.0.0
- name: KD_DISPENSER__PORT
  value: {{ $root.Values.dispenser.containerPort | quote }}
{{- end }}
{{- with (index $root.Values $p).extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The pod spec every process shares: (dict "root" $ "process" "keygen" "container" <yaml>). */}}
{{- define "keydispenser.podSpec" -}}
{{- $root := .root -}}
automountServiceAccountToken: false
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: {{ .process }}
    image: {{ include "keydispenser.image" $root }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    args: [{{ .process | quote }}]
    env:
      {{- include "keydispenser.env" (dict "root" $root "process" .process) | nindent 6 }}
    {{- with .container }}
    {{- . | nindent 4 }}
    {{- end }}
    resources:
      {{- toYaml (index $root.Values .process).resources | nindent 6 }}
    securityContext:
      {{- toYaml $root.Values.containerSecurityContext | nindent 6 }}
    volumeMounts:
      - {name: config, mountPath: /etc/keydispenser, readOnly: true}
      - {name: tmp, mountPath: /tmp}
volumes:
  - name: config
    configMap:
      name: {{ .configMap | default (include "keydispenser.configName" $root) }}
  - name: tmp
    emptyDir: {sizeLimit: 16Mi}
{{- end -}}
