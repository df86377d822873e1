"""Shared mode by DRA claim: a claim with ``allocationMode: All`` over the driver's multi-allocatable
bonds (each allocation a share of the ``shares`` capacity, reported with a ``share_id``) makes a pod
exactly what a device-plugin shared pod is — rdma-multus runs ``tke-rdma-ipvlan`` and every pod gets
an address of its own on every bond — with the claim's devices read from kubelet's PodResources API.

Debian's ``ptp`` as the cluster network, the real rdma-ipvlan (``link: macvlan``, ``rdma.required:
true``) on a simulated RDMA node of two veth bonds, a test kubelet serving PodResources v1.
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
from ipvlan_support import Shared
from netns import REPO, Node, Pod, policy_env
from simnode import sim_node

from rdma_cni.devices.dra_names import DRIVER
from rdma_cni.sim.sync import wait_watched
from tests.podresources_server import PodResourcesServer, claim, device

pytestmark = pytest.mark.netns

REF = Path("/usr/lib/cni")
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
ANNOTATION = "tke.cloud.tencent.com/networks"
CRI = "io.kubernetes.cri.pod-annotations"
POOL = "node-1"

if not (REF / "ptp").exists():
    pytest.skip("needs Debian's containernetworking-plugins", allow_module_level=True)


@dataclass
class SharedDra:
    s: Shared
    root: Path
    kubelet: PodResourcesServer

    def config(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0", "name": "tke-multus", "type": "rdma-multus", "kubeconfig": "",
            "confDir": str(self.root / "net.d"), "defaultDelegates": "tke-route-eni",
            "binDirs": [str(self.root / "bin")], "cacheDir": str(self.root / "cache"),
            "kubeletRootDir": str(self.root / "kubelet"), "logFile": str(self.root / "multus.log"),
            "runtimeConfig": {CRI: {ANNOTATION: "tke-route-eni,tke-rdma-ipvlan"}},
        }  # fmt: skip

    def run(self, command: str, pod: Pod, uid: str) -> tuple[int, Any]:
        env = {
            "PATH": os.environ["PATH"], "PYTHONPATH": REPO, "CNI_COMMAND": command, **policy_env(),
            "CNI_CONTAINERID": uid,
            "CNI_NETNS": pod.path, "CNI_IFNAME": "eth0", "CNI_PATH": str(self.root / "bin"),
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p-{uid};K8S_POD_UID={uid}",
        }  # fmt: skip
        proc = subprocess.run(
            ["ip", "netns", "exec", self.s.n.name, sys.executable, "-m", "rdma_cni.cli.multus"],
            input=json.dumps(self.config()), env=env, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr

    def holds(self, uid: str, *claims: Any) -> None:
        """Pod ``p-<uid>``'s container ``trainer`` holds ``claims`` (kubelet's PodResources)."""
        self.kubelet.set_pod("default", f"p-{uid}", {"trainer": {}}, claims={"trainer": list(claims)})

    def pod(self) -> Pod:
        pod = self.s.n.pod()
        wait_watched(f"/run/netns/{self.s.n.name}", pod.path)
        return pod

    def warnings(self) -> list[str]:
        return [line for line in (self.root / "multus.log").read_text().splitlines() if "WARNING" in line]


def every_bond(uid: str) -> Any:
    """The pod's shared claim: every bond, each allocation a share of its own."""
    shares = [device(DRIVER, POOL, f"bond{i}", share_id=f"{uid}-share-{i}") for i in range(2)]
    return claim("default", f"rdma-shared-{uid}", *shares)


def _network(root: Path, name: str, plugin: dict[str, Any]) -> None:
    (root / "net.d" / f"{name}.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": name, "plugins": [plugin]})
    )


@pytest.fixture
def shared(node_ns: Node) -> Iterator[SharedDra]:
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
    with (
        sim_node(sysfs, ["bond0", "bond1"], n.name, f"h2-{n.tag}-pod-"),
        PodResourcesServer(str(root / "kubelet" / "pod-resources" / "kubelet.sock")) as kubelet,
    ):
        yield SharedDra(s, root, kubelet)


def test_pods_holding_a_shared_claim_share_every_bond_each_with_its_own_addresses(shared: SharedDra) -> None:
    r = shared
    pods = {uid: r.pod() for uid in ("u-1", "u-2")}
    for i, (uid, pod) in enumerate(pods.items()):
        r.holds(uid, every_bond(uid))
        code, result = r.run("ADD", pod, uid)
        assert code == 0, result
        names = [x["name"] for x in result["interfaces"]]
        assert "eth0" in names and "bond0" in names and "bond1" in names, names
        assert r.s.pod_addresses(pod)["bond0"] == [f"198.51.100.{3 + i}/28"]
        assert r.s.pod_addresses(pod)["bond1"] == [f"198.51.100.{19 + i}/28"]
    assert r.s.held() == {
        "bond0": {"198.51.100.3": "u-1", "198.51.100.4": "u-2"},
        "bond1": {"198.51.100.19": "u-1", "198.51.100.20": "u-2"},
    }
    for bond, peer in (("bond0", "198.51.100.1"), ("bond1", "198.51.100.17")):
        for pod in pods.values():
            assert r.s.n.ping(pod, peer, bond), (bond, pod)
    assert r.s.n.ping(pods["u-1"], "198.51.100.4", "bond0")  # and each other, over the bond
    assert not [w for w in r.warnings() if "holds no" in w or "names no network" in w], r.warnings()
    for uid, pod in pods.items():
        assert r.run("DEL", pod, uid)[0] == 0
    assert r.s.held() == {}


def test_a_pod_whose_claims_hold_no_bond_of_ours_warns_as_a_shared_pod_without_devices(
    shared: SharedDra,
) -> None:
    r = shared
    r.holds("u-1", claim("default", "gpus", device("gpu.nvidia.com", POOL, "gpu-0")))
    pod = r.pod()
    code, result = r.run("ADD", pod, "u-1")
    assert code == 0, result
    assert r.s.pod_links(pod) == ["bond0", "bond1", "eth0", "lo"]
    warned = [w for w in r.warnings() if "tke-rdma-ipvlan" in w and "will see no RDMA device" in w]
    assert warned and DRIVER in warned[0], r.warnings()
    assert r.run("DEL", pod, "u-1")[0] == 0 and r.s.held() == {}


def test_a_shared_claim_naming_a_bond_the_network_lacks_fails_add_and_changes_nothing(
    shared: SharedDra,
) -> None:
    r = shared
    before = r.s.n.snapshot()
    r.holds("u-1", claim("default", "rdma-shared", device(DRIVER, POOL, "bond0", share_id="s0"),
                         device(DRIVER, POOL, "bond2", share_id="s2")))  # fmt: skip
    pod = r.pod()
    code, err = r.run("ADD", pod, "u-1")
    assert code != 0 and err["code"] == 7, err
    assert "'bond2' (claim default/rdma-shared)" in err["msg"] and "tke-rdma-ipvlan" in err["msg"], err
    assert r.s.pod_links(pod) == ["lo"] and r.s.held() == {} and r.s.n.snapshot() == before
    assert r.run("DEL", pod, "u-1")[0] == 0
