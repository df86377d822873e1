"""The demo (``scripts/demo``): a simulated GPU node in network namespaces, one RDMA pod through the
real plugins, and everything removed again.

What it builds, on any Linux machine with netns/veth/macvlan (no RDMA hardware needed):

* ``<tag>-node``: the node. ``bond0..bond3`` are veth ends (this kernel may have no bonding) holding
  ``198.51.100.{2,18,34,50}/28``, one /28 per NIC as on a TKE GPU node; their peers sit in
  ``<tag>-sw`` (the "switch") holding ``.1, .17, .33, .49``.
* an RDMA sysfs tree (``mlx5_bond_0..3`` over ``bond0..3``, RoCE v1+v2 GID tables like mlx5) kept in
  sync with the live addresses by H3's simulated node (:mod:`rdma_cni.sim.node`), so the GID indices
  are those the kernel would give;
* the CNI configs of conf/vpc-cni (``--mode global-router``: conf/global-router), pointed at the demo's
  directories, plus the cluster network played by a reference plugin (``tke-route-eni``: ``ptp``;
  ``tke-bridge``: ``bridge``), and a kubelet (:mod:`rdma_cni.sim.kubelet`) whose PodResources API
  says which two RDMA devices it gave the pod, as rdma-multus asks it on a real node.

Then, like containerd for a pod annotated ``tke.cloud.tencent.com/networks: tke-route-eni,
tke-rdma-macvlan``: ``cni-tool add rdma-multus`` (ADD through rdma-multus → ptp + rdma-macvlan),
show the pod's interfaces, routes and GIDs, ping the switch from each bond, ``cni-tool doctor`` and
``cni-tool state``, ``cni-tool del``, and compare the node with how it started.

Names carry ``h6-demo-<pid>``; everything is removed on exit, on failure and on Ctrl-C, and a later
run also removes what a killed run left (its pid is gone).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PREFIX = "h6-demo-"
ANNOTATION = "tke.cloud.tencent.com/networks"
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
REFERENCE_PLUGINS = ("/usr/lib/cni", "/opt/cni/bin")
POD = {"namespace": "default", "name": "rdma-demo-0"}
# The seed's two cluster network modes: the default network each names, and the reference plugin that
# plays it here (VPC-CNI routes each pod over its own link; GlobalRouter bridges pods on the node).
MODES = {"vpc-cni": ("tke-route-eni", "ptp"), "global-router": ("tke-bridge", "bridge")}
# The RDMA modes (TKE's rdma-agent has both): exclusive is this module's, shared demo_shared's.
RDMA_MODES = ("exclusive", "shared")


class DemoFailed(Exception):
    """A step did not do what the demo shows; the message says which and why."""


def bond_addr(i: int) -> tuple[str, str]:
    """(bond address, switch peer address) of bond i: one /28 per NIC."""
    return f"198.51.100.{16 * i + 2}/28", f"198.51.100.{16 * i + 1}/28"


def say(text: str = "") -> None:
    print(text, flush=True)


def banner(step: str) -> None:
    say()
    say(f"=== {step} " + "=" * max(0, 96 - len(step)))


def run(
    *args: str,
    check: bool = True,
    env: dict[str, str] | None = None,
    show: bool = False,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    if show:
        say(f"$ {' '.join(args)}")
    proc = subprocess.run(
        list(args), capture_output=True, text=True, env=env, input=stdin, timeout=120, check=False
    )
    if show and proc.stdout.strip():
        say(proc.stdout.rstrip())
    if check and proc.returncode != 0:
        raise DemoFailed(
            f"`{' '.join(args)}` failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
        )
    return proc


def process_alive(pid: int) -> bool:
    """Whether ``pid`` still runs. A killed process keeps its /proc entry as a zombie (state Z, or X
    while being reaped) until its parent - PID 1 once orphaned, which may take a while - reaps it;
    it will never clean up again, so it counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = stat.rpartition(")")[2].split()[:1]  # comm may hold spaces and ")": state follows the last one
    return state not in (["Z"], ["X"], [])


def _dead_run(name: str) -> bool:
    pid = name.removeprefix(PREFIX).split("-")[0]
    return name.startswith(PREFIX) and pid.isdigit() and not process_alive(int(pid))


def sweep_leftovers() -> None:
    """Remove namespaces and dirs of earlier demo runs whose process is gone (kill -9, power loss)."""
    for name in sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []:
        if _dead_run(name):
            run("ip", "netns", "del", name, check=False)
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if _dead_run(path.name):
            shutil.rmtree(path, ignore_errors=True)


class Demo:
    def __init__(self, bonds: int, pod_bonds: int, bundle: str, mode: str = "vpc-cni") -> None:
        self.tag = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.node, self.switch, self.pod = f"{self.tag}-node", f"{self.tag}-sw", f"{self.tag}-pod0"
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.sysfs = str(self.tmp / "sys")
        self.bonds = [f"bond{i}" for i in range(bonds)]
        self.pod_bonds = pod_bonds
        self.bundle = bundle
        self.namespaces: list[str] = []
        self.mode = mode
        self.default_network, self.default_plugin = MODES[mode]
        # GlobalRouter's node bridge: it stays after the pod is gone, as tke-bridge's does.
        self.cluster_bridge = f"cni-{self.tag[-9:]}" if self.default_plugin == "bridge" else ""
        self.pods_prefix = f"{self.tag}-pod"  # pod netns names the simulated RDMA node follows
        self.bin_dir = self.tmp / "bin"
        self.conf_dir = self.tmp / "net.d"
        self.dev_root = str(self.tmp / "dev")
        self.kubelet_root = self.tmp / "kubelet"
        self.picked: list[int] = list(range(pod_bonds))  # the bonds kubelet gives the pod (admission)
        self.pod_resources: Any = None  # the kubelet's PodResources server, while it runs

    def numa(self, i: int) -> int:
        """NUMA node of NIC i: the first half on node 0, the rest on node 1 (as on a GPU node)."""
        return 0 if i < (len(self.bonds) + 1) // 2 else 1

    def pod_bond_list(self) -> list[tuple[int, str]]:
        return [(i, self.bonds[i]) for i in self.picked]

    # ---- the node ------------------------------------------------------------------------------
    def netns(self, name: str) -> None:
        # Listed before it exists: a Ctrl-C landing between `ip netns add` and the append (or
        # inside `ip`, which gets the same SIGINT) must still leave it to cleanup's `ip netns del`.
        self.namespaces.append(name)
        run("ip", "netns", "add", name)
        run("ip", "-n", name, "link", "set", "lo", "up")
        run(
            "ip",
            "netns",
            "exec",
            name,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.dad_transmits=0",
            "net.ipv6.conf.default.dad_transmits=0",
        )

    def build_node(self) -> None:
        self.netns(self.node)
        self.netns(self.switch)
        for i, bond in enumerate(self.bonds):
            mine, peer = bond_addr(i)
            run(
                "ip",
                "-n",
                self.node,
                "link",
                "add",
                bond,
                "type",
                "veth",
                "peer",
                "name",
                f"sw{i}",
                "netns",
                self.switch,
            )
            run("ip", "-n", self.switch, "addr", "add", peer, "dev", f"sw{i}")
            run("ip", "-n", self.switch, "link", "set", f"sw{i}", "up")
            run("ip", "-n", self.node, "addr", "add", mine, "dev", bond)
            run("ip", "-n", self.node, "link", "set", bond, "up")

    @contextmanager
    def rdma(self) -> Iterator[None]:
        """The simulated RDMA devices: H3's SimNode with mlx5's GID types (RoCE v1 + v2, so the IPv4
        RoCE v2 GID sits at index 3 as in the seed), half the NICs on each of 2 NUMA nodes, their
        uverbs/umad/issm/rdma_cm char devices made under the demo's dev root; run as its own process
        like the kernel would be."""
        args = [
            self.sysfs,
            ",".join(f"{b}:mlx5_bond_{i}" for i, b in enumerate(self.bonds)),
            f"/run/netns/{self.node}",
            self.pods_prefix,
            ",".join(str(self.numa(i)) for i in range(len(self.bonds))),
            self.dev_root,
        ]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen(
            [sys.executable, "-c", SIM_NODE, *args], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            if not ready or proc.stdout.readline().strip() != "ready":
                raise DemoFailed(f"the simulated RDMA node did not start (exit code {proc.poll()})")
            yield
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
            proc.wait(30)

    @contextmanager
    def device_plugin(self) -> Iterator[Any]:
        """kubelet (rdma_cni.sim.kubelet: the device manager's side of the v1beta1 API on real unix
        sockets) and the real rdma-device-plugin process in the node netns; yields kubelet's endpoint
        once the plugin registered. The plugin is stopped with SIGTERM (it removes its socket)."""
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # no C-core INFO lines in the demo's output
        from rdma_cni.sim.kubelet import TestKubelet
        from rdma_cni.sim.podresources import PodResourcesServer

        self.pod_resources = PodResourcesServer(str(self.kubelet_root / "pod-resources" / "kubelet.sock"))
        kubelet = TestKubelet(self.kubelet_root, pod_resources=self.pod_resources.add_to).start()
        if self.bundle:
            cmd = [os.path.join(self.bundle, "rdma-device-plugin")]
        else:
            cmd = [sys.executable, "-m", "rdma_cni.cli.device_plugin"]
        cmd = ["ip", "netns", "exec", self.node, *cmd, "--kubelet-root-dir", str(self.kubelet_root),
               "--sysfs-root", self.sysfs, "--dev-root", self.dev_root,
               *self.device_plugin_config(),
               "--log-file", str(self.tmp / "log" / "rdma-device-plugin.log")]
        say(f"$ {' '.join(cmd[4:])}")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            try:
                ep = kubelet.wait_endpoint(RESOURCE, timeout=60)
            except AssertionError as exc:
                raise DemoFailed(f"rdma-device-plugin did not register with kubelet ({exc})") from None
            yield ep
            socket = os.path.join(kubelet.dir, ep.endpoint)
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            gone = "removed" if not os.path.exists(socket) else "STILL THERE"
            say(f"rdma-device-plugin stopped (SIGTERM, exit code {proc.returncode}): its socket {gone}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            kubelet.stop()

    def device_plugin_config(self) -> list[str]:
        """The plugin's config flags: rdma-macvlan's delegate config (shared mode gives its own)."""
        return ["--cni-conf", str(self.conf_dir / "rdma-multus.d" / "tke-rdma-macvlan.conf")]

    # ---- the plugins and their configs ----------------------------------------------------------
    def install_plugins(self) -> None:
        self.bin_dir.mkdir()
        if self.bundle:
            run(
                str(REPO / "scripts" / "install.sh"),
                "--bundle",
                self.bundle,
                "--cni-bin-dir",
                str(self.bin_dir),
                "--conf-dir",
                str(self.tmp / "installed.d"),
                show=True,
            )
        else:
            for name, module in (
                ("rdma-macvlan", "macvlan"),
                ("rdma-multus", "multus"),
                ("cni-tool", "tool"),
            ):
                path = self.bin_dir / name
                path.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m rdma_cni.cli.{module} "$@"\n')
                path.chmod(0o755)
        ref = next((d for d in REFERENCE_PLUGINS if os.access(os.path.join(d, "ptp"), os.X_OK)), None)
        if ref is None:
            raise DemoFailed(
                "the reference plugins (ptp, host-local) are missing: run scripts/setup "
                "(Debian package containernetworking-plugins)"
            )
        for name in ("ptp", "bridge", "host-local", "loopback"):  # loopback: what containerd runs for lo
            (self.bin_dir / name).symlink_to(os.path.join(ref, name))

    def write_configs(self) -> None:
        src = REPO / "conf" / self.mode
        delegates = self.conf_dir / "rdma-multus.d"
        delegates.mkdir(parents=True)
        meta = json.loads((src / "00-rdma-multus.conflist").read_text())
        meta["plugins"][0].update(
            confDir=str(delegates),
            kubeconfig="",
            cacheDir=str(self.tmp / "multus-cache"),
            kubeletRootDir=str(self.kubelet_root),
            # kubelet keeps device-plugins/ (and its checkpoint) at a constant path, not under its
            # root dir: name the demo's explicitly.
            devicePluginDir=str(self.kubelet_root / "device-plugins"),
            logFile=str(self.tmp / "log" / "rdma-multus.log"),
        )
        (self.conf_dir / "00-rdma-multus.conflist").write_text(json.dumps(meta, indent=2))
        # Only the paths change: masters come from the RDMA devices (sysfsRoot), as on a real node.
        macvlan = json.loads((src / "rdma-multus.d" / "tke-rdma-macvlan.conf").read_text())
        macvlan.update(
            dataDir=str(self.tmp / "state"),
            runDir=str(self.tmp / "run"),
            sysfsRoot=self.sysfs,
            logFile=str(self.tmp / "log" / "rdma-cni.log"),
        )
        (delegates / "tke-rdma-macvlan.conf").write_text(json.dumps(macvlan, indent=2))
        # The cluster network (tke-route-eni / tke-bridge on TKE) played by a reference plugin.
        plugin: dict[str, Any] = {
            "type": self.default_plugin,
            "ipam": {"type": "host-local", "subnet": "203.0.113.0/24", "dataDir": str(self.tmp / "ipam")},
        }
        if self.default_plugin == "bridge":
            plugin.update(bridge=self.cluster_bridge, isGateway=True)
        cluster = {"cniVersion": "1.0.0", "name": self.default_network, "plugins": [plugin]}
        (delegates / f"{self.default_network}.conflist").write_text(json.dumps(cluster, indent=2))

    @property
    def networks(self) -> str:
        """The pod annotation's value in this cluster mode (the seed's two forms)."""
        return f"{self.default_network},tke-rdma-macvlan"

    def admit(self, picks: list[str]) -> None:
        """What kubelet's PodResources API answers once it admitted the pod: the devices Allocate
        was given, per container, with their NUMA nodes; rdma-multus asks it at ADD (no checkpoint)."""
        numa = {f"mlx5_bond_{i}": self.numa(i) for i in range(len(self.bonds))}
        self.pod_resources.set_allocatable(RESOURCE, numa)
        self.pod_resources.set_pod(POD["namespace"], POD["name"], {"main": {RESOURCE: picks}})

    def write_device_checkpoint(self, pod_uid: str) -> list[str]:
        """What kubelet's device checkpoint records after the device plugin gave the pod its RDMA NICs:
        rdma-multus's fallback when no PodResources API answers (the real-client suites, containerd
        and upstream cnitool, run the demo's node without the demo's kubelet)."""
        devices = [f"mlx5_bond_{i}" for i in self.picked]
        entry = {
            "PodUID": pod_uid,
            "ContainerName": "main",
            "ResourceName": RESOURCE,
            "DeviceIDs": {"0": devices},
            "AllocResp": "",
        }
        path = self.kubelet_root / "device-plugins" / "kubelet_internal_checkpoint"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps({"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {}}, "Checksum": 0})
        )
        return devices

    # ---- running the tools -----------------------------------------------------------------------
    def tool_env(self, pod_uid: str) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "NETCONFPATH": str(self.conf_dir),
            "CNI_PATH": str(self.bin_dir),
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={POD['namespace']};K8S_POD_NAME={POD['name']};"
            f"K8S_POD_UID={pod_uid};K8S_POD_INFRA_CONTAINER_ID=demo",
            # containerd hands the pod's annotations to a plugin that declares this capability.
            "CAP_ARGS": json.dumps({"io.kubernetes.cri.pod-annotations": {ANNOTATION: self.networks}}),
        }
        if not self.bundle:
            env["PYTHONPATH"] = str(REPO)
        return env

    def cni_tool(
        self, *args: str, env: dict[str, str] | None = None, show: bool = True, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = env or self.tool_env("")
        cmd = [
            "ip",
            "netns",
            "exec",
            self.node,
            str(self.bin_dir / "cni-tool"),
            "--cache-dir",
            str(self.tmp / "cache"),
            *args,
        ]
        if show:
            say(f"$ cni-tool {' '.join(args)}")
        proc = run(*cmd, env=env, check=False)
        if show and proc.stdout.strip():
            say(proc.stdout.rstrip())
        if check and proc.returncode != 0:
            raise DemoFailed(
                f"cni-tool {args[0]} failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
            )
        return proc

    def node_options(self) -> list[str]:
        return [
            "--sysfs-root",
            self.sysfs,
            "--netns",
            f"/run/netns/{self.node}",
            "--cni-bin-dir",
            str(self.bin_dir),
            "--conf-dir",
            str(self.conf_dir),
            "--kubelet-root-dir",
            str(self.tmp / "kubelet"),
            "--cache-dir",
            str(self.tmp / "cache"),
        ]

    def host_snapshot(self) -> dict[str, Any]:
        """The node's addresses, routes and rules (the cluster network's own bridge left out)."""

        def j(*args: str) -> list[dict[str, Any]]:
            rows = json.loads(run("ip", "-n", self.node, "-j", *args).stdout or "[]")
            return [
                r
                for r in rows
                if not self.cluster_bridge or self.cluster_bridge not in (r.get("ifname"), r.get("dev"))
            ]

        addrs = [
            {
                "ifname": a["ifname"],
                "addr": [(x["family"], x["local"], x["prefixlen"]) for x in a["addr_info"]],
            }
            for a in j("addr")
        ]
        return {"addr": addrs, "route": j("route", "show", "table", "all"), "rule": j("rule")}

    def ping(self, src_if: str, dst: str) -> float:
        """One ICMP echo from the pod out of ``src_if``; the round trip in ms (no ping binary needed)."""
        code = PING.replace("DST", dst).replace("IFACE", src_if)
        proc = run("ip", "netns", "exec", self.pod, sys.executable, "-c", code, check=False)
        if proc.returncode != 0:
            raise DemoFailed(f"ping {dst} from the pod's {src_if} got no reply: {proc.stderr.strip()}")
        return float(proc.stdout.strip())

    def bonds_settled(self) -> bool:
        links = json.loads(run("ip", "-n", self.node, "-j", "addr").stdout or "[]")
        ready = {
            a["ifname"]
            for a in links
            if a.get("operstate") == "UP"
            and any(
                x["family"] == "inet6" and x["scope"] == "link" and not x.get("tentative")
                for x in a["addr_info"]
            )
        }
        return set(self.bonds) <= ready

    def host_has(self, bond: str) -> bool:
        """Whether ``bond`` holds an IPv4 address on the node right now."""
        out = run("ip", "-n", self.node, "-4", "-j", "addr", "show", "dev", bond).stdout
        return any(a.get("addr_info") for a in json.loads(out or "[]"))

    def wait_for(self, what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise DemoFailed(f"timed out waiting for {what}")
            time.sleep(0.05)

    def cleanup(self) -> None:
        for name in reversed(self.namespaces):
            run("ip", "netns", "del", name, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)


# The simulated node's process: SimNode serving in its main thread until SIGTERM.
SIM_NODE = r"""
import signal, sys, threading
from rdma_cni.sim.model import MLX5_TYPES
from rdma_cni.sim.node import SimNode, parse_bonds
root, bonds, node_netns, prefix, numa, dev_root = sys.argv[1:7]
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the demo, which stops us by pid
node = SimNode(root, parse_bonds(bonds, numa, mad=True), node_netns, "/run/netns", prefix, gid_slots=16,
               gid_types=MLX5_TYPES, rdma_cm=True, dev_root=dev_root)
with node:
    print("ready", flush=True)
    node.serve(stop)
"""

PING = r"""
import os, socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"IFACE")
ident = os.getpid() & 0xFFFF
def csum(b):
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b)); t = (t >> 16) + (t & 0xFFFF); t += t >> 16
    return ~t & 0xFFFF
body = struct.pack("!BBHHH", 8, 0, 0, ident, 1) + b"rdma-cni"
pkt = body[:2] + struct.pack("!H", csum(body)) + body[4:]
s.settimeout(0.5)
end = time.time() + 5
while time.time() < end:
    t0 = time.perf_counter(); s.sendto(pkt, ("DST", 0))
    try:
        data, addr = s.recvfrom(2048)
    except socket.timeout:
        continue
    hl = (data[0] & 15) * 4
    if addr[0] == "DST" and data[hl] == 0 and struct.unpack("!H", data[hl + 4:hl + 6])[0] == ident:
        print(f"{(time.perf_counter() - t0) * 1000:.2f}"); sys.exit(0)
sys.exit(1)
"""


def bond_ip(i: int) -> str:
    return bond_addr(i)[0].split("/")[0]


def gid_index(d: Demo, i: int, ndev: str | None = None) -> int | None:
    """Index of the RoCE v2 GID of bond i's IPv4 address in mlx5_bond_i's table (None: not there)."""
    from rdma_cni.rdma import sysfs

    return sysfs.roce_v2_index(d.sysfs, f"mlx5_bond_{i}", 1, bond_ip(i), ndev=ndev)


def step_node(d: Demo) -> int:
    """The node with its bonds and RDMA devices; returns the host's GID index."""
    from rdma_cni.rdma import sysfs

    d.wait_for("the simulated RDMA devices", lambda: len(sysfs.list_ports(d.sysfs)) == len(d.bonds))
    d.wait_for("the host GIDs", lambda: all(gid_index(d, i) is not None for i in range(len(d.bonds))))
    run("ip", "-n", d.node, "-br", "addr", show=True)
    d.install_plugins()
    d.write_configs()
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    host_index = gid_index(d, 0)
    if host_index is None:
        raise DemoFailed("bond0's address has no RoCE v2 GID on the simulated node")
    say(f"-> the host's RoCE v2 GID index for bond0's IPv4 address is {host_index} (mlx5: v1 and v2 GIDs)")
    return host_index


def step_device_plugin(d: Demo, ep: Any) -> None:
    """What kubelet sees (capacity, health, NUMA) and what it gets when it admits the pod."""
    def ready(devs: list[Any]) -> bool:
        return len(devs) == len(d.bonds) and all(x.health == "Healthy" for x in devs)

    _, devs = ep.wait_list(ready, 30)
    healthy = sum(1 for x in devs if x.health == "Healthy")
    say(f"kubelet: registered {RESOURCE} from {ep.endpoint} (preferred allocation: "
        f"{ep.options.get_preferred_allocation_available})")
    say(f"-> node capacity {RESOURCE}: {len(devs)}, allocatable: {healthy}")
    for x in devs:
        say(f"   {x.id:<12} {x.health:<9} NUMA node {','.join(map(str, x.numa)) or '-'}")
    ids = [x.id for x in devs]
    picks = ep.preferred(ids, [], d.pod_bonds)
    say(f"kubelet admits a pod asking for {d.pod_bonds}: GetPreferredAllocation -> {', '.join(picks)}")
    resp = ep.allocate(picks).container_responses[0]
    say("Allocate -> the container gets only these device nodes (host numbering kept):")
    for spec in resp.devices:
        say(f"   {spec.container_path:<26} <- {spec.host_path} ({spec.permissions})")
    say("   and these environment variables:")
    for key in sorted(resp.envs):
        say(f"   {key}={resp.envs[key]}")
    d.picked = sorted(int(p.rsplit("_", 1)[1]) for p in picks)
    d.admit(picks)


def step_add(d: Demo) -> dict[str, str]:
    banner(f"3. Pod {POD['namespace']}/{POD['name']}: {ANNOTATION}: {d.networks}; {RESOURCE}: {d.pod_bonds}")
    pod_uid = str(uuid.uuid4())
    devices = [f"mlx5_bond_{i}" for i in d.picked]
    say(f"kubelet PodResources: the pod holds {', '.join(devices)} (what Allocate was given above)")
    d.netns(d.pod)
    env = d.tool_env(pod_uid)
    asked = len(d.pod_resources.calls)
    d.cni_tool("add", "rdma-multus", f"/run/netns/{d.pod}", env=env)
    calls = d.pod_resources.calls[asked:]
    if not calls:
        raise DemoFailed("rdma-multus did not ask kubelet's PodResources API which devices the pod holds")
    say(f"-> rdma-multus asked kubelet's PodResources API ({', '.join(dict.fromkeys(calls))}) "
        "which devices the pod holds")
    return env


def step_pod_view(d: Demo, host_index: int) -> None:
    banner("4. Inside the pod: eth0 from the cluster network, one interface per bond with the bond's IP")
    run("ip", "-n", d.pod, "-br", "addr", show=True)
    run("ip", "-n", d.pod, "route", "show", "table", "all", show=True)
    run("ip", "-n", d.pod, "rule", show=True)
    say()
    say("The node meanwhile (the bonds lent to the pod have no IPv4 address now):")
    run("ip", "-n", d.node, "-br", "addr", show=True)
    for i, bond in d.pod_bond_list():
        d.wait_for(f"the pod's GID on {bond}", partial(_moved, d, i, bond))
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    for i, bond in d.pod_bond_list():
        index = gid_index(d, i)
        if index != host_index:
            raise DemoFailed(
                f"the pod's GID for {bond_ip(i)} is at index {index}, the host's was {host_index}"
            )
        say(
            f"-> pod {bond}: RoCE v2 GID of {bond_ip(i)} at index {index}, the same as the host's: "
            f"NCCL_IB_GID_INDEX={index} works in every pod"
        )


def _moved(d: Demo, i: int, bond: str) -> bool:
    return gid_index(d, i) is not None and not d.host_has(bond)


def step_traffic(d: Demo) -> None:
    banner("5. Traffic: ping the switch from each of the pod's bond interfaces")
    for i, bond in d.pod_bond_list():
        peer = bond_addr(i)[1].split("/")[0]
        say(f"pod {bond} -> {peer}: reply in {d.ping(bond, peer)} ms")


def step_delete(d: Demo, env: dict[str, str], before: dict[str, Any], host_index: int) -> None:
    banner("7. Delete the pod: the IPs, routes and GIDs go back to the node")
    d.cni_tool("del", "rdma-multus", f"/run/netns/{d.pod}", env=env)
    run("ip", "netns", "del", d.pod)
    d.namespaces.remove(d.pod)
    after = d.host_snapshot()
    run("ip", "-n", d.node, "-br", "addr", show=True)
    for i, bond in d.pod_bond_list():
        d.wait_for(
            f"the host's GID on {bond}", partial(lambda i, bond: gid_index(d, i, bond) is not None, i, bond)
        )
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    if after != before:
        diff = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        raise DemoFailed(f"the node is not as it was: {json.dumps(diff)[:2000]}")
    for i, bond in d.pod_bond_list():
        index = gid_index(d, i, bond)
        if index != host_index:
            raise DemoFailed(f"{bond}'s GID came back at index {index}, it was {host_index}")
    say(f"-> node restored: addresses, routes and rules as before the pod; GID index {host_index} again")


def scenario(d: Demo) -> None:
    banner(f"1. A simulated GPU node: netns {d.node}, {len(d.bonds)} bond NICs, switch {d.switch}")
    d.build_node()
    # Start the simulated RDMA devices on settled links (carrier up, IPv6 link-local in place), as on
    # a node whose bonds came up at boot.
    d.wait_for("the bonds' carrier", d.bonds_settled)
    with d.rdma():
        host_index = step_node(d)
        before = d.host_snapshot()
        banner(f"2. The device plugin: rdma-device-plugin advertises {RESOURCE} to kubelet")
        with d.device_plugin() as ep:
            step_device_plugin(d, ep)
            env = step_add(d)
            step_pod_view(d, host_index)
            step_traffic(d)
            banner("6. What the node says: cni-tool state and cni-tool doctor")
            d.cni_tool("state", *d.node_options(), check=False)
            d.cni_tool("doctor", *d.node_options(), check=False)
            step_delete(d, env, before, host_index)


def run_demo(bonds: int, pod_bonds: int, bundle: str, network: str) -> int:
    """The exclusive-mode demo end to end; the exit code (0 OK, 1 failed, 130 interrupted)."""
    demo = Demo(bonds, pod_bonds, bundle, network)
    signal.signal(signal.SIGTERM, interrupted)
    started = time.monotonic()
    try:
        scenario(demo)
    except DemoFailed as exc:
        say(f"\ndemo FAILED: {exc}")
        show_logs(demo)
        return 1
    except KeyboardInterrupt:
        say("\ndemo interrupted")
        return 130
    finally:
        demo.cleanup()
        say(f"\ncleaned up: removed {demo.tag}-* namespaces and {demo.tmp}")
    say(f"demo OK in {time.monotonic() - started:.1f} s")
    return 0


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM cleans up like Ctrl-C does."""
    raise KeyboardInterrupt


def show_logs(demo: Demo) -> None:
    for log in sorted((demo.tmp / "log").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-15:]
        say(f"--- last lines of {log.name}:")
        for line in lines:
            say(line)
