"""rdma-multus with the shared-mode network ``tke-rdma-ipvlan``: Debian's ``ptp`` as the cluster
network, the real rdma-ipvlan (``link: macvlan``, ``rdma.required: true``) on a simulated RDMA node
of two veth bonds, the pod's shared-pool devices in kubelet's checkpoint, its annotation from the
runtime (as containerd passes it). The pair belongs together: the delegate config names the
shared pool in ``resourceName``."""

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
from ipvlan_support import Shared
from netns import REPO, Node, Pod, policy_env
from simnode import sim_node

from rdma_cni.sim.sync import wait_watched

pytestmark = pytest.mark.netns

REF = Path("/usr/lib/cni")
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
ANNOTATION = "tke.cloud.tencent.com/networks"
CRI = "io.kubernetes.cri.pod-annotations"

if not (REF / "ptp").exists():
    pytest.skip("needs Debian's containernetworking-plugins", allow_module_level=True)


@dataclass
class SharedNode:
    s: Shared
    root: Path

    def config(self, annotation: str) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0", "name": "tke-multus", "type": "rdma-multus", "kubeconfig": "",
            "confDir": str(self.root / "net.d"), "defaultDelegates": "tke-route-eni",
            "binDirs": [str(self.root / "bin")], "cacheDir": str(self.root / "cache"),
            "kubeletRootDir": str(self.root / "kubelet"), "logFile": str(self.root / "multus.log"),
            "runtimeConfig": {CRI: {ANNOTATION: annotation}},
        }  # fmt: skip

    def run(self, command: str, conf: dict[str, Any], pod: Pod, uid: str) -> tuple[int, Any]:
        env = {
            "PATH": os.environ["PATH"], "PYTHONPATH": REPO, "CNI_COMMAND": command, **policy_env(),
            "CNI_CONTAINERID": uid,
            "CNI_NETNS": pod.path, "CNI_IFNAME": "eth0", "CNI_PATH": str(self.root / "bin"),
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p-{uid};K8S_POD_UID={uid}",
        }  # fmt: skip
        proc = subprocess.run(
            ["ip", "netns", "exec", self.s.n.name, sys.executable, "-m", "rdma_cni.cli.multus"],
            input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr

    def checkpoint(self, holders: dict[str, list[str]]) -> None:
        """Pod UID -> the shared pool's (virtual) device IDs kubelet gave it."""
        path = self.root / "kubelet" / "device-plugins" / "kubelet_internal_checkpoint"
        entries = [{"PodUID": uid, "ContainerName": "trainer", "ResourceName": RESOURCE,
                    "DeviceIDs": {"0": ids}, "AllocResp": ""} for uid, ids in holders.items()]  # fmt: skip
        doc = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 1}
        path.write_text(json.dumps(doc))

    def pod(self) -> Pod:
        pod = self.s.n.pod()
        wait_watched(f"/run/netns/{self.s.n.name}", pod.path)
        return pod

    def warnings(self) -> list[str]:
        return [line for line in (self.root / "multus.log").read_text().splitlines() if "WARNING" in line]


def _network(root: Path, name: str, plugin: dict[str, Any]) -> None:
    (root / "net.d" / f"{name}.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": name, "plugins": [plugin]})
    )


@pytest.fixture
def shared(node_ns: Node) -> Iterator[SharedNode]:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    root = Path(n.tmp) / "k"
    for d in ("net.d", "bin", "cache", "kubelet/pod-resources", "kubelet/device-plugins"):
        (root / d).mkdir(parents=True)
    for plugin in ("ptp", "host-local", "loopback"):
        (root / "bin" / plugin).symlink_to(REF / plugin)
    wrapper = root / "bin" / "rdma-ipvlan"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m rdma_cni.cli.ipvlan\n")
    wrapper.chmod(0o755)
    sysfs = os.path.join(n.tmp, "sys")
    _network(root, "tke-route-eni", {
        "type": "ptp", "ipMasq": False,
        "ipam": {"type": "host-local", "dataDir": str(root / "ipam"),
                 "ranges": [[{"subnet": "203.0.113.64/26"}]]},
    })  # fmt: skip
    _network(root, "tke-rdma-ipvlan", s.config(
        masters=["bond0", "bond1"], resourceName=RESOURCE, sysfsRoot=sysfs,
        rdma={"required": True, "gidTimeoutMs": 5000}, logFile=str(root / "rdma-ipvlan.log"),
    ))  # fmt: skip
    with sim_node(sysfs, ["bond0", "bond1"], n.name, f"h2-{n.tag}-pod-"):
        yield SharedNode(s, root)


def test_two_pods_with_shared_pool_devices_share_every_bond_and_get_no_advice(shared: SharedNode) -> None:
    r = shared
    r.checkpoint({"u-1": ["17"], "u-2": ["942"]})
    conf = r.config("tke-route-eni,tke-rdma-ipvlan")
    pods = [r.pod(), r.pod()]
    for i, uid in enumerate(("u-1", "u-2")):
        code, result = r.run("ADD", conf, pods[i], uid)
        assert code == 0, result
        names = [x["name"] for x in result["interfaces"]]
        assert "eth0" in names and "bond0" in names and "bond1" in names, names
        assert r.s.pod_addresses(pods[i])["bond0"] == [f"198.51.100.{3 + i}/28"]
    assert r.s.held() == {
        "bond0": {"198.51.100.3": "u-1", "198.51.100.4": "u-2"},
        "bond1": {"198.51.100.19": "u-1", "198.51.100.20": "u-2"},
    }
    assert not [w for w in r.warnings() if "names no network using them" in w or "no tke" in w], r.warnings()
    for i, uid in enumerate(("u-1", "u-2")):
        assert r.run("DEL", conf, pods[i], uid)[0] == 0
    assert r.s.held() == {}


def test_shared_pool_devices_without_the_network_warn_naming_tke_rdma_ipvlan(shared: SharedNode) -> None:
    r = shared
    r.checkpoint({"u-1": ["5"]})
    pod = r.pod()
    code, result = r.run("ADD", r.config("tke-route-eni"), pod, "u-1")
    assert code == 0, result
    assert r.s.pod_links(pod) == ["eth0", "lo"]
    warned = [w for w in r.warnings() if "names no network using them" in w and "tke-rdma-ipvlan" in w]
    assert warned, r.warnings()
    assert r.run("DEL", r.config("tke-route-eni"), pod, "u-1")[0] == 0


def test_the_network_without_shared_pool_devices_gets_its_interfaces_and_a_warning(
    shared: SharedNode,
) -> None:
    r = shared
    r.checkpoint({})
    pod = r.pod()
    conf = r.config("tke-route-eni,tke-rdma-ipvlan")
    code, result = r.run("ADD", conf, pod, "u-9")
    assert code == 0, result
    assert r.s.pod_links(pod) == ["bond0", "bond1", "eth0", "lo"]
    assert any("tke-rdma-ipvlan" in w and "will see no RDMA device" in w for w in r.warnings()), r.warnings()
    assert r.run("DEL", conf, pod, "u-9")[0] == 0
    assert r.s.held() == {}
