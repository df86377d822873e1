"""rdma-multus takes the pod's RDMA devices from kubelet's PodResources API, so the bonds a pod gets
are exactly the devices kubelet mounted in it.

A simulated 8-bond RDMA node (:mod:`rdma_cni.sim.node` over eight veth "bonds" in a node netns,
``mlx5_bond_N`` over ``bondN``), the real rdma-multus with Debian's ``ptp`` as the cluster network and
the real rdma-macvlan (``rdma.required: true``) as ``tke-rdma-macvlan``, and a test kubelet serving the
real PodResources v1 API on a unix socket. The pod's annotation comes from the runtime
(``io.kubernetes.cri.pod-annotations``), as containerd passes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from netns import REPO, Node, Pod, policy_env

from rdma_cni.sim.daemon import daemon
from rdma_cni.sim.sync import wait_watched
from tests.podresources_server import PodResourcesServer

pytestmark = pytest.mark.netns

REF = Path("/usr/lib/cni")
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
ANNOTATION = "tke.cloud.tencent.com/networks"
CRI = "io.kubernetes.cri.pod-annotations"
BONDS = [f"bond{i}" for i in range(8)]
HOST = {f"bond{i}": f"198.51.100.{16 * i + 2}/28" for i in range(8)}
PEER = {f"bond{i}": f"198.51.100.{16 * i + 1}" for i in range(8)}  # the switch side of each bond

if not (REF / "ptp").exists():
    pytest.skip("needs Debian's containernetworking-plugins", allow_module_level=True)


@dataclass
class Rdma8:
    node: Node
    root: Path  # everything of this test's kubelet, CNI configs and binaries

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def socket(self) -> str:
        return str(self.kubelet / "pod-resources" / "kubelet.sock")

    def config(self, annotation: str | None = "tke-route-eni,tke-rdma-macvlan", **extra: Any) -> (
        dict[str, Any]
    ):  # fmt: skip
        conf: dict[str, Any] = {
            "cniVersion": "1.0.0", "name": "tke-multus", "type": "rdma-multus", "kubeconfig": "",
            "confDir": str(self.root / "net.d"), "defaultDelegates": "tke-route-eni",
            "binDirs": [str(self.root / "bin")], "cacheDir": str(self.root / "cache"),
            "kubeletRootDir": str(self.kubelet), "logFile": str(self.root / "multus.log"), **extra,
        }  # fmt: skip
        if annotation is not None:
            conf["runtimeConfig"] = {CRI: {ANNOTATION: annotation}}
        return conf

    def run(self, command: str, conf: dict[str, Any], pod: Pod | None, uid: str = "u-1") -> tuple[int, Any]:
        env = {
            "PATH": os.environ["PATH"], "PYTHONPATH": REPO, "CNI_COMMAND": command, **policy_env(),
            "CNI_CONTAINERID": "c1",
            "CNI_NETNS": pod.path if pod else "", "CNI_IFNAME": "eth0", "CNI_PATH": str(self.root / "bin"),
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=ibv-app-0;K8S_POD_UID={uid}",
        }  # fmt: skip
        proc = subprocess.run(
            ["ip", "netns", "exec", self.node.name, sys.executable, "-m", "rdma_cni.cli.multus"],
            input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr

    def checkpoint(self, uid: str, ids: list[str]) -> None:
        path = self.kubelet / "device-plugins" / "kubelet_internal_checkpoint"
        path.parent.mkdir(parents=True, exist_ok=True)
        entry = {"PodUID": uid, "ContainerName": "trainer", "ResourceName": RESOURCE,
                 "DeviceIDs": {"0": ids}, "AllocResp": ""}  # fmt: skip
        doc = {"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {}}, "Checksum": 1}
        path.write_text(json.dumps(doc))

    def kubelet_says(self, ids: list[str], **kw: Any) -> PodResourcesServer:
        server = PodResourcesServer(self.socket, **kw)
        server.set_pod("default", "ibv-app-0", {"trainer": {RESOURCE: ids}})
        return server

    def pod(self) -> Pod:
        pod = self.node.pod()
        wait_watched(f"/run/netns/{self.node.name}", pod.path)
        return pod

    def host(self) -> dict[str, str]:
        """bond -> its IPv4 CIDR on the node ("" when it has none: lent to a pod)."""
        out = {}
        for link in self.node.node_json("addr"):
            if link["ifname"] in BONDS:
                v4 = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
                out[link["ifname"]] = v4[0] if v4 else ""
        return out

    def in_pod(self, pod: Pod) -> dict[str, str]:
        """bond-named interfaces in the pod -> their IPv4 CIDR."""
        out = {}
        for link in self.node.pod_json(pod, "addr"):
            if link["ifname"] in BONDS:
                v4 = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
                out[link["ifname"]] = v4[0] if v4 else ""
        return out


def _network(root: Path, name: str, plugin: dict[str, Any]) -> None:
    (root / "net.d" / f"{name}.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": name, "plugins": [plugin]})
    )


@pytest.fixture
def rdma8(node_ns: Node) -> Iterator[Rdma8]:
    n = node_ns
    for bond in BONDS:
        n.bond(bond, HOST[bond], peer=f"{PEER[bond]}/28")
    root = Path(n.tmp) / "k"
    for d in ("net.d", "bin", "cache", "kubelet/pod-resources", "kubelet/device-plugins"):
        (root / d).mkdir(parents=True)
    for plugin in ("ptp", "host-local", "loopback"):
        (root / "bin" / plugin).symlink_to(REF / plugin)
    wrapper = root / "bin" / "rdma-macvlan"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m rdma_cni.cli.macvlan\n")
    wrapper.chmod(0o755)
    sysfs = os.path.join(n.tmp, "sys")
    _network(root, "tke-route-eni", {
        "type": "ptp", "ipMasq": False,
        "ipam": {"type": "host-local", "dataDir": str(root / "ipam"),
                 "ranges": [[{"subnet": "203.0.113.0/26"}]]},
    })  # fmt: skip
    _network(root, "tke-rdma-macvlan", {
        "type": "rdma-macvlan", "masters": BONDS, "resourceName": RESOURCE, "sysfsRoot": sysfs,
        "rdma": {"required": True, "gidTimeoutMs": 5000}, "dataDir": n.data_dir, "runDir": n.run_dir,
        "logFile": str(root / "rdma-macvlan.log"),
    })  # fmt: skip
    args = ["--sysfs-root", sysfs, "--bonds", ",".join(BONDS), "--node-netns", f"/run/netns/{n.name}",
            "--pods-dir", "/run/netns", "--pods-prefix", f"h2-{n.tag}-pod-", "--gid-slots", "16"]  # fmt: skip
    with daemon(args):
        yield Rdma8(n, root)


def test_pod_gets_exactly_the_four_bonds_kubelet_allocated_of_eight(rdma8: Rdma8) -> None:
    r = rdma8
    before = r.node.snapshot()
    r.checkpoint("u-1", ["mlx5_bond_0", "mlx5_bond_2"])  # stale: PodResources is asked first and wins
    pod = r.pod()
    with r.kubelet_says(["mlx5_bond_1", "mlx5_bond_3", "mlx5_bond_4", "mlx5_bond_6"]) as kubelet:
        code, result = r.run("ADD", r.config(), pod)
        assert code == 0, result
        assert kubelet.calls == ["Get"]
    mine = ["bond1", "bond3", "bond4", "bond6"]
    assert r.in_pod(pod) == {b: HOST[b] for b in mine}
    assert r.host() == {b: ("" if b in mine else HOST[b]) for b in BONDS}
    assert {HOST[b] for b in mine} <= {ip["address"] for ip in result["ips"]}
    for bond in mine:  # the pod's interfaces pass traffic to the switch behind their bond
        assert r.node.ping(pod, PEER[bond], bond), bond
    code, out = r.run("DEL", r.config(), pod)
    assert code == 0, out
    assert r.host() == HOST and r.node.snapshot() == before


@pytest.mark.parametrize("get", ["absent", "disabled"])
def test_a_kubelet_without_get_is_asked_with_list(rdma8: Rdma8, get: str) -> None:
    r = rdma8
    pod = r.pod()
    with r.kubelet_says(["mlx5_bond_5", "mlx5_bond_7"], get=get) as kubelet:
        code, result = r.run("ADD", r.config(), pod)
        assert code == 0, result
        assert kubelet.calls[-1] == "List"
    assert r.in_pod(pod) == {"bond5": HOST["bond5"], "bond7": HOST["bond7"]}
    assert r.run("DEL", r.config(), pod)[0] == 0 and r.host() == HOST


def test_without_the_pod_resources_socket_the_checkpoint_says(rdma8: Rdma8) -> None:
    r = rdma8
    r.checkpoint("u-1", ["mlx5_bond_2", "mlx5_bond_5"])
    pod = r.pod()
    code, result = r.run("ADD", r.config(), pod)
    assert code == 0, result
    assert r.in_pod(pod) == {"bond2": HOST["bond2"], "bond5": HOST["bond5"]}
    assert "no kubelet PodResources socket" in (r.root / "multus.log").read_text()
    assert r.run("DEL", r.config(), pod)[0] == 0 and r.host() == HOST


def test_a_kubelet_that_does_not_answer_falls_back_to_the_checkpoint(rdma8: Rdma8) -> None:
    r = rdma8
    r.checkpoint("u-1", ["mlx5_bond_6"])
    with r.kubelet_says(["mlx5_bond_1"], malformed=True):
        pod = r.pod()
        code, result = r.run("ADD", r.config(), pod)
    assert code == 0, result
    assert r.in_pod(pod) == {"bond6": HOST["bond6"]}
    log = (r.root / "multus.log").read_text()
    assert "WARNING" in log and "not a PodResources v1 message" in log and "device checkpoint instead" in log
    assert r.run("DEL", r.config(), pod)[0] == 0 and r.host() == HOST


def test_opaque_ids_of_a_shared_device_plugin_count(rdma8: Rdma8) -> None:
    """Mellanox's shared plugin hands out "0", "1"…: they say how many bonds, not which."""
    r = rdma8
    pod = r.pod()
    with r.kubelet_says(["7", "12", "999"]):
        code, result = r.run("ADD", r.config(), pod)
    assert code == 0, result
    assert r.in_pod(pod) == {b: HOST[b] for b in ("bond0", "bond1", "bond2")}  # the first free ones
    assert r.run("DEL", r.config(), pod)[0] == 0 and r.host() == HOST


def test_devices_but_an_unreadable_annotation_fails_add_naming_both_fixes(rdma8: Rdma8) -> None:
    r = rdma8
    before = r.node.snapshot()
    pod = r.pod()
    with r.kubelet_says(["mlx5_bond_1", "mlx5_bond_3"]):
        code, err = r.run("ADD", r.config(annotation=None), pod)  # no kubeconfig, no runtime annotations
    assert code != 0 and err["code"] == 7, err
    msg = err["msg"]
    assert "mlx5_bond_1, mlx5_bond_3" in msg and ANNOTATION in msg, msg
    assert '"kubeconfig"' in msg and CRI in msg, msg
    assert {link["ifname"] for link in r.node.pod_json(pod, "link")} == {"lo"}
    assert r.node.snapshot() == before and r.node.state_files() == []
    assert r.run("DEL", r.config(annotation=None), pod)[0] == 0  # what the runtime sends next


def test_no_devices_and_an_unreadable_annotation_is_the_cluster_network_only(rdma8: Rdma8) -> None:
    r = rdma8
    pod = r.pod()
    with r.kubelet_says([]):
        code, result = r.run("ADD", r.config(annotation=None), pod)
    assert code == 0, result
    assert {link["ifname"] for link in r.node.pod_json(pod, "link")} == {"lo", "eth0"}
    assert r.run("DEL", r.config(annotation=None), pod)[0] == 0


def test_an_annotation_without_the_rdma_network_starts_with_a_warning(rdma8: Rdma8) -> None:
    r = rdma8
    r.checkpoint("u-1", ["mlx5_bond_4"])
    pod = r.pod()
    with r.kubelet_says(["mlx5_bond_4"]) as kubelet:
        code, result = r.run("ADD", r.config(annotation="tke-route-eni"), pod)
        assert kubelet.calls == []  # a pod without RDMA networks pays for no gRPC call
    assert code == 0, result
    assert {link["ifname"] for link in r.node.pod_json(pod, "link")} == {"lo", "eth0"}
    warn = [line for line in (r.root / "multus.log").read_text().splitlines() if "WARNING" in line]
    assert any("mlx5_bond_4" in line and "names no network using them" in line for line in warn), warn
    assert r.run("DEL", r.config(annotation="tke-route-eni"), pod)[0] == 0
