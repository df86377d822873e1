"""One Kubernetes node of the test cluster: a network namespace (its bonds, kube-proxy's rules), a
private mount namespace (its own node directories, /sys and /dev), a cgroup subtree, and in it the
simulated RDMA hardware, containerd, kubelet and kube-proxy.

The node's view, inside its mount namespace:

* ``/sys`` is the simulated RDMA node's sysfs tree (:mod:`rdma_cni.sim`: ``mlx5_bond_0..7`` over
  ``bond0..7`` on 2 NUMA nodes, GID tables following the live addresses), with the kernel's own
  ``fs`` (cgroups), ``kernel``, ``devices/system``, ``block``, ``dev`` and ``firmware`` bound into it:
  what the product reads is the simulated hardware, what kubelet, containerd and runc read is real.
* ``/dev`` is a tmpfs with the host's device nodes copied and ``/dev/infiniband`` made by the sim.
* ``/opt/cni/bin``, ``/etc/cni/net.d``, ``/var/lib/kubelet``, ``/run/containerd``, ``/var/run/cdi``,
  ... are directories of this node (:data:`NODE_DIRS`).
* The kernel tunables kubelet insists on (``vm.overcommit_memory=1``, ``kernel.panic=10``, ...) are
  files holding those values bound over ``/proc/sys``: kubelet reads what it wants and writes
  nothing, and the host's sysctls are never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from cluster import topology as topo
from cluster.build import CNI_PLUGINS, RUNC, Binaries
from cluster.numa_tree import build_numa_tree
from cluster.procs import Proc, node_env, spawn, wait_for

WORK = Path(os.environ.get("RDMA_CNI_CLUSTER_WORK", "/var/lib/rdma-cni-cluster"))
RUN = Path("/run/rdma-cni-cluster")
NS_DIR = RUN / "ns"

# node path -> directory name under the node's work dir
NODE_DIRS = {
    "/opt/cni/bin": "opt-cni-bin",
    "/etc/cni/net.d": "etc-cni-net.d",
    "/var/lib/kubelet": "var-lib-kubelet",
    "/var/lib/containerd": "var-lib-containerd",
    "/run/containerd": "run-containerd",
    "/etc/containerd": "etc-containerd",
    "/run/cdi": "run-cdi",
    "/etc/cdi": "etc-cdi",
    "/var/lib/cni": "var-lib-cni",
    "/run/rdma-cni": "run-rdma-cni",
    "/etc/rdma-cni": "etc-rdma-cni",
    "/var/log/pods": "var-log-pods",
    "/var/log/containers": "var-log-containers",
    "/var/log/rdma-cni": "var-log-rdma-cni",
    "/run/netns": "run-netns",
    # device-info files (NPWG: /var/run/k8s.cni.cncf.io/devinfo/{dp,cni}): what the node's device
    # plugin wrote for its own bonds, read and copied there by Multus on that node
    "/run/k8s.cni.cncf.io": "run-k8s.cni.cncf.io",
}
# The real sysfs pieces bound into the simulated tree.
REAL_SYS = ("fs", "kernel", "block", "dev", "firmware", "power", "hypervisor", "devices/system")
# What kubelet's container manager checks (pkg/kubelet/cm: setupKernelTunables), and the value it wants.
KUBELET_TUNABLES = {
    "vm/overcommit_memory": "1",
    "vm/panic_on_oom": "0",
    "kernel/panic": "10",
    "kernel/panic_on_oops": "1",
    "kernel/keys/root_maxkeys": "1000000",
    "kernel/keys/root_maxbytes": "25000000",
}


@dataclass(frozen=True)
class Node:
    n: int

    @property
    def name(self) -> str:
        return topo.node_name(self.n)

    @property
    def netns(self) -> str:
        return topo.node_netns(self.n)

    @property
    def work(self) -> Path:
        return WORK / f"node{self.n}"

    @property
    def mntns(self) -> str:
        return str(NS_DIR / f"node{self.n}")

    @property
    def sys_tree(self) -> Path:
        return self.work / "sys"

    @property
    def cgroup_root(self) -> str:
        return f"/{topo.PREFIX}-node{self.n}"

    def dir(self, node_path: str) -> Path:
        return self.work / NODE_DIRS[node_path]

    def run(self, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A shell script inside the node's mount and network namespaces."""
        proc = subprocess.run(
            ["nsenter", f"--mount={self.mntns}", f"--net=/run/netns/{self.netns}", "--", "sh", "-ec", script],
            capture_output=True,
            text=True,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{self.name}: {script.strip().splitlines()[0]}...: {proc.stderr.strip()[-1500:]}"
            )
        return proc


def ensure_ns_dir() -> None:
    """A private mount of the dir holding the mount-namespace files (unshare --mount=FILE needs it)."""
    NS_DIR.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mountpoint", "-q", str(NS_DIR)], check=False).returncode != 0:
        subprocess.run(["mount", "--bind", str(NS_DIR), str(NS_DIR)], check=True)
        subprocess.run(["mount", "--make-private", str(NS_DIR)], check=True)


def mountpoints_to_make() -> list[str]:
    """Node paths missing on the host: made as empty mount points, and removed by ``down``."""
    return [p for p in NODE_DIRS if not os.path.lexists(p)]


def make_mount_ns(node: Node) -> None:
    ensure_ns_dir()
    Path(node.mntns).touch()
    subprocess.run(["unshare", f"--mount={node.mntns}", "--propagation", "private", "true"], check=True)


def _dirs(node: Node) -> None:
    for name in NODE_DIRS.values():
        (node.work / name).mkdir(parents=True, exist_ok=True)
    # Every reference plugin, as a node that runs Multus has them (network-operator installs the set):
    # the cluster network needs ptp, host-local and loopback; seed 002's NADs need macvlan.
    for src in sorted(Path(CNI_PLUGINS).iterdir()):
        shutil.copy2(src, node.dir("/opt/cni/bin") / src.name)
    (node.work / "tunables").mkdir(exist_ok=True)
    for key, value in KUBELET_TUNABLES.items():
        (node.work / "tunables" / key.replace("/", "_")).write_text(value + "\n")


def mount_node_view(node: Node) -> None:
    """The node directories, /dev and the kubelet tunables, inside the node's mount namespace."""
    _dirs(node)
    binds = "\n".join(f"mount --bind {node.work / d} {p}" for p, d in NODE_DIRS.items())
    tunables = "\n".join(
        f"mount --bind {node.work / 'tunables' / k.replace('/', '_')} /proc/sys/{k}" for k in KUBELET_TUNABLES
    )
    olddev = node.work / "host-dev"
    node.run(f"""
mount --make-rprivate /
{binds}
{tunables}
mkdir -p {olddev}
mount --rbind /dev {olddev}
mount -t tmpfs -o mode=755,nosuid tmpfs /dev
for e in {olddev}/*; do
  b=$(basename "$e")
  if [ -d "$e" ] && [ ! -L "$e" ]; then
    case "$b" in pts|shm|mqueue|hugepages|net) mkdir -p /dev/$b; mount --rbind "$e" /dev/$b ;; esac
  else
    cp -a "$e" /dev/ 2>/dev/null || true
  fi
done
mkdir -p /dev/infiniband
""")


def start_sim(node: Node, log_dir: Path) -> Proc:
    """The simulated RDMA hardware of the node: the sysfs tree and the GID tables that follow the
    bonds' live addresses, the /dev/infiniband nodes; it watches pod namespaces under /run/netns
    (containerd's ``cni-*``)."""
    bonds = ",".join(f"bond{b}:mlx5_bond_{b}" for b in range(topo.BONDS))
    numa = ",".join(str(topo.bond_numa(b)) for b in range(topo.BONDS))
    argv = [
        sys.executable,
        "-m",
        "rdma_cni.sim.daemon",
        "--sysfs-root",
        str(node.sys_tree),
        "--bonds",
        bonds,
        "--numa",
        numa,
        "--layout",
        "mlx5",
        "--mad",
        "--rdma-cm",
        "--dev-root",
        "/dev",
        "--pods-dir",
        "/run/netns",
        "--pods-prefix",
        "cni-",
    ]
    env = dict(node_env(), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = spawn(f"{node.name}/rdma-sim", argv, log_dir / "rdma-sim.log", node.netns, node.mntns, env)
    wait_for(
        "the simulated sysfs tree",
        lambda: (node.sys_tree / "class" / "infiniband" / "mlx5_bond_7").exists(),
        30,
        proc,
    )
    return proc


def mount_sys(node: Node) -> None:
    """The simulated tree as the node's /sys, with the kernel's own pieces bound into it, and 2 NUMA
    nodes (cluster.numa_tree) where kubelet's cadvisor looks for them: the machine has one, the
    simulated bonds sit on two, and the topology manager aligns only over what cadvisor reports."""
    real = node.work / "host-sys"
    numa = build_numa_tree(node.work / "numa", 2)
    mk = "\n".join(f"mkdir -p {node.sys_tree / r}" for r in REAL_SYS)
    binds = "\n".join(f"[ -e {real / r} ] && mount --rbind {real / r} /sys/{r} || true" for r in REAL_SYS)
    node.run(f"""
mkdir -p {real}
mount --rbind /sys {real}
{mk}
mount --bind {node.sys_tree} /sys
{binds}
mount --bind {numa} /sys/devices/system/node
mount --make-rshared /
""")


def make_cgroups(node: Node) -> list[str]:
    """The node's cgroup subtree in every v1 hierarchy (kubelet's cgroupRoot); cpuset needs its
    parent's cpus and mems before a task may join."""
    made = []
    for hier in sorted(Path("/sys/fs/cgroup").iterdir()):
        if not hier.is_dir() or hier.name == "unified" or (hier / "cgroup.procs").exists() is False:
            continue
        d = hier / node.cgroup_root.lstrip("/")
        d.mkdir(exist_ok=True)
        made.append(str(d))
        if hier.name == "cpuset":
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((hier / f).read_text())
    return made


def containerd_config(node: Node, registry: str) -> Path:
    etc = node.dir("/etc/containerd")
    certs = etc / "certs.d"
    for host in ("docker.io", "registry.k8s.io", registry):
        d = certs / host
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(
            f'server = "http://{registry}"\n\n[host."http://{registry}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )
    conf = etc / "config.toml"
    conf.write_text(f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.runtime']
  # no CAP_SYS_RESOURCE here: a sandbox's or a critical pod's negative oom_score_adj could not be
  # set (runc init dies, "can't get final child's PID"); clamp it to containerd's own, as rootless does
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "registry.k8s.io/pause:3.10.1"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "/etc/containerd/certs.d"
""")
    return conf


def start_containerd(node: Node, bins: Binaries, registry: str, log_dir: Path) -> Proc:
    containerd_config(node, registry)
    shim_dir = str(Path(bins.path("containerd-shim-runc-v2")).parent)
    env = dict(node_env(), PATH=f"{shim_dir}:{os.environ['PATH']}")
    proc = spawn(
        f"{node.name}/containerd",
        [bins.path("containerd"), "--config", "/etc/containerd/config.toml"],
        log_dir / "containerd.log",
        node.netns,
        node.mntns,
        env,
    )
    sock = node.dir("/run/containerd") / "containerd.sock"
    wait_for("containerd's socket", sock.exists, 60, proc)
    return proc


def import_images(node: Node, bins: Binaries, archives: list[Path]) -> None:
    """The locally built images into the node's containerd, namespace ``k8s.io`` (kubelet's)."""
    for archive in archives:
        node.run(
            f"{bins.path('ctr')} --address /run/containerd/containerd.sock -n k8s.io images import "
            f"--all-platforms {archive}"
        )


def kubelet_config(node: Node, pki: Path) -> Path:
    conf = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "cgroupsPerQOS": True,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "address": topo.node_ip(node.n),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "topologyManagerPolicy": "best-effort",
        "failSwapOn": False,
        "protectKernelDefaults": False,
        "serializeImagePulls": False,
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": "cluster.local",
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "maxPods": 110,
        "podCIDR": topo.pod_cidr(node.n),
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "localStorageCapacityIsolation": True,
        "kernelMemcgNotification": False,
        "shutdownGracePeriod": "0s",
        # A pod whose start failed (e.g. NodePrepareResources while the DRA driver restarts) is tried
        # again at the next pod sync: every 1 min by default, which was most of the kill -9
        # mid-prepare test (driver back 4 s after the kill, the retry 62 s later). 10 s keeps the
        # retry and cuts the wait; the kubelet's behaviour is otherwise the default.
        "syncFrequency": "10s",
        # A device plugin's count (and a change of it: a bond Unhealthy, a plugin back) reaches the
        # Node object at the kubelet's next status sync: every 10 s by default, 10 s of every `up`
        # (the GPU plugin's capacity) and ~5 s of each of the suite's many waits for a node's offer.
        # 1 s syncs it; the report frequency stays the default 5 min (an update frequency set alone
        # would make it 1 s too: a node status PATCH every second), so a status that did not change
        # is not sent more often than by default.
        "nodeStatusUpdateFrequency": "1s",
        "nodeStatusReportFrequency": "5m",
    }
    # where kubeadm puts it: the doctor reads the topology manager policy there
    path = node.dir("/var/lib/kubelet") / "config.yaml"
    path.write_text(yaml.safe_dump(conf))
    return Path("/var/lib/kubelet/config.yaml")


def start_kubelet(node: Node, bins: Binaries, pki: Path, log_dir: Path) -> Proc:
    conf = kubelet_config(node, pki)
    argv = [
        bins.path("kubelet"),
        f"--config={conf}",
        f"--kubeconfig={pki / f'kubelet-{node.name}.kubeconfig'}",
        f"--hostname-override={node.name}",
        f"--node-ip={topo.node_ip(node.n)}",
        "--root-dir=/var/lib/kubelet",
        "--node-labels=",
        "-v=2",
    ]
    return spawn(f"{node.name}/kubelet", argv, log_dir / "kubelet.log", node.netns, node.mntns)


def start_gpu_plugin(node: Node, log_dir: Path) -> Proc:
    """The stand-in nvidia.com/gpu device plugin (cluster.gpu_plugin): 8 GPUs on the node's NUMA
    nodes and PCIe roots, so kubelet aligns the seed pod's GPUs and bonds."""
    argv = [
        sys.executable,
        "-m",
        "cluster.gpu_plugin",
        "--device-plugin-dir",
        "/var/lib/kubelet/device-plugins",
    ]
    repo = Path(__file__).resolve().parents[2]
    env = dict(node_env(), PYTHONPATH=f"{repo / 'tests'}:{repo}")
    return spawn(f"{node.name}/gpu-plugin", argv, log_dir / "gpu-plugin.log", node.netns, node.mntns, env)


def start_kube_proxy(node: Node, bins: Binaries, pki: Path, log_dir: Path) -> Proc:
    conf = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(pki / "kube-proxy.kubeconfig")},
        "mode": "iptables",
        "hostnameOverride": node.name,
        "clusterCIDR": topo.CLUSTER_CIDR,
        "bindAddress": topo.node_ip(node.n),
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # 0: leave the kernel's conntrack table size and timeouts alone (nf_conntrack_max and the
        # hash size are the host's, not the node netns's)
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }
    path = node.work / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(conf))
    return spawn(
        f"{node.name}/kube-proxy",
        [bins.path("kube-proxy"), f"--config={path}", "-v=1"],
        log_dir / "kube-proxy.log",
        node.netns,
        node.mntns,
    )


def cluster_network_config(node: Node) -> None:
    """TKE's cluster network (tke-route-eni), played by the reference ptp plugin with the node's pod
    range: what TKE's own CNI agent lays into rdma-multus.d on a real node."""
    d = node.dir("/etc/cni/net.d") / "rdma-multus.d"
    d.mkdir(parents=True, exist_ok=True)
    conf = {
        "cniVersion": "1.0.0",
        "name": "tke-route-eni",
        "type": "ptp",
        "mtu": 1500,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": topo.pod_cidr(node.n)}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "/var/lib/cni/networks",
        },
    }
    (d / "tke-route-eni.conf").write_text(json.dumps(conf, indent=1))
