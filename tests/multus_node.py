"""The node rdma-multus's netns tests run on: real delegate plugins, real namespaces, a real TLS API.

Everything runs inside a "node" netns made here (the plugin via ``ip netns exec``, the API server
listening on the node's loopback); the "bond" is a veth end whose peer sits in a "switch" netns.
Delegates are Debian's reference plugins: ``ptp`` + ``host-local`` stand in for ``tke-route-eni``
and ``macvlan`` + ``host-local`` on the bond for ``tke-rdma-macvlan`` (wrapped by a script that
records the stdin and env each delegate got, then execs the real plugin).

Used by ``test_multus_netns.py``, ``test_multus_del_netns.py`` and the other files that run
rdma-multus on this node (the ``pki``, ``node`` and ``api`` fixtures are taken by assignment:
``node = multus_node.node``). Importing it skips the importing test module where the node cannot
be made (not root, or no reference plugins).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from netns import policy_env

from tests.kube_server import KubeServer, Pki

REF = Path("/usr/lib/cni")
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
ANNOTATION = "tke.cloud.tencent.com/networks"

if os.geteuid() != 0 or not (REF / "ptp").exists():
    pytest.skip("needs root and Debian's containernetworking-plugins", allow_module_level=True)


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def links(netns: str) -> set[str]:
    out = json.loads(sh("ip", "-n", netns, "-j", "link", "show").stdout)
    return {str(link["ifname"]) for link in out}


def addrs(netns: str, ifname: str) -> list[str]:
    out = json.loads(sh("ip", "-n", netns, "-j", "addr", "show", "dev", ifname).stdout)
    return [f"{a['local']}/{a['prefixlen']}" for a in out[0]["addr_info"] if a["family"] == "inet"]


def reachable(netns: str, ip: str) -> bool:
    """A TCP SYN to a closed port answered by RST proves the path both ways (no ping installed here)."""
    probe = (
        "import socket, sys\n"
        "s = socket.socket(); s.settimeout(3)\n"
        "try:\n    s.connect((sys.argv[1], 9))\nexcept ConnectionRefusedError:\n    sys.exit(0)\n"
        "except OSError:\n    sys.exit(1)\n"
    )
    return sh("ip", "netns", "exec", netns, sys.executable, "-c", probe, ip, check=False).returncode == 0


@dataclass
class Node:
    """A node netns with bond0 (203.0.113.2/24) cabled to a switch netns, and rdma-multus's files."""

    tag: str
    root: Path
    name: str = ""
    switch: str = ""
    pods: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = f"h5-node-{self.tag}"
        self.switch = f"h5-sw-{self.tag}"
        self.conf_dir = self.root / "net.d"
        self.bin_dir = self.root / "bin"
        self.cache_dir = self.root / "cache"
        self.kubelet = self.root / "kubelet"
        self.ipam_dir = self.root / "ipam"
        self.delegate_log = self.root / "delegates.log"

    def up(self) -> None:
        sh("ip", "netns", "add", self.name)
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.name, "link", "set", "lo", "up")
        sh("ip", "-n", self.name, "link", "add", "bond0", "type", "veth", "peer", "name", "bond0p",
           "netns", self.switch)  # fmt: skip
        sh("ip", "-n", self.name, "addr", "add", "203.0.113.2/24", "dev", "bond0")
        sh("ip", "-n", self.name, "link", "set", "bond0", "up")
        sh("ip", "-n", self.switch, "addr", "add", "203.0.113.1/24", "dev", "bond0p")
        sh("ip", "-n", self.switch, "link", "set", "bond0p", "up")
        for d in (self.conf_dir, self.bin_dir, self.cache_dir, self.kubelet, self.ipam_dir):
            d.mkdir(parents=True)
        for plugin in ("ptp", "host-local", "macvlan", "loopback"):
            (self.bin_dir / plugin).symlink_to(REF / plugin)
        self._wrapper("logged-macvlan", REF / "macvlan")
        self.network("tke-route-eni", {"plugins": [{
            "type": "ptp", "ipMasq": False,
            "ipam": {"type": "host-local", "dataDir": str(self.ipam_dir),
                     "ranges": [[{"subnet": "198.51.100.0/26"}]],
                     "routes": [{"dst": "0.0.0.0/0"}]}}]})  # fmt: skip
        self.network("tke-rdma-macvlan", {"plugins": [{
            "type": "logged-macvlan", "master": "bond0", "mode": "bridge", "resourceName": RESOURCE,
            "capabilities": {"mac": True},
            "ipam": {"type": "host-local", "dataDir": str(self.ipam_dir),
                     "ranges": [[{"subnet": "203.0.113.0/24", "rangeStart": "203.0.113.64",
                                  "rangeEnd": "203.0.113.95"}]]}}]})  # fmt: skip
        self.network("h5-broken", {"plugins": [{
            "type": "macvlan", "master": "no-such-bond",
            "ipam": {"type": "host-local", "dataDir": str(self.ipam_dir),
                     "ranges": [[{"subnet": "203.0.113.0/24", "rangeStart": "203.0.113.100",
                                  "rangeEnd": "203.0.113.110"}]]}}]})  # fmt: skip

    def add_bond(self, name: str, cidr: str, peer_cidr: str) -> None:
        """Another veth "bond" in the node, its peer in the switch netns."""
        sh("ip", "-n", self.name, "link", "add", name, "type", "veth", "peer", "name", f"{name}p",
           "netns", self.switch)  # fmt: skip
        sh("ip", "-n", self.name, "addr", "add", cidr, "dev", name)
        sh("ip", "-n", self.name, "link", "set", name, "up")
        sh("ip", "-n", self.switch, "addr", "add", peer_cidr, "dev", f"{name}p")
        sh("ip", "-n", self.switch, "link", "set", f"{name}p", "up")

    def _wrapper(self, name: str, real: Path) -> None:
        path = self.bin_dir / name
        path.write_text(
            "#!/bin/sh\n"
            "input=$(cat)\n"
            f'printf \'%s\\n\' "{{\\"cmd\\":\\"$CNI_COMMAND\\",\\"ifname\\":\\"$CNI_IFNAME\\",'
            f'\\"args\\":\\"$CNI_ARGS\\",\\"stdin\\":$input}}" >> {self.delegate_log}\n'
            f"printf '%s' \"$input\" | exec {real}\n"
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR)

    def delegate_calls(self) -> list[dict[str, Any]]:
        if not self.delegate_log.exists():
            return []
        return [json.loads(line) for line in self.delegate_log.read_text().splitlines()]

    def network(self, name: str, body: dict[str, Any], version: str = "1.0.0") -> None:
        (self.conf_dir / f"{name}.conflist").write_text(
            json.dumps({"cniVersion": version, "name": name, **body})
        )

    def rdma_macvlan_network(self, tmp: Path) -> None:
        """The seed's tke-rdma-macvlan delegate on this node's two veth bonds (no RDMA here)."""
        self.network("tke-rdma-macvlan", {"plugins": [{
            "type": "rdma-macvlan", "masters": ["bond0", "bond1"], "resourceName": RESOURCE,
            "rdma": {"required": False}, "dataDir": str(tmp / "rm-state"),
            "runDir": str(tmp / "rm-run"), "logFile": str(tmp / "rdma-macvlan.log")}]})  # fmt: skip

    def pod_netns(self) -> str:
        name = f"h5-pod-{self.tag}-{len(self.pods)}"
        sh("ip", "netns", "add", name)
        self.pods.append(name)
        return name

    def added_pod(
        self, api: KubeServer, tmp: Path, networks: str, **extra: Any
    ) -> tuple[dict[str, Any], str, Any]:
        """Pod ibv-app-0 asking for ``networks``, a fresh netns, and rdma-multus's ADD of it (which
        must succeed): (the config, the netns, the ADD's result)."""
        api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: networks})
        conf = self.config(api.kubeconfig(tmp / "kc"), **extra)
        pod = self.pod_netns()
        code, result = self.run("ADD", conf, "c1", pod)
        assert code == 0, result
        return conf, pod, result

    def config(self, kubeconfig: Path | None, version: str = "1.0.0", **extra: Any) -> dict[str, Any]:
        return {
            "cniVersion": version,
            "name": "tke-multus",
            "type": "rdma-multus",
            "kubeconfig": str(kubeconfig) if kubeconfig else "",
            "confDir": str(self.conf_dir),
            "defaultDelegates": "tke-route-eni",
            "binDirs": [str(self.bin_dir)],
            "cacheDir": str(self.cache_dir),
            "kubeletRootDir": str(self.kubelet),
            "apiTimeoutSeconds": 3,
            "apiAttempts": 2,
            "logFile": str(self.root / "multus.log"),
            **extra,
        }

    def run(
        self, command: str, conf: dict[str, Any], container: str, netns: str | None,
        pod: str = "ibv-app-0", uid: str = "", ifname: str = "eth0",
    ) -> tuple[int, Any]:  # fmt: skip
        args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}"
        args += f";K8S_POD_INFRA_CONTAINER_ID={container}"
        if uid:
            args += f";K8S_POD_UID={uid}"
        env = {
            "PATH": os.environ["PATH"],
            "CNI_COMMAND": command, **policy_env(),
            "CNI_CONTAINERID": container,
            "CNI_NETNS": f"/var/run/netns/{netns}" if netns else "",
            "CNI_IFNAME": ifname,
            "CNI_ARGS": args,
            "CNI_PATH": str(self.bin_dir),
        }
        proc = subprocess.run(
            ["ip", "netns", "exec", self.name, sys.executable, "-m", "rdma_cni.cli.multus"],
            input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
        return proc.returncode, out

    def checkpoint(self, uid: str, ids: list[str]) -> None:
        path = self.kubelet / "device-plugins" / "kubelet_internal_checkpoint"
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"PodUID": uid, "ContainerName": "ibv-app-ctr", "ResourceName": RESOURCE,
                 "DeviceIDs": {"0": ids}, "AllocResp": ""}  # fmt: skip
        path.write_text(
            json.dumps({"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {}}, "Checksum": 1})
        )

    def leftovers(self) -> dict[str, Any]:
        """Everything rdma-multus or a delegate might leave behind on the node."""
        ipam = sorted(
            str(p.relative_to(self.ipam_dir)) for p in self.ipam_dir.rglob("*")
            if p.is_file() and p.name[0].isdigit()
        )  # fmt: skip
        cached = sorted(
            str(p.relative_to(self.cache_dir)) for p in self.cache_dir.rglob("*")
            if p.is_file() and p.relative_to(self.cache_dir).parts[0] != "stats"  # node-wide counters
        )  # fmt: skip
        return {"node_links": links(self.name), "ipam": ipam, "cache": cached}

    def down(self) -> None:
        for ns in [*self.pods, self.name, self.switch]:
            sh("ip", "netns", "del", ns, check=False)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("h5-pki"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tag=f"{os.getpid()}-{uuid.uuid4().hex[:6]}", root=tmp_path)
    try:
        n.up()
        yield n
    finally:
        n.down()


@pytest.fixture
def api(node: Node, pki: Pki) -> Iterator[KubeServer]:
    with KubeServer(pki, netns=node.name) as server:
        yield server


CLEAN_NODE = {"node_links": {"lo", "bond0"}, "ipam": [], "cache": []}
