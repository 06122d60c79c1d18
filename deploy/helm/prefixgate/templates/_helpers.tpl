{{/*
Names, labels and checks shared by every template of the chart.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "prefixgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-qualified name of the gateway's objects (63 characters at most). */}}
{{- define "prefixgate.fullname" -}}
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

{{/* The example engine StatefulSet's name; also its headless Service's and its pods' prefix. */}}
{{- define "prefixgate.vllmName" -}}
{{- printf "%s-vllm" (include "prefixgate.fullname" .) | trunc 50 | trimSuffix "-" }}
{{- end }}

{{- define "prefixgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object of the release carries, besides its name/instance/component labels. */}}
{{- define "prefixgate.commonLabels" -}}
helm.sh/chart: {{ include "prefixgate.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The gateway pods' selector. */}}
{{- define "prefixgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prefixgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gateway
{{- end }}

{{/* The example engine pods' selector. */}}
{{- define "prefixgate.vllmSelectorLabels" -}}
app.kubernetes.io/name: vllm
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: engine
{{- end }}

{{- define "prefixgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "prefixgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The gateway image, tag defaulting to the chart's appVersion; %v, since a tag written as a
number (`--set image.tag=2`) is not a string and %s would print `%!s(int64=2)`.
*/}}
{{- define "prefixgate.image" -}}
{{- printf "%s:%v" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Seconds from pod deletion to SIGKILL: preStop sleep + drain grace + margin. */}}
{{- define "prefixgate.terminationGrace" -}}
{{- add (int .Values.drain.preStopSleepSeconds) (int .Values.config.shutdown_grace_secs) (int .Values.drain.marginSeconds) }}
{{- end }}

{{/*
A probe from values (dict "probe" P "tls" BOOL): an httpGet probe of the API port speaks HTTPS
when TLS is on (the kubelet does not verify the certificate), unless it names a scheme.
*/}}
{{- define "prefixgate.probe" -}}
{{- $probe := deepCopy .probe }}
{{- if and .tls (hasKey $probe "httpGet") }}
{{- if not (hasKey $probe.httpGet "scheme") }}
{{- $_ := set $probe.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- end }}
{{- toYaml $probe }}
{{- end }}

{{/*
A list of command-line arguments, each a quoted string: the API server refuses a number in
`args`, and Helm reads a YAML number as a float (10000000 would print as 1e+07).
*/}}
{{- define "prefixgate.args" -}}
{{- range . }}
{{- if and (kindIs "float64" .) (eq . (float64 (int64 .))) }}
- {{ int64 . | toString | quote }}
{{- else }}
- {{ toString . | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
A map of label, annotation or nodeSelector values (dict "map" M "field" NAME) with every value
a string: the API server refuses numbers and booleans there, and a values file or `--set`
gives `prometheus.io/scrape: true` or `tier: 1` as a boolean and a number. Whole numbers stay
whole (Helm reads YAML numbers as floats: 10000000 would print as 1e+07); a nested map or list
stops the render naming the field.
*/}}
{{- define "prefixgate.stringMap" -}}
{{- $strings := dict }}
{{- range $key, $value := .map }}
{{- if or (kindIs "map" $value) (kindIs "slice" $value) }}
{{- fail (printf "%s.%s must be a string, not a %s." $.field $key (kindOf $value)) }}
{{- else if and (kindIs "float64" $value) (eq $value (float64 (int64 $value))) }}
{{- $_ := set $strings $key (int64 $value | toString) }}
{{- else if kindIs "invalid" $value }}
{{- $_ := set $strings $key "" }}
{{- else }}
{{- $_ := set $strings $key (toString $value) }}
{{- end }}
{{- end }}
{{- toYaml $strings }}
{{- end }}

{{/*
Settings the chart cannot honour yet, and combinations that cannot work, stop the render
with a message instead of being ignored.
*/}}
{{- define "prefixgate.validate" -}}
{{- if hasKey .Values.discovery "mode" }}
{{- fail "discovery.mode was renamed discovery.kind (static or kubernetes)." }}
{{- end }}
{{- if not (has .Values.discovery.kind (list "static" "kubernetes")) }}
{{- fail (printf "discovery.kind=%q: use static or kubernetes." .Values.discovery.kind) }}
{{- end }}
{{- if eq .Values.discovery.kind "kubernetes" }}
{{- if not (empty .Values.config.backends) }}
{{- fail "discovery.kind=kubernetes cannot be combined with config.backends: the gateway refuses both (one source for the replica set)." }}
{{- end }}
{{- if gt (int .Values.config.embedded.mock_engines) 0 }}
{{- fail "discovery.kind=kubernetes cannot be combined with config.embedded.mock_engines." }}
{{- end }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled=true needs tls.secretName: a Secret holding the certificate chain and key (kubectl create secret tls NAME --cert=server.crt --key=server.key)." }}
{{- end }}
{{- if and (eq .Values.discovery.kind "static") (not .Values.vllm.enabled) (empty .Values.config.backends) (eq (int .Values.config.embedded.mock_engines) 0) }}
{{- fail "prefixgate has no replicas to route to: set config.backends, vllm.enabled=true, config.embedded.mock_engines or discovery.kind=kubernetes." }}
{{- end }}
{{- if and .Values.pdb.enabled (lt (int .Values.replicaCount) 2) }}
{{- fail "pdb.enabled=true with replicaCount < 2 would block every node drain: set replicaCount >= 2 or pdb.enabled=false." }}
{{- end }}
{{- if and .Values.apiKeys.existingSecret (not .Values.apiKeys.secretKey) }}
{{- fail "apiKeys.secretKey must name the key of apiKeys.existingSecret that holds the comma-separated keys." }}
{{- end }}
{{- if and .Values.adminToken.existingSecret (not .Values.adminToken.secretKey) }}
{{- fail "adminToken.secretKey must name the key of adminToken.existingSecret that holds the admin token." }}
{{- end }}
{{- include "prefixgate.validateKvSync" . }}
{{- include "prefixgate.validateExtProc" . }}
{{- end }}

{{/*
The Secret holding the ext_proc port's certificate: extProc.tls.secretName, the chart's own
self-signed one, or nothing (plaintext).
*/}}
{{- define "prefixgate.extProcTlsSecret" -}}
{{- $t := .Values.extProc.tls }}
{{- if $t.secretName }}{{ $t.secretName }}{{ else if $t.selfSigned }}{{ include "prefixgate.fullname" . }}-ext-proc-tls{{ end }}
{{- end }}

{{/* The ext_proc settings that cannot work together stop the render, named. */}}
{{- define "prefixgate.validateExtProc" -}}
{{- $e := .Values.extProc }}
{{- if not (has $e.dialect (list "aibrix" "gie")) }}
{{- fail (printf "extProc.dialect=%q: use aibrix or gie." $e.dialect) }}
{{- end }}
{{- if and $e.tls.secretName $e.tls.selfSigned }}
{{- fail "extProc.tls: give secretName or selfSigned=true, not both." }}
{{- end }}
{{- if and (or $e.envoyGateway.enabled $e.inferencePool.enabled) (not $e.enabled) }}
{{- fail "extProc.envoyGateway and extProc.inferencePool send traffic to prefixgate's ext_proc port: set extProc.enabled=true." }}
{{- end }}
{{- if and $e.envoyGateway.enabled (ne $e.dialect "aibrix") }}
{{- fail "extProc.envoyGateway routes on AIBrix's target-pod header: it needs extProc.dialect=aibrix (an InferencePool is the gie dialect's way)." }}
{{- end }}
{{- if and $e.inferencePool.enabled (ne $e.dialect "gie") }}
{{- fail "extProc.inferencePool needs an endpoint picker: set extProc.dialect=gie." }}
{{- end }}
{{- if and $e.inferencePool.enabled (not (has $e.inferencePool.failureMode (list "FailClose" "FailOpen"))) }}
{{- fail (printf "extProc.inferencePool.failureMode=%q: use FailClose or FailOpen." $e.inferencePool.failureMode) }}
{{- end }}
{{- if and $e.enabled (or (eq (int $e.port) (int .Values.ports.http)) (eq (int $e.port) (int .Values.ports.metrics))) }}
{{- fail (printf "extProc.port=%d is the HTTP or metrics port: give the ext_proc listener its own." (int $e.port)) }}
{{- end }}
{{- end }}

{{/*
The example engines' --kv-events-config JSON: vLLM's ZeroMQ publisher on kvSync.port, and
its replay socket on kvSync.replayPort unless 0. With `--data-parallel-size N` vLLM offsets
both endpoints by the rank, so rank r publishes on port+r and replays on replayPort+r; the
container ports ("prefixgate.kvEventPorts") and the gateway's [kv_sync] are derived from the
same two values.
*/}}
{{- define "prefixgate.kvEventsConfig" -}}
{{- $k := .Values.kvSync }}
{{- $config := dict "enable_kv_cache_events" true "publisher" "zmq" "endpoint" (printf "tcp://*:%d" (int $k.port)) }}
{{- if gt (int $k.replayPort) 0 }}
{{- $_ := set $config "replay_endpoint" (printf "tcp://*:%d" (int $k.replayPort)) }}
{{- end }}
{{- toJson $config }}
{{- end }}

{{/*
Container ports of the example engines' KV-event sockets, one pair per data-parallel rank:
kv-events-R on kvSync.port+R and kv-replay-R on kvSync.replayPort+R (none with port 0).
*/}}
{{- define "prefixgate.kvEventPorts" -}}
{{- $k := .Values.kvSync }}
{{- range $rank := until (int $k.dataParallelSize) }}
- name: {{ printf "kv-events-%d" $rank }}
  containerPort: {{ add (int $k.port) $rank }}
  protocol: TCP
{{- if gt (int $k.replayPort) 0 }}
- name: {{ printf "kv-replay-%d" $rank }}
  containerPort: {{ add (int $k.replayPort) $rank }}
  protocol: TCP
{{- end }}
{{- end }}
{{- end }}

{{/*
kvSync's values, checked as the gateway checks [kv_sync] (gateway/src/kv_sync/config.rs) so
that a release that could not start fails at render time instead of as a crash-looping pod:
dataParallelSize an integer 1-64, every rank's events and replay ports real, and the two port
ranges apart (vLLM offsets both by the rank, so its defaults 5557/5558 collide with 2 ranks).
*/}}
{{- define "prefixgate.validateKvSync" -}}
{{- $k := .Values.kvSync }}
{{- $v := .Values.vllm }}
{{- $n := $k.dataParallelSize }}
{{- $whole := or (kindIs "int" $n) (kindIs "int64" $n) (and (kindIs "float64" $n) (eq $n (float64 (int64 $n)))) }}
{{- if or (not $whole) (lt (int64 $n) 1) (gt (int64 $n) 64) }}
{{- fail (printf "kvSync.dataParallelSize=%v: must be an integer 1-64 (vLLM's --data-parallel-size of every engine)." $n) }}
{{- end }}
{{- $n = int $n }}
{{- if and (gt $n 1) (not $k.enabled) }}
{{- fail (printf "kvSync.dataParallelSize=%d needs kvSync.enabled=true: it says how many data-parallel ranks' KV events the gateway follows (for data-parallel example engines without KV sync, pass --data-parallel-size in vllm.extraArgs)." $n) }}
{{- end }}
{{- if $k.enabled }}
{{- $port := int $k.port }}
{{- $replay := int $k.replayPort }}
{{- if or (lt $port 1) (gt $port 65535) }}
{{- fail (printf "kvSync.port=%v: must be a port (1-65535)." $k.port) }}
{{- end }}
{{- if or (lt $replay 0) (gt $replay 65535) }}
{{- fail (printf "kvSync.replayPort=%v: must be a port (1-65535), or 0 when the engines serve no replay." $k.replayPort) }}
{{- end }}
{{- $lastEvents := sub (add $port $n) 1 }}
{{- $lastReplay := sub (add $replay $n) 1 }}
{{- if gt $lastEvents 65535 }}
{{- fail (printf "kvSync.port=%d: with kvSync.dataParallelSize=%d its ranks would use ports %d-%d, past 65535." $port $n $port $lastEvents) }}
{{- end }}
{{- if and (gt $replay 0) (gt $lastReplay 65535) }}
{{- fail (printf "kvSync.replayPort=%d: with kvSync.dataParallelSize=%d its ranks would use ports %d-%d, past 65535." $replay $n $replay $lastReplay) }}
{{- end }}
{{- if gt $replay 0 }}
{{- $from := max $port $replay }}
{{- $to := min $lastEvents $lastReplay }}
{{- if le $from $to }}
{{- $collide := printf "ports %d-%d are" $from $to }}
{{- if eq $from $to }}
{{- $collide = printf "port %d is" $from }}
{{- end }}
{{- $below := "" }}
{{- if ge (sub $port $n) 1 }}
{{- $below = printf " (or at most %d)" (sub $port $n) }}
{{- end }}
{{- fail (printf "kvSync.replayPort=%d: with kvSync.dataParallelSize=%d, events use ports %d-%d and replay ports %d-%d: %s both (vLLM offsets both by the rank). Set kvSync.replayPort to at least %d%s; the example engines' replay_endpoint follows it." $replay $n $port $lastEvents $replay $lastReplay $collide (add $lastEvents 1) $below) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.enabled $k.enabled (gt $n 1) }}
{{- if $v.mock }}
{{- fail (printf "kvSync.dataParallelSize=%d with vllm.mock=true: mock-engine runs one engine per pod (no data-parallel ranks), so only rank 0 would ever publish. Use kvSync.dataParallelSize=1 with mock engines." $n) }}
{{- end }}
{{- $gpus := dig "limits" "nvidia.com/gpu" (dig "requests" "nvidia.com/gpu" "" (default dict $v.resources)) (default dict $v.resources) }}
{{- if and (ne (toString $gpus) "") (lt (int $gpus) $n) }}
{{- fail (printf "vllm.resources nvidia.com/gpu=%v is fewer than kvSync.dataParallelSize=%d: each data-parallel rank needs its own GPU (ranks x tensor-parallel size per pod)." $gpus $n) }}
{{- end }}
{{- end }}
{{- if and $v.enabled $k.enabled }}
{{- range $v.extraArgs }}
{{- $arg := toString . }}
{{- if or (hasPrefix "--data-parallel-size" $arg) (eq $arg "-dp") (hasPrefix "-dp=" $arg) }}
{{- fail (printf "vllm.extraArgs has %q: with kvSync.enabled=true set kvSync.dataParallelSize instead, so that the engines and the gateway agree on the ranks and their KV-event ports." $arg) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
