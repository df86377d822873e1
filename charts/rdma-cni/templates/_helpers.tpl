{{/* The product's names are fixed, not per release: one rdma-cni per cluster (a node has one CNI
configuration, and the admission policy names the ServiceAccount kube-system/rdma-cni). */}}
{{- define "rdma-cni.labels" -}}
k8s-app: rdma-cni
{{- end }}

{{- define "rdma-cni.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* kubelet's --root-dir without a trailing slash, so that paths join cleanly. */}}
{{- define "rdma-cni.kubeletRoot" -}}
{{ trimSuffix "/" .Values.kubeletRootDir | default "/" }}
{{- end }}

{{/* install.sh's --mode: the cluster network rdma-multus wraps, or nothing under metaPlugin none (one
node runs one meta plugin: with upstream Multus the node gets our plugins and device plugin, no
00-rdma-multus.conflist). */}}
{{- define "rdma-cni.clusterMode" -}}
{{ if eq .Values.metaPlugin "none" }}{{ else }}{{ .Values.clusterNetwork }}{{ end }}
{{- end }}

{{/* Checks the schema cannot say: a Mellanox config.json is a string the schema cannot look into.
A bad pool would stop the device plugin on every node; say it here, before anything is applied.
The device model (rdma_cni/devices/poolconf.py) checks every other field when it loads. */}}
{{- define "rdma-cni.validate" -}}
{{- with .Values.devicePlugin.mellanoxConfig }}
{{- $cfg := fromJson . }}
{{- if hasKey $cfg "Error" }}
{{- fail (printf "devicePlugin.mellanoxConfig: not JSON (%s): give Mellanox's config.json as it is, e.g. --set-file devicePlugin.mellanoxConfig=config.json" $cfg.Error) }}
{{- end }}
{{- if not (kindIs "slice" $cfg.configList) }}
{{- fail "devicePlugin.mellanoxConfig: no configList: Mellanox's config.json is {\"configList\": [{\"resourceName\": ..., \"rdmaHcaMax\": ..., \"selectors\": {...}}]}" }}
{{- end }}
{{- range $i, $entry := $cfg.configList }}
{{- if hasKey $entry "rdmaHcaMax" }}
{{- $max := $entry.rdmaHcaMax }}
{{- if or (not (kindIs "float64" $max)) (lt (float64 $max) 0.0) (ne (float64 $max) (floor $max)) }}
{{- fail (printf "devicePlugin.mellanoxConfig: configList[%d].rdmaHcaMax must be a whole number from 0 (the pool's shares per HCA), got %v" $i $max) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The RDMA mode the running DaemonSet was installed with ("" on a first install, and under
helm template, where lookup sees no cluster). */}}
{{- define "rdma-cni.installedMode" -}}
{{- $ds := lookup "apps/v1" "DaemonSet" .Release.Namespace "rdma-cni" }}
{{- if $ds }}
{{- range $ds.spec.template.spec.initContainers }}
{{- range .env }}
{{- if eq .name "RDMA_MODE" }}{{ .value }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* A switch of rdmaMode moves every pod's devices to another pool: refuse it while any pod holds
an RDMA device (install.sh refuses it on each node too, but only after the rolling update has
stopped that node's old pod). The pods are read with the installing user's rights. */}}
{{- define "rdma-cni.checkModeSwitch" -}}
{{- $was := include "rdma-cni.installedMode" . }}
{{- if and $was (ne $was .Values.rdmaMode) }}
{{- $holders := list }}
{{- range (lookup "v1" "Pod" "" "").items }}
{{- if not (has .status.phase (list "Succeeded" "Failed")) }}
{{- $pod := . }}
{{- range .spec.containers }}
{{- if and .resources .resources.limits (hasKey .resources.limits "tke.cloud.tencent.com/tke-shared-rdma") }}
{{- $holders = append $holders (printf "%s/%s" $pod.metadata.namespace $pod.metadata.name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $holders }}
{{- fail (printf "rdmaMode: %s -> %s refused: pods hold RDMA devices (%s); a switch would move their devices to another pool. Delete those pods first, then upgrade again" $was .Values.rdmaMode (join ", " (uniq $holders))) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The DRA variant's pre-delete check (job.yaml) and its own rights: hooks, created before the
uninstall deletes anything and removed once it has run. */}}
{{- define "rdma-cni.uninstallCheckHook" -}}
helm.sh/hook: pre-delete
helm.sh/hook-weight: "-10"
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded,hook-failed
{{- end }}

{{/* The node policy's values (nodePolicy), as the install.sh options' environment. */}}
{{- define "rdma-cni.policyEnv" -}}
- name: POLICY_BONDS
  value: {{ join "," .Values.nodePolicy.bonds | quote }}
- name: POLICY_NAMESPACE_ISOLATION
  value: {{ .Values.nodePolicy.namespaceIsolation | quote }}
- name: POLICY_GLOBAL_NAMESPACES
  value: {{ join "," .Values.nodePolicy.globalNamespaces | quote }}
- name: POLICY_ALLOWED_TYPES
  value: {{ join "," .Values.nodePolicy.allowedDelegateTypes | quote }}
{{- end -}}

{{- define "rdma-cni.deviceMounts" }}
{{- /* The node files every device front-end container reads (the DRA driver, each device plugin). */}}
            # masters/dataDir/runDir of the node's rdma-macvlan config (one source of truth).
            - name: cni-conf
              mountPath: /etc/cni/net.d
              readOnly: true
            # Which bond addresses are lent to pods (health: "no IPv4 and no pod holds it").
            - name: rdma-state
              mountPath: /var/lib/cni/rdma-macvlan
              readOnly: true
            - name: rdma-conf
              mountPath: /etc/rdma-cni
              readOnly: true
            # Shared mode: which addresses rdma-ipvlan lent to pods.
            - name: rdma-ipvlan-state
              mountPath: /var/lib/cni/rdma-ipvlan
              readOnly: true
            {{- if .mlx }}
            - name: rdma-devices
              mountPath: /k8s-rdma-shared-dev-plugin
              readOnly: true
            {{- else if not .dra }}
            #mellanox# - name: rdma-devices
            #mellanox#   mountPath: /k8s-rdma-shared-dev-plugin
            #mellanox#   readOnly: true
            {{- end }}
            # Whether a holder's pod netns still exists.
            - name: netns
              mountPath: /var/run/netns
              readOnly: true
              mountPropagation: HostToContainer
            # status.json for `cni-tool doctor` and the metrics (<runDir>/device-plugin/), and the GID
            # records (the last host index of a bond lent to a pod).
            - name: rdma-run
              mountPath: /run/rdma-cni
            - name: sys
              mountPath: /sys
              readOnly: true
            # The /dev/infiniband nodes it checks and names (host path = container path = /dev/...);
            # the directory, because it disappears while the RDMA modules are unloaded.
            - name: dev
              mountPath: /dev
              readOnly: true
{{- end }}
