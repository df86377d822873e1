"""rdma-multus end to end: the real binary, real delegate plugins, real namespaces, a real TLS API.

Everything runs inside a "node" netns made here (the plugin via ``ip netns exec``, the API server
listening on the node's loopback); the "bond" is a veth end whose peer sits in a "switch" netns.
Delegates are Debian's reference plugins: ``ptp`` + ``host-local`` stand in for ``tke-route-eni``
and ``macvlan`` + ``host-local`` on the bond for ``tke-rdma-macvlan`` (wrapped by a script that
records the stdin and env each delegate got, then execs the real plugin).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.kube_server import KubeServer, Pki

pytestmark = pytest.mark.netns

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
            "CNI_COMMAND": command,
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


def test_tke_pod_gets_eth0_from_default_and_net1_from_the_rdma_network(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    uid = str(uuid.uuid4())
    api.add_pod("default", "ibv-app-0", uid=uid, annotations={ANNOTATION: "tke-route-eni,tke-rdma-macvlan"},
                limits={RESOURCE: "2"})  # fmt: skip
    node.checkpoint(uid, ["0", "1"])
    conf = node.config(api.kubeconfig(tmp_path / "kc", auth="cert"))
    pod = node.pod_netns()

    code, result = node.run("ADD", conf, "c1", pod, uid=uid)
    assert code == 0, result
    assert [i["name"] for i in result["interfaces"] if i.get("sandbox")] == ["eth0", "net1"]
    assert addrs(pod, "eth0")[0].startswith("198.51.100.") and addrs(pod, "net1") == ["203.0.113.64/24"]
    result_ips = {ip["address"] for ip in result["ips"]}
    assert result_ips == {addrs(pod, "eth0")[0], "203.0.113.64/24"}
    assert reachable(pod, "203.0.113.1")

    (add,) = [c for c in node.delegate_calls() if c["cmd"] == "ADD"]
    assert add["ifname"] == "net1"
    assert add["stdin"]["runtimeConfig"]["deviceIDs"] == ["0", "1"]
    assert add["stdin"]["deviceID"] == "0" and add["stdin"]["count"] == 2
    assert f"K8S_POD_UID={uid}" in add["args"]

    code, out = node.run("CHECK", {**conf, "prevResult": result}, "c1", pod, uid=uid)
    assert code == 0, out

    code, out = node.run("DEL", conf, "c1", pod, uid=uid)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_failing_second_delegate_leaves_nothing_behind(node: Node, api: KubeServer, tmp_path: Path) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-route-eni,h5-broken"})
    pod = node.pod_netns()
    code, err = node.run("ADD", node.config(api.kubeconfig(tmp_path / "kc")), "c1", pod)
    assert code != 0
    assert "h5-broken" in err["msg"] and "net1" in err["msg"]
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_del_after_the_api_server_is_gone_and_the_netns_too(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-rdma-macvlan")
    assert links(pod) == {"lo", "eth0", "net1"}
    api.stop()
    sh("ip", "netns", "del", pod)
    # containerd's second DEL (RemovePodSandbox): empty CNI_NETNS, no prevResult, no API server.
    code, out = node.run("DEL", conf, "c1", None)
    assert code == 0, out
    assert node.leftovers() == CLEAN_NODE
    code, out = node.run("DEL", conf, "c1", None)  # and again: idempotent
    assert code == 0, out


def test_del_with_the_netns_alive_and_no_api_removes_the_interfaces(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-rdma-macvlan@rdma0")
    assert links(pod) == {"lo", "eth0", "rdma0"}
    api.stop()
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_containerd_annotations_in_runtime_config_skip_the_api(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    conf["runtimeConfig"] = {
        "io.kubernetes.cri.pod-annotations": {ANNOTATION: "tke-route-eni,tke-rdma-macvlan"}
    }
    pod = node.pod_netns()
    node.checkpoint("uid-1", ["3"])
    code, result = node.run("ADD", conf, "c1", pod, pod="not-in-the-api", uid="uid-1")
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "net1"}
    # No GET: the only call is the network-status PATCH, refused (404) for a pod the API does not
    # have, which is counted and does not fail the ADD.
    assert [r["method"] for r in api.requests] == ["PATCH"]
    (add,) = [c for c in node.delegate_calls() if c["cmd"] == "ADD"]
    assert add["stdin"]["runtimeConfig"]["deviceIDs"] == ["3"]
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert node.leftovers() == CLEAN_NODE


def test_pod_without_annotation_gets_only_the_default_network(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0")
    conf = node.config(api.kubeconfig(tmp_path / "kc", auth="tokenFile"), version="0.4.0")
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c1", pod)
    assert code == 0, result
    assert result["cniVersion"] == "0.4.0" and result["ips"][0]["version"] == "4"
    assert links(pod) == {"lo", "eth0"}
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_recreated_pod_with_another_uid_is_refused_before_anything_runs(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0", uid="new-uid", annotations={ANNOTATION: "tke-rdma-macvlan"})
    pod = node.pod_netns()
    code, err = node.run("ADD", node.config(api.kubeconfig(tmp_path / "kc")), "c1", pod, uid="old-uid")
    assert code != 0 and err["code"] == 106 and "recreated" in err["msg"]
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_api_server_down_at_add_is_a_clear_error(node: Node, api: KubeServer, tmp_path: Path) -> None:
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    api.stop()
    pod = node.pod_netns()
    code, err = node.run("ADD", conf, "c1", pod)
    assert code != 0 and err["code"] == 106 and "unreachable" in err["msg"]
    assert node.leftovers() == CLEAN_NODE


def test_check_notices_a_lost_address_on_the_rdma_interface(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, result = node.added_pod(api, tmp_path, "tke-rdma-macvlan")
    sh("ip", "-n", pod, "addr", "flush", "dev", "net1")
    code, err = node.run("CHECK", {**conf, "prevResult": result}, "c1", pod)
    assert code != 0 and "203.0.113.64" in err["msg"] and "net1" in err["msg"]
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_gc_removes_attachments_the_runtime_no_longer_knows(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-rdma-macvlan"})
    conf = node.config(api.kubeconfig(tmp_path / "kc"), version="1.1.0")
    pods = [node.pod_netns(), node.pod_netns()]
    for i, pod in enumerate(pods):
        code, result = node.run("ADD", conf, f"c{i}", pod)
        assert code == 0, result
    gc = {**conf, "cni.dev/valid-attachments": [{"containerID": "c0", "ifname": "eth0"}]}
    code, out = node.run("GC", gc, "", None, ifname="")
    assert code == 0, out
    assert links(pods[0]) == {"lo", "eth0", "net1"}
    assert links(pods[1]) == {"lo"}
    assert node.run("DEL", conf, "c0", pods[0])[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_missing_delegate_binary_fails_before_anything_runs(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    node.network("h5-ghost", {"plugins": [{"type": "no-such-plugin"}]})
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "h5-ghost"})
    pod = node.pod_netns()
    code, err = node.run("ADD", node.config(api.kubeconfig(tmp_path / "kc")), "c1", pod)
    assert code != 0 and err["code"] == 7 and "no-such-plugin" in err["msg"]
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE


def test_version_and_help_need_no_config() -> None:
    env = {**os.environ, "CNI_COMMAND": "VERSION"}
    cmd = [sys.executable, "-m", "rdma_cni.cli.multus"]
    proc = subprocess.run(cmd, env=env, input="", capture_output=True, text=True)
    assert proc.returncode == 0 and "1.1.0" in json.loads(proc.stdout)["supportedVersions"]
    assert shutil.which("ip") is not None


def test_kill_9_between_delegates_then_del_restores_everything(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """The plan is on disk before the first delegate runs, so a crash mid-ADD is undone by DEL."""
    marker = tmp_path / "second-delegate-started"
    hang = node.bin_dir / "hanging-macvlan"
    hang.write_text(f"#!/bin/sh\necho $$ > {marker}.tmp && mv {marker}.tmp {marker}\nexec sleep 60\n")
    hang.chmod(0o755)
    node.network("h5-hang", {"plugins": [{"type": "hanging-macvlan", "master": "bond0"}]})
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "h5-hang"})
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    pod = node.pod_netns()
    env = {
        "PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1",
        "CNI_NETNS": f"/var/run/netns/{pod}", "CNI_IFNAME": "eth0", "CNI_PATH": str(node.bin_dir),
        "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=ibv-app-0",
    }  # fmt: skip
    proc = subprocess.Popen(
        ["ip", "netns", "exec", node.name, sys.executable, "-m", "rdma_cni.cli.multus"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(conf).encode())
    proc.stdin.close()
    try:
        for _ in range(600):
            if marker.exists() or proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert marker.exists(), proc.stderr.read() if proc.stderr else ""
        os.kill(proc.pid, 9)  # `ip netns exec` execs in place: this pid is rdma-multus itself
        proc.wait(timeout=10)
    finally:
        if marker.exists():
            os.kill(int(marker.read_text()), 9)  # the orphaned delegate we started
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()
    assert links(pod) == {"lo", "eth0"}  # the default network was added, then we died

    # The hanging delegate is replaced by one that works, as after a fix; DEL must finish the job.
    hang.unlink()
    hang.symlink_to(REF / "macvlan")
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_json_annotation_sets_interface_name_mac_and_cni_args(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    text = json.dumps(
        [
            {
                "name": "tke-rdma-macvlan",
                "interface": "rdma7",
                "mac": "02:00:00:00:00:42",
                "cni-args": {"k": "v"},
            }
        ]
    )
    conf, pod, _ = node.added_pod(api, tmp_path, text)
    link = json.loads(sh("ip", "-n", pod, "-j", "link", "show", "rdma7").stdout)[0]
    assert link["address"] == "02:00:00:00:00:42"  # via runtimeConfig.mac: the plugin declares it
    (add,) = [c for c in node.delegate_calls() if c["cmd"] == "ADD"]
    assert add["stdin"]["args"] == {"cni": {"k": "v"}} and "MAC=02:00:00:00:00:42" in add["args"]
    assert "deviceIDs" not in add["stdin"].get("runtimeConfig", {})  # no checkpoint, no count: nothing
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_runtime_annotations_and_an_unreachable_api_still_start_the_pod(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    conf["runtimeConfig"] = {"io.kubernetes.cri.pod-annotations": {ANNOTATION: "tke-rdma-macvlan"}}
    api.stop()
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c1", pod, uid="no-checkpoint-entry")
    assert code == 0, result  # the device count is unknown, so the delegate uses its own default
    assert links(pod) == {"lo", "eth0", "net1"}
    stats = json.loads((node.cache_dir / "stats" / "network-status.json").read_text())
    assert stats["failures"] == 1 and "unreachable" in stats["lastError"]
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert node.leftovers() == CLEAN_NODE


def test_concurrent_pods_each_get_their_networks_and_the_token_is_never_logged(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-route-eni,tke-rdma-macvlan"})
    conf = node.config(api.kubeconfig(tmp_path / "kc", auth="token"), logLevel="debug")
    pods = [node.pod_netns() for _ in range(4)]

    def run(command: str, i: int) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": os.environ["PATH"], "CNI_COMMAND": command, "CNI_CONTAINERID": f"c{i}",
            "CNI_NETNS": f"/var/run/netns/{pods[i]}", "CNI_IFNAME": "eth0", "CNI_PATH": str(node.bin_dir),
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=ibv-app-0",
        }  # fmt: skip
        cmd = ["ip", "netns", "exec", node.name, sys.executable, "-m", "rdma_cni.cli.multus"]
        return subprocess.run(
            cmd, input=json.dumps(conf), capture_output=True, text=True, env=env, timeout=120
        )

    for command in ("ADD", "DEL"):
        with ThreadPoolExecutor(len(pods)) as pool:
            done = list(pool.map(lambda i: run(command, i), range(len(pods))))  # noqa: B023
        for proc in done:
            assert proc.returncode == 0, (proc.stdout, proc.stderr)
            assert api.token not in proc.stderr
        if command == "ADD":
            assert all(links(p) == {"lo", "eth0", "net1"} for p in pods)
            net1 = sorted(addrs(p, "net1")[0] for p in pods)
            assert len(set(net1)) == 4  # host-local gave each pod its own address
    assert all(links(p) == {"lo"} for p in pods)
    assert node.leftovers() == CLEAN_NODE
    log_text = (node.root / "multus.log").read_text()
    assert "delegate ADD tke-rdma-macvlan" in log_text and api.token not in log_text


def test_del_with_an_unreadable_plan_recovers_from_the_result_caches(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-route-eni,tke-rdma-macvlan")
    (plan,) = (node.cache_dir / "attachments").iterdir()
    plan.write_text('{"containerID": "c1", "delegates": [tor')  # a disk fault, not something we write
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def test_rollback_keeps_what_would_not_delete_for_the_runtimes_del(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """ADD fails at the 2nd network and the 1st refuses DEL: the plan keeps the 1st, DEL retries it."""
    flag, conf, pod = _failed_add_the_default_network_will_not_undo(
        node, api, tmp_path, msg="busy, try again"
    )
    assert links(pod) == {"lo", "eth0"}  # h5-flaky refused to go
    plan = json.loads((node.cache_dir / "attachments" / "c1-eth0.json").read_text())
    assert [d["network"] for d in plan["delegates"]] == ["h5-flaky"]
    code, out = node.run("DEL", conf, "c1", pod)
    assert code != 0 and out["code"] == 11  # still refusing: the runtime will retry
    flag.unlink()
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert node.leftovers() == CLEAN_NODE


def _flaky_default_network(node: Node, flag: Path, msg: str = "delegate store unreachable") -> None:
    """Network ``h5-flaky``: ptp + host-local through a binary that answers DEL with error 11
    (``msg``) while ``flag`` exists, and otherwise runs the real ptp."""
    path = node.bin_dir / "flaky-ptp"
    path.write_text(
        "#!/bin/sh\n"
        f'if [ "$CNI_COMMAND" = DEL ] && [ -e {flag} ]; then\n'
        f'  echo \'{{"cniVersion":"1.0.0","code":11,"msg":"{msg}"}}\'; exit 1\n'
        "fi\n"
        f"exec {REF / 'ptp'}\n"
    )
    path.chmod(0o755)
    node.network("h5-flaky", {"plugins": [{
        "type": "flaky-ptp", "ipMasq": False,
        "ipam": {"type": "host-local", "dataDir": str(node.ipam_dir),
                 "ranges": [[{"subnet": "198.51.100.0/26"}]]}}]})  # fmt: skip


def _failed_add_the_default_network_will_not_undo(
    node: Node, api: KubeServer, tmp: Path, msg: str = "delegate store unreachable"
) -> tuple[Path, dict[str, Any], str]:
    """ADD of a pod whose 2nd network (h5-broken) fails while its 1st (h5-flaky) refuses DEL:
    (the flag that makes it refuse, the config, the pod netns)."""
    flag = tmp / "refuse-del"
    _flaky_default_network(node, flag, msg=msg)
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "h5-broken"})
    conf = node.config(api.kubeconfig(tmp / "kc"), defaultDelegates="h5-flaky")
    pod = node.pod_netns()
    flag.touch()
    code, err = node.run("ADD", conf, "c1", pod)
    assert code != 0 and "h5-broken" in err["msg"]
    return flag, conf, pod


def _assert_del_succeeds_then_the_next_pod_gets_its_networks(
    node: Node, conf: dict[str, Any], pod: str
) -> None:
    """The (retried) DEL of c1 succeeds and leaves nothing; then a pod c2 gets both networks."""
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    pod = node.pod_netns()
    code, result = node.run("ADD", conf, "c2", pod)
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "net1"}
    assert node.run("DEL", conf, "c2", pod)[0] == 0
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE


def _kept(node: Node) -> tuple[list[str], list[str]]:
    """(networks still in the plan of c1/eth0, result-cache files left)."""
    plan = json.loads((node.cache_dir / "attachments" / "c1-eth0.json").read_text())
    results = sorted(p.name for p in (node.cache_dir / "results").iterdir())
    return [d["network"] for d in plan["delegates"]], results


def test_del_with_a_delegate_binary_gone_deletes_the_others_and_keeps_only_it(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-route-eni,tke-rdma-macvlan")
    wrapper = node.bin_dir / "logged-macvlan"
    body = wrapper.read_text()
    wrapper.unlink()  # the RDMA network's plugin was uninstalled while the pod ran
    code, out = node.run("DEL", conf, "c1", pod)
    assert code != 0 and out["code"] == 7, out
    assert "tke-rdma-macvlan (net1)" in out["msg"] and "logged-macvlan" in out["msg"]
    assert links(pod) == {"lo", "net1"}  # the default network is deleted all the same
    assert _kept(node) == (["tke-rdma-macvlan"], ["tke-rdma-macvlan-c1-net1"])
    code, out = node.run("DEL", conf, "c1", pod)  # the retry tries only what is left
    assert code != 0 and out["code"] == 7
    wrapper.write_text(body)
    wrapper.chmod(0o755)
    _assert_del_succeeds_then_the_next_pod_gets_its_networks(node, conf, pod)


def test_del_with_a_failing_delegate_deletes_the_others_and_retries_only_it(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    flag = tmp_path / "refuse-del"
    _flaky_default_network(node, flag)
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-rdma-macvlan", defaultDelegates="h5-flaky")
    flag.touch()
    code, out = node.run("DEL", conf, "c1", pod)
    assert code != 0 and out["code"] == 11 and "h5-flaky (eth0)" in out["msg"], out
    assert links(pod) == {"lo", "eth0"}  # net1 went although the default network refused
    assert _kept(node) == (["h5-flaky"], ["h5-flaky-c1-eth0"])
    flag.unlink()
    _assert_del_succeeds_then_the_next_pod_gets_its_networks(node, conf, pod)


def test_a_delegate_type_that_can_never_run_is_skipped_on_del(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """ADD refuses a plugin type that is a path (7, before anything runs); a plan that holds one
    anyway (written by an older rdma-multus, or edited) is skipped on DEL with an error in the log,
    so the pod can still go away, and the other networks are deleted."""
    node.network("h5-pathy", {"plugins": [{"type": "../../../bin/sh"}]})
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "h5-pathy"})
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    pod = node.pod_netns()
    code, err = node.run("ADD", conf, "c1", pod)
    assert code != 0 and err["code"] == 7 and "plain executable name" in err["msg"], err
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-rdma-macvlan"})
    code, result = node.run("ADD", conf, "c1", pod)
    assert code == 0, result
    plan_file = node.cache_dir / "attachments" / "c1-eth0.json"
    plan = json.loads(plan_file.read_text())
    rdma = next(d for d in plan["delegates"] if d["network"] == "tke-rdma-macvlan")
    rdma["config"] = rdma["config"].replace('"logged-macvlan"', '"../../../bin/sh"')
    plan_file.write_text(json.dumps(plan))
    code, out = node.run("DEL", conf, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo", "net1"}  # eth0 deleted; net1's plugin could never be run
    assert "plugin type '../../../bin/sh' can never run: skipped" in (node.root / "multus.log").read_text()
    assert not plan_file.exists() and node.leftovers()["cache"] == []


def test_multus_refuses_its_own_netns_and_passes_the_override_on(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-rdma-macvlan"})
    conf = node.config(api.kubeconfig(tmp_path / "kc"))
    code, err = node.run("ADD", conf, "c1", node.name)  # the node netns: where the plugin runs
    assert code != 0 and err["code"] == 8, err
    assert err["msg"] == "plugin's netns and netns from CNI_NETNS should not be the same"
    assert node.leftovers() == CLEAN_NODE
    assert node.delegate_calls() == []


def test_add_after_a_failed_add_undoes_the_recorded_attempt_first(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """ADD fails at the 2nd network and the 1st will not DEL; the runtime's retry with a fixed
    annotation undoes the recorded attempt by DEL's rules before it runs anything."""
    flag, conf, pod = _failed_add_the_default_network_will_not_undo(node, api, tmp_path)
    api.add_pod("default", "ibv-app-0", annotations={ANNOTATION: "tke-rdma-macvlan"})
    code, err = node.run("ADD", conf, "c1", pod)  # the earlier attempt still will not go
    assert code != 0 and err["code"] == 11 and "earlier ADD" in err["msg"], err
    assert links(pod) == {"lo", "eth0"}
    flag.unlink()
    code, result = node.run("ADD", conf, "c1", pod)
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "net1"}
    assert node.run("DEL", conf, "c1", pod)[0] == 0
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE


def test_del_with_a_config_broken_after_add_still_deletes_every_network(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, _ = node.added_pod(api, tmp_path, "tke-route-eni,tke-rdma-macvlan")
    broken = {**conf, "apiTimeoutSeconds": "soon", "defaultDelegates": 5}
    code, out = node.run("DEL", broken, "c1", pod)
    assert code == 0, out
    assert links(pod) == {"lo"} and node.leftovers() == CLEAN_NODE
    assert "using its default to clean up" in (node.root / "multus.log").read_text()
