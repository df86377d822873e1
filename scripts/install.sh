#!/bin/sh
# Install (or remove) rdma-cni on a node: the bundle built by scripts/build, its three command names
# in the CNI bin dir, the tke-rdma-macvlan delegate config and the meta-plugin config of the cluster's
# network mode, and with --rdma-mode the device plugin's config. Needs only a POSIX shell and coreutils: no Python on the node.
#
# usage: install.sh [--bundle DIR] [--cni-bin-dir DIR] [--conf-dir DIR]
#                   [--mode vpc-cni|global-router] [--kubelet-root-dir DIR] [--host-root DIR]
#                   [--rdma-mode exclusive|shared [--shared-link ipvlan|macvlan]]
#                   [--kubeconfig-from-serviceaccount]
#                   [--bonds LIST] [--namespace-isolation true|false] [--global-namespaces LIST]
#                   [--allowed-types LIST] [--node-policy FILE]
#                   [--uninstall [--force]]
#                   [--check [--device-plugin-status FILE] [--wait SECONDS]]
#
#   --bundle DIR        the built bundle (default: this script's dir when it holds one, else
#                       ../dist/rdma-cni next to it)
#   --cni-bin-dir DIR   default /opt/cni/bin
#   --conf-dir DIR      default /etc/cni/net.d
#   --mode MODE         vpc-cni: default network tke-route-eni; global-router: tke-bridge. Installs
#                       CONF_DIR/00-rdma-multus.conflist, which makes rdma-multus the node's network.
#                       Without --mode only the binaries and the delegate config are installed.
#   --kubelet-root-dir  kubelet's --root-dir, written into the meta config (PodResources socket under it;
#                       the device checkpoint stays in /var/lib/kubelet/device-plugins, as in kubelet);
#                       default /var/lib/kubelet
#   --rdma-mode MODE    writes /etc/rdma-cni/device-plugin.yaml, which the DaemonSet's device plugin
#                       reads: exclusive (one device per bond, pods get bonds from rdma-macvlan) or
#                       shared (TKE's shared RDMA NIC: one pool of 1000 virtual devices, every pod gets
#                       every bond and its own address from rdma-ipvlan; also installs the
#                       tke-rdma-ipvlan delegate config). Switching a node's mode refuses while pods
#                       hold bonds or addresses, unless --force. Without it: no device plugin config.
#   --shared-link LINK  shared mode's pod links: ipvlan (default) or macvlan, for kernels without
#                       IPVLAN (the tke-rdma-ipvlan config's "link")
#   --host-root DIR     the node's / as seen from here (a DaemonSet mounts it at /host); every other
#                       path is a node path, and configs refer to node paths
#   --kubeconfig-from-serviceaccount
#                       write CONF_DIR/rdma-multus.d/rdma-multus.kubeconfig from this pod's service
#                       account token (run inside the DaemonSet)
#   --bonds LIST        the node policy's bonds, comma-separated (default: every netdev that backs an
#                       RDMA device). Network configs may only name these.
#   --namespace-isolation true|false
#                       a pod may use NetworkAttachmentDefinitions of its own namespace (and of
#                       --global-namespaces) only (default true)
#   --global-namespaces LIST
#                       namespaces whose NADs every pod may use (default: default)
#   --allowed-types LIST
#                       the only delegate types a NAD may name (default: any but host-device, sriov,
#                       ib-sriov, dpdk and the meta plugins)
#                       These four and the paths above are written to /etc/rdma-cni/node-policy.json,
#                       which every plugin reads: a network config may only narrow it.
#   --node-policy FILE  write the node policy there instead (a node path; the plugins then need
#                       RDMA_CNI_NODE_POLICY=FILE in their environment: a test or demo node)
#   --uninstall         remove what install put there, meta config first; refuses while pods still
#                       hold bonds (their DEL needs the plugin) unless --force
#   --check             change nothing: exit 0 when what install (with the same options) puts there is
#                       in place (the bundle, every plugin link, the policy, the delegate, device plugin
#                       and meta configs, the kubeconfig, the meta config first in CONF_DIR), else say
#                       the first thing missing and exit 1. The DaemonSet's readiness probe: shell
#                       builtins only, ~1 ms of CPU where `cni-tool doctor` took ~300 ms. The doctor stays
#                       the command that says why a node is unwell.
#   --device-plugin-status FILE
#                       with --check: also the device plugin's status file (a node path, e.g.
#                       /run/rdma-cni/device-plugin/status.json) must say every pool is registered
#   --wait SECONDS      with --check: look again every second for up to SECONDS while it fails
#
# Atomic: the bundle is copied to CNI_BIN_DIR/rdma-cni.d/<BUILD_ID>/ under a temporary name and
# renamed; then the links and configs are each replaced by rename(2). A pod start at any moment sees
# the old installation or the new one, never a half-written binary or config. Running it again
# changes nothing.
set -eu

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*" >&2; }

bundle=""
bin_dir=/opt/cni/bin
conf_dir=/etc/cni/net.d
mode=""
rdma_mode=""
rdma_mode_given=0
shared_link=ipvlan
kubelet_root=/var/lib/kubelet
host_root=""
sa_kubeconfig=0
uninstall=0
force=0
names="rdma-macvlan rdma-ipvlan rdma-multus cni-tool rdma-agent"
state_dir=/var/lib/cni/rdma-macvlan
shared_state_dir=/var/lib/cni/rdma-ipvlan  # tke-rdma-ipvlan's dataDir: the pods' addresses
dp_conf=/etc/rdma-cni/device-plugin.yaml   # node path: the DaemonSet's device plugin reads it
node_policy=/etc/rdma-cni/node-policy.json  # node path: every plugin reads it (rdma_cni/node_policy.py)
policy_bonds=""
ns_isolation=true
global_namespaces=default
allowed_types=""
check=0
dp_status=""
wait_s=0

while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) bundle=$2; shift 2 ;;
        --cni-bin-dir) bin_dir=$2; shift 2 ;;
        --conf-dir) conf_dir=$2; shift 2 ;;
        --mode) mode=$2; shift 2 ;;
        --rdma-mode) rdma_mode=$2; rdma_mode_given=1; shift 2 ;;
        --shared-link) shared_link=$2; shift 2 ;;
        --kubelet-root-dir) kubelet_root=$2; shift 2 ;;
        --host-root) host_root=$2; shift 2 ;;
        --kubeconfig-from-serviceaccount) sa_kubeconfig=1; shift ;;
        --uninstall) uninstall=1; shift ;;
        --force) force=1; shift ;;
        --bonds) policy_bonds=$2; shift 2 ;;
        --namespace-isolation) ns_isolation=$2; shift 2 ;;
        --global-namespaces) global_namespaces=$2; shift 2 ;;
        --allowed-types) allowed_types=$2; shift 2 ;;
        --node-policy) node_policy=$2; shift 2 ;;
        --check) check=1; shift ;;
        --device-plugin-status) dp_status=$2; shift 2 ;;
        --wait) wait_s=$2; shift 2 ;;
        -h|--help) sed -n '2,70p' "$0"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

# Paths end up inside JSON and sed expressions: allow only plain absolute paths.
check_path() {
    case "$2" in
        /*) ;;
        *) die "$1 must be an absolute path, got '$2'" ;;
    esac
    case "$2" in
        *[!A-Za-z0-9._/-]*) die "$1 may only contain letters, digits and . _ / -, got '$2'" ;;
    esac
}
check_path --cni-bin-dir "$bin_dir"
check_path --conf-dir "$conf_dir"
check_path --kubelet-root-dir "$kubelet_root"
[ -z "$host_root" ] || check_path --host-root "$host_root"
case "$mode" in
    ""|vpc-cni|global-router) ;;
    *) die "--mode must be vpc-cni (tke-route-eni) or global-router (tke-bridge), got '$mode'" ;;
esac
case "$rdma_mode_given:$rdma_mode" in
    0:|1:exclusive|1:shared) ;;
    *) die "--rdma-mode must be exclusive or shared, got '$rdma_mode'" ;;
esac

case "$shared_link" in
    ipvlan|macvlan) ;;
    *) die "--shared-link must be ipvlan or macvlan (kernels without IPVLAN), got '$shared_link'" ;;
esac
case "$ns_isolation" in
    true|false) ;;
    *) die "--namespace-isolation must be true or false, got '$ns_isolation'" ;;
esac
check_list() { # check_list OPTION VALUE: comma-separated names
    case "$2" in
        *[!A-Za-z0-9._,-]*) die "$1 is a comma-separated list of names (letters, digits, . _ -), got '$2'" ;;
    esac
}
check_path --node-policy "$node_policy"
check_list --bonds "$policy_bonds"
check_list --global-namespaces "$global_namespaces"
check_list --allowed-types "$allowed_types"
[ -z "$dp_status" ] || check_path --device-plugin-status "$dp_status"
case "$wait_s" in
    ""|*[!0-9]*) die "--wait takes whole seconds, got '$wait_s'" ;;
esac

BIN="$host_root$bin_dir"
CONF="$host_root$conf_dir"
LIB="$BIN/rdma-cni.d"
DELEGATE_DIR="$CONF/rdma-multus.d"
META="$CONF/00-rdma-multus.conflist"
SHARED_DELEGATE="$DELEGATE_DIR/tke-rdma-ipvlan.conf"
DP_CONF="$host_root$dp_conf"
POLICY="$host_root$node_policy"

# rename(2) over the target: readers see the old file or the new one.
replace() { # replace SRC_TMP DEST
    mv -fT "$1" "$2"  # -T: never move INTO a dir that DEST (a link to one) names
    sync "$2" 2>/dev/null || true
}

# Write stdin to DEST atomically; unchanged content is left alone (idempotent, no mtime churn).
write_file() { # write_file DEST MODE < content
    tmp="$(dirname "$1")/.$(basename "$1").tmp.$$"
    cat > "$tmp"
    chmod "$2" "$tmp"
    if [ -f "$1" ] && cmp -s "$tmp" "$1"; then
        rm -f "$tmp"
        return 0
    fi
    replace "$tmp" "$1"
    say "wrote $1"
}

link() { # link TARGET NAME: NAME becomes a symlink to TARGET, atomically
    if [ -L "$2" ] && [ "$(readlink "$2")" = "$1" ]; then return 0; fi
    [ -d "$2" ] && [ ! -L "$2" ] && die "$2 is a directory; remove it first"
    tmp="$(dirname "$2")/.$(basename "$2").tmp.$$"
    rm -f "$tmp"
    ln -s "$1" "$tmp"
    replace "$tmp" "$2"
    say "linked $2 -> $1"
}

pinned_attachments() { # pinned_attachments [STATE_DIR]: some pod's record is there
    # local: a caller looping over state dirs names its variable d too, and a global here rewrote it
    # (the refusal then named $host_root twice).
    local dir="$host_root${1:-$state_dir}"
    [ -d "$dir" ] || return 1
    [ -n "$(find "$dir" -name '*.json' -type f 2>/dev/null | head -n 1)" ]
}

do_uninstall() {
    if [ "$force" = 0 ] && pinned_attachments; then
        die "pods still hold bonds (state in $host_root$state_dir): their DEL needs rdma-macvlan to give the IPs back; delete those pods first, or pass --force"
    fi
    if [ "$force" = 0 ] && pinned_attachments "$shared_state_dir"; then
        die "pods still hold addresses (state in $host_root$shared_state_dir): their DEL needs rdma-ipvlan to free them; delete those pods first, or pass --force"
    fi
    # Meta config first, so the runtime stops choosing a network whose plugins are going away.
    for f in "$META" "$SHARED_DELEGATE" "$DELEGATE_DIR/tke-rdma-macvlan.conf" \
        "$DELEGATE_DIR/rdma-multus.kubeconfig" "$DP_CONF" "$POLICY"; do
        if [ -e "$f" ]; then rm -f "$f"; say "removed $f"; fi
    done
    rmdir "$DELEGATE_DIR" "$(dirname "$DP_CONF")" 2>/dev/null || true
    for n in $names; do
        # Only our own links: never remove someone else's plugin of the same name.
        if [ -L "$BIN/$n" ] && case "$(readlink "$BIN/$n")" in rdma-cni.d/*) true ;; *) false ;; esac; then
            rm -f "$BIN/$n"
            say "removed $BIN/$n"
        fi
    done
    if [ -d "$LIB" ]; then rm -rf "$LIB"; say "removed $LIB"; fi
    say "uninstalled"
}

find_bundle() {
    here=$(cd "$(dirname "$0")" && pwd)
    if [ -n "$bundle" ]; then :
    elif [ -x "$here/rdma-cni" ]; then bundle=$here
    else bundle="$here/../dist/rdma-cni"
    fi
    [ -x "$bundle/rdma-cni" ] && [ -f "$bundle/BUILD_ID" ] ||
        die "no bundle at $bundle (expected rdma-cni and BUILD_ID): run scripts/build first or pass --bundle"
    bundle=$(cd "$bundle" && pwd)
}

install_bundle() {
    build_id=$(cat "$bundle/BUILD_ID")
    case "$build_id" in *[!A-Za-z0-9._-]*|"") die "bad BUILD_ID '$build_id' in $bundle" ;; esac
    mkdir -p "$LIB"
    if [ ! -x "$LIB/$build_id/rdma-cni" ]; then
        tmp="$LIB/.tmp-$build_id.$$"
        rm -rf "$tmp"
        cp -a "$bundle/." "$tmp/"
        sync -f "$tmp" 2>/dev/null || sync
        rm -rf "$LIB/$build_id"
        mv "$tmp" "$LIB/$build_id"
        say "copied bundle $build_id to $LIB/$build_id"
    fi
    previous=""
    [ -L "$LIB/current" ] && previous=$(readlink "$LIB/current")
    link "$build_id" "$LIB/current"
    for n in $names; do
        [ -e "$LIB/current/$n" ] && link "rdma-cni.d/current/$n" "$BIN/$n"
    done
    # Keep the version just replaced: a plugin exec'd a moment ago may still be loading from it.
    for d in "$LIB"/*; do
        [ -d "$d" ] || continue
        v=$(basename "$d")
        if [ "$v" != "$build_id" ] && [ "$v" != "$previous" ] && [ "$v" != current ]; then
            rm -rf "$d"
            say "removed old bundle $v"
        fi
    done
    rm -rf "$LIB"/.tmp-* 2>/dev/null || true
}

render_meta() { # render_meta SRC: node paths substituted into the shipped config
    sed -e "s|\"/etc/cni/net.d/rdma-multus.d|\"$conf_dir/rdma-multus.d|g" \
        -e "s|\"kubeletRootDir\": \"/var/lib/kubelet\"|\"kubeletRootDir\": \"$kubelet_root\"|" "$1"
}

write_kubeconfig() {
    sa=${RDMA_CNI_SERVICEACCOUNT_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}  # override: tests only
    [ -r "$sa/token" ] && [ -r "$sa/ca.crt" ] || die "no service account token in $sa (only inside the DaemonSet)"
    [ -n "${KUBERNETES_SERVICE_HOST:-}" ] || die "KUBERNETES_SERVICE_HOST is not set"
    host=$KUBERNETES_SERVICE_HOST
    case "$host" in *:*) host="[$host]" ;; esac
    ca=$(base64 -w0 < "$sa/ca.crt")
    token=$(cat "$sa/token")
    write_file "$DELEGATE_DIR/rdma-multus.kubeconfig" 600 <<EOF
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://$host:${KUBERNETES_SERVICE_PORT:-443}
    certificate-authority-data: $ca
users:
- name: rdma-multus
  user:
    token: $token
contexts:
- name: rdma-multus
  context:
    cluster: local
    user: rdma-multus
current-context: rdma-multus
EOF
}

# The node's RDMA mode as installed: the device plugin config's `mode:` line; none without one.
installed_rdma_mode() {
    [ -f "$DP_CONF" ] || return 0
    sed -n 's/^mode: *\([a-z]*\).*/\1/p' "$DP_CONF" | head -n 1
}

# A mode switch moves every pod's devices to another pool (and shared pods' addresses to a plugin
# whose delegate config goes away): refuse it while any pod holds a bond or an address.
check_rdma_mode_switch() {
    [ -n "$rdma_mode" ] || return 0
    was=$(installed_rdma_mode)
    [ -n "$was" ] && [ "$was" != "$rdma_mode" ] || return 0
    [ "$force" = 1 ] && { say "switching the RDMA mode from $was to $rdma_mode (--force)"; return 0; }
    for d in "$state_dir" "$shared_state_dir"; do
        pinned_attachments "$d" &&
            die "--rdma-mode $rdma_mode: this node runs $was mode and pods still hold bonds or addresses (state in $host_root$d); delete those pods first, or pass --force"
    done
    say "switching the RDMA mode from $was to $rdma_mode"
}

json_list() { # json_list a,b -> ["a", "b"]; "" -> the second argument (null or [])
    [ -n "$1" ] || { echo "$2"; return 0; }
    echo "[\"$(echo "$1" | sed 's/,/", "/g')\"]"
}

# The node's policy (rdma_cni/node_policy.py): what no network config may widen. Written before the
# configs, so a config is never read under an older policy than the one it was written for.
write_node_policy() {
    mkdir -p "$(dirname "$POLICY")"
    write_file "$POLICY" 644 <<EOF
{
  "trust": "node",
  "bonds": $(json_list "$policy_bonds" null),
  "bondsFrom": "kubelet",
  "rdmaRequired": true,
  "netnsMode": "shared",
  "ipamTypes": [],
  "resources": ["tke.cloud.tencent.com/tke-shared-rdma"],
  "paths": {
    "rdma-macvlan": {"kubeletRootDir": "$kubelet_root"},
    "rdma-ipvlan": {"link": "$shared_link"},
    "rdma-multus": {
      "confDir": "$conf_dir/rdma-multus.d",
      "kubeconfig": "$conf_dir/rdma-multus.d/rdma-multus.kubeconfig",
      "kubeletRootDir": "$kubelet_root"
    }
  },
  "networks": {
    "namespaceIsolation": $ns_isolation,
    "globalNamespaces": $(json_list "$global_namespaces" "[]"),
    "allowedTypes": $(json_list "$allowed_types" null)
  }
}
EOF
}

# The device plugin's pools and the delegate config it follows (masters, dataDir, runDir).
write_device_plugin_conf() {
    mkdir -p "$(dirname "$DP_CONF")"
    if [ "$rdma_mode" = shared ]; then
        write_file "$DP_CONF" 644 <<EOF
# Written by install.sh --rdma-mode shared: one pool of 1000 virtual devices, every pod gets every bond.
mode: shared
sharedCount: 1000
cniConf: $conf_dir/rdma-multus.d/tke-rdma-ipvlan.conf
EOF
    else
        write_file "$DP_CONF" 644 <<EOF
# Written by install.sh --rdma-mode exclusive: one device per bond, handed to one pod at a time.
mode: exclusive
cniConf: $conf_dir/rdma-multus.d/tke-rdma-macvlan.conf
EOF
    fi
}

install_configs() {
    src="$bundle/conf"
    [ -d "$src" ] || die "no conf/ in bundle $bundle"
    if [ "$rdma_mode" = shared ]; then
        [ -f "$src/shared-mode/rdma-multus.d/tke-rdma-ipvlan.conf" ] ||
            die "--rdma-mode shared: no conf/shared-mode/rdma-multus.d/tke-rdma-ipvlan.conf in bundle $bundle"
    fi
    mkdir -p "$DELEGATE_DIR"
    write_node_policy
    # Delegates first, meta config last: the runtime never picks a network whose parts are missing.
    # The device plugin config after the delegate it names, before the old mode's delegate goes.
    write_file "$DELEGATE_DIR/tke-rdma-macvlan.conf" 644 < "$src/vpc-cni/rdma-multus.d/tke-rdma-macvlan.conf"
    if [ "$rdma_mode" = shared ]; then
        sed "s/\"link\": \"ipvlan\"/\"link\": \"$shared_link\"/" \
            "$src/shared-mode/rdma-multus.d/tke-rdma-ipvlan.conf" | write_file "$SHARED_DELEGATE" 644
    fi
    [ -z "$rdma_mode" ] || write_device_plugin_conf
    if [ "$rdma_mode" = exclusive ] && [ -e "$SHARED_DELEGATE" ]; then
        rm -f "$SHARED_DELEGATE"
        say "removed $SHARED_DELEGATE (exclusive mode)"
    fi
    if [ "$sa_kubeconfig" = 1 ]; then write_kubeconfig; fi
    if [ -n "$mode" ]; then
        render_meta "$src/$mode/00-rdma-multus.conflist" | write_file "$META" 644
        first=$(cd "$CONF" && ls -1 | grep -E '\.(conf|conflist|json)$' | LC_ALL=C sort | head -n 1)
        [ "$first" = "00-rdma-multus.conflist" ] ||
            say "WARNING: the runtime uses the first config in $conf_dir, which is $first, not 00-rdma-multus.conflist"
    else
        say "no --mode: binaries and the delegate config only; the node's default network is unchanged"
    fi
}

# --check: each test is a builtin (no process per file), and the first failure is the answer.
missing() { echo "install.sh --check: $*" >&2; return 1; }
check_file() { [ -s "$1" ] || missing "$1 is missing or empty: $2"; }
check_installed() {
    [ -x "$LIB/current/rdma-cni" ] || missing "no bundle at $LIB/current: the installer has not run" || return 1
    for n in $names; do
        [ -e "$LIB/current/$n" ] || continue
        { [ -L "$BIN/$n" ] && [ -x "$BIN/$n" ]; } ||
            missing "$BIN/$n is not a link to the installed bundle" || return 1
    done
    check_file "$POLICY" "the node policy every plugin reads" || return 1
    check_file "$DELEGATE_DIR/tke-rdma-macvlan.conf" "tke-rdma-macvlan's delegate config" || return 1
    if [ "$rdma_mode" = shared ]; then
        check_file "$SHARED_DELEGATE" "shared mode's delegate config" || return 1
    fi
    if [ -n "$rdma_mode" ]; then check_file "$DP_CONF" "the device plugin's config" || return 1; fi
    if [ "$sa_kubeconfig" = 1 ]; then
        check_file "$DELEGATE_DIR/rdma-multus.kubeconfig" "rdma-multus's kubeconfig" || return 1
    fi
    if [ -n "$mode" ]; then
        check_file "$META" "the meta plugin's config (the node's network)" || return 1
        for f in "$CONF"/*; do  # sorted as the runtime sorts: it takes the first config by name
            case "$f" in *.conf|*.conflist|*.json) ;; *) continue ;; esac
            [ "$f" = "$META" ] ||
                missing "the runtime uses ${f##*/} in $conf_dir before 00-rdma-multus.conflist" || return 1
            break
        done
    fi
    [ -z "$dp_status" ] || check_device_plugin
}
check_device_plugin() { # every pool of the status file registered (rdma_cni/deviceplugin/status.py)
    status="$host_root$dp_status"
    [ -s "$status" ] || missing "$status is missing: the device plugin has not started" || return 1
    registered=0
    while IFS= read -r line || [ -n "$line" ]; do
        case "$line" in
            *'"registered":false'*) registered=0; break ;;
            *'"registered":true'*) registered=1 ;;
        esac
    done < "$status"
    [ "$registered" = 1 ] || missing "the device plugin is not registered with kubelet ($status)"
}
do_check() {
    left=$wait_s
    until check_installed; do
        [ "$left" -gt 0 ] || exit 1
        left=$((left - 1))
        sleep 1
    done
    exit 0
}

if [ "$uninstall" = 1 ]; then
    do_uninstall
    exit 0
fi
[ "$check" = 0 ] || do_check
find_bundle
check_rdma_mode_switch
mkdir -p "$BIN" "$CONF"
install_bundle
install_configs
say "installed $(cat "$bundle/BUILD_ID") into $bin_dir${mode:+ (mode $mode)}${rdma_mode:+ (RDMA mode $rdma_mode)}"
