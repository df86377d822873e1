"""Under DRA the network stays the CNI's: rdma-multus learns which bonds a pod's claims hold from
kubelet's PodResources API (``dynamic_resources``, kubelet >= 1.34) or, without it, kubelet's DRA
checkpoint, and rdma-macvlan moves exactly those bonds' IPs in with the host's GID index; DEL gives
them back, as for device-plugin devices.

A simulated 8-bond RDMA node (mlx5 GID layout: a bond's IPv4 RoCE v2 GID at index 3) over veth
"bonds" in a node netns, the real rdma-multus with Debian's ``ptp`` as the cluster network and the
real rdma-macvlan (``rdma.required: true``) as ``tke-rdma-macvlan``, and a test kubelet serving the
real PodResources v1 API on a unix socket. One bond's netdev, ``Rdma_7``, is no DNS label: the DRA
driver publishes it as device ``rdma-7`` (:func:`rdma_cni.devices.dra_names.device_name`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from netns import REPO, Node, Pod, policy_env

from rdma_cni.devices.dra_names import DRIVER
from rdma_cni.kube import dra_checkpoint
from rdma_cni.rdma import gid, records
from rdma_cni.sim.daemon import daemon
from rdma_cni.sim.sync import wait_watched
from tests.podresources_server import PodResourcesServer, claim, device

pytestmark = pytest.mark.netns

REF = Path("/usr/lib/cni")
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
ANNOTATION = "tke.cloud.tencent.com/networks"
CRI = "io.kubernetes.cri.pod-annotations"
GPU = "gpu.nvidia.com"
POOL = "node-1"  # the driver publishes one pool per node, named after it
BONDS = [f"bond{i}" for i in range(7)] + ["Rdma_7"]
HCA = {b: f"mlx5_bond_{i}" for i, b in enumerate(BONDS)}
HOST = {b: f"198.51.100.{16 * i + 2}/28" for i, b in enumerate(BONDS)}
PEER = {b: f"198.51.100.{16 * i + 1}" for i, b in enumerate(BONDS)}  # the switch side of each bond
HOST_GID_INDEX = 3  # mlx5: v1 and v2 GIDs of the link-local address first, then the IPv4 v1, v2

if not (REF / "ptp").exists():
    pytest.skip("needs Debian's containernetworking-plugins", allow_module_level=True)


@dataclass
class DraNode:
    node: Node
    root: Path  # everything of this test's kubelet, CNI configs and binaries
    sysfs: str

    @property
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    def config(self, annotation: str | None = "tke-route-eni,tke-rdma-macvlan") -> dict[str, Any]:
        """rdma-multus's config; ``annotation`` None: neither the runtime nor an API can tell it."""
        conf: dict[str, Any] = {
            "cniVersion": "1.0.0", "name": "tke-multus", "type": "rdma-multus", "kubeconfig": "",
            "confDir": str(self.root / "net.d"), "defaultDelegates": "tke-route-eni",
            "binDirs": [str(self.root / "bin")], "cacheDir": str(self.root / "cache"),
            "kubeletRootDir": str(self.kubelet), "logFile": str(self.root / "multus.log"),
        }  # fmt: skip
        if annotation is not None:
            conf["runtimeConfig"] = {CRI: {ANNOTATION: annotation}}
        return conf

    def dra_checkpoint(self, uid: str, claim_name: str, names: list[str]) -> None:
        """Kubelet's ``dra_manager_state``: pod ``uid`` holds claim ``claim_name`` of our devices."""
        found = [{"PoolName": POOL, "DeviceName": n, "ShareID": None, "RequestNames": ["nics"],
                  "CDIDeviceIDs": []} for n in names]  # fmt: skip
        state = [{"ClaimUID": "c-uid", "ClaimName": claim_name, "Namespace": "default", "PodUIDs": {uid: {}},
                  "DriverState": {DRIVER: {"Devices": found}}}]  # fmt: skip
        data = json.dumps({"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
                           "ClaimInfoStateList": state}, separators=(",", ":"))  # fmt: skip
        path = self.kubelet / dra_checkpoint.CHECKPOINT
        path.write_text(json.dumps({"Data": data, "Checksum": zlib.crc32(data.encode())}))

    def warnings(self) -> list[str]:
        return [line for line in (self.root / "multus.log").read_text().splitlines() if "WARNING" in line]

    def run(self, command: str, pod: Pod, conf: dict[str, Any] | None = None) -> tuple[int, Any]:
        env = {
            "PATH": os.environ["PATH"], "PYTHONPATH": REPO, "CNI_COMMAND": command, **policy_env(),
            "CNI_CONTAINERID": "c1",
            "CNI_NETNS": pod.path, "CNI_IFNAME": "eth0", "CNI_PATH": str(self.root / "bin"),
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=ibv-app-0;K8S_POD_UID=u-1",
        }  # fmt: skip
        proc = subprocess.run(
            ["ip", "netns", "exec", self.node.name, sys.executable, "-m", "rdma_cni.cli.multus"],
            input=json.dumps(conf or self.config()), env=env, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr

    def kubelet_says(self, containers: dict[str, list[Any]], devices: dict[str, list[str]] | None = None) -> (
        PodResourcesServer
    ):  # fmt: skip
        """A kubelet whose PodResources reports these claims per container (and device-plugin IDs)."""
        server = PodResourcesServer(str(self.kubelet / "pod-resources" / "kubelet.sock"))
        server.set_pod("default", "ibv-app-0", {c: (devices or {}) for c in containers}, claims=containers)
        return server

    def pod(self) -> Pod:
        pod = self.node.pod()
        wait_watched(f"/run/netns/{self.node.name}", pod.path)
        return pod

    def host(self) -> dict[str, str]:
        """bond -> its IPv4 CIDR on the node ("" when it has none: lent to a pod)."""
        return _ipv4(self.node.node_json("addr"))

    def in_pod(self, pod: Pod) -> dict[str, str]:
        """bond-named interfaces in the pod -> their IPv4 CIDR."""
        return _ipv4(self.node.pod_json(pod, "addr"))

    def host_gid_index(self, bond: str) -> int:
        ip = HOST[bond].split("/")[0]
        return gid.wait_for_gid(self.sysfs, HCA[bond], 1, ip, 5000, ndev=bond).index

    def gid_records(self) -> dict[str, tuple[str, int]]:
        """The pod's RDMA records: interface -> (RDMA device, GID index)."""
        out = {}
        for ctr, ifnames in records.list_pod_records(self.node.run_dir).items():
            for ifname in ifnames:
                rec = records.read_pod_record(self.node.run_dir, ctr, ifname) or {}
                out[str(rec.get("netdev"))] = (str(rec.get("device")), int(rec.get("gidIndex", -1)))
        return out


def _ipv4(links: list[dict[str, Any]]) -> dict[str, str]:
    out = {}
    for link in links:
        if link["ifname"] in BONDS:
            v4 = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
            out[link["ifname"]] = v4[0] if v4 else ""
    return out


def _network(root: Path, name: str, plugin: dict[str, Any]) -> None:
    (root / "net.d" / f"{name}.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": name, "plugins": [plugin]})
    )


@pytest.fixture
def dra(node_ns: Node) -> Iterator[DraNode]:
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
        "rdma": {"required": True, "gidIndex": "host", "gidTimeoutMs": 5000}, "dataDir": n.data_dir,
        "runDir": n.run_dir, "logFile": str(root / "rdma-macvlan.log"),
    })  # fmt: skip
    spec = ",".join(f"{b}:{HCA[b]}" for b in BONDS)
    args = ["--sysfs-root", sysfs, "--bonds", spec, "--node-netns", f"/run/netns/{n.name}", "--pods-dir",
            "/run/netns", "--pods-prefix", f"h2-{n.tag}-pod-", "--gid-slots", "16",
            "--layout", "mlx5"]  # fmt: skip
    with daemon(args):
        yield DraNode(n, root, sysfs)


def test_a_dra_pod_gets_exactly_its_claims_bonds_with_the_hosts_gid_index_and_del_gives_them_back(
    dra: DraNode,
) -> None:
    r = dra
    before = r.node.snapshot()
    host_index = {b: r.host_gid_index(b) for b in BONDS}
    assert set(host_index.values()) == {HOST_GID_INDEX}
    # Two claims of the trainer: GPU+NIC pairs (a GPU driver's devices beside ours) and one more NIC.
    # The GPU driver names a device "bond5": only our driver's devices are bonds.
    pairs = claim("default", "gpu-nic-pairs", device(GPU, POOL, "gpu-0"), device(DRIVER, POOL, "bond1"),
                  device(GPU, POOL, "bond5"), device(DRIVER, POOL, "bond3"))  # fmt: skip
    extra = claim("default", "one-more-nic", device(DRIVER, POOL, "rdma-7"))
    pod = r.pod()
    with r.kubelet_says({"trainer": [pairs, extra], "sidecar": [pairs]}) as kubelet:
        code, result = r.run("ADD", pod)
        assert code == 0, result
        assert kubelet.calls == ["Get"]
    mine = ["bond1", "bond3", "Rdma_7"]
    assert r.in_pod(pod) == {b: HOST[b] for b in mine}
    assert r.host() == {b: ("" if b in mine else HOST[b]) for b in BONDS}
    assert {HOST[b] for b in mine} <= {ip["address"] for ip in result["ips"]}
    assert r.gid_records() == {b: (HCA[b], host_index[b]) for b in mine}  # the host's index, in the pod
    for bond in mine:  # the pod's GIDs are published at that index, on the pod's interfaces
        entry = gid.wait_for_gid(r.sysfs, HCA[bond], 1, HOST[bond].split("/")[0], 5000, ndev=bond)
        assert entry.index == host_index[bond], (bond, entry)
        assert r.node.ping(pod, PEER[bond], bond), bond
    code, out = r.run("DEL", pod)
    assert code == 0, out
    assert r.host() == HOST and r.node.snapshot() == before
    assert {b: r.host_gid_index(b) for b in BONDS} == host_index and r.gid_records() == {}


def test_the_seed_pods_extended_resource_claim_gives_its_four_bonds(dra: DraNode) -> None:
    """KEP-5004: ``tke-shared-rdma: 4`` served by a DeviceClass's ``extendedResourceName`` is one
    claim the scheduler names ``<pod>-extended-resources-<x>``, reported in each container that asked
    and never as device-plugin devices of the resource."""
    r = dra
    special = claim("default", "ibv-app-0-extended-resources-x7k2p",
                    *(device(DRIVER, POOL, f"bond{i}") for i in (0, 2, 4, 6)))  # fmt: skip
    pod = r.pod()
    with r.kubelet_says({"trainer": [special], "init-rdma": [special]}):
        code, result = r.run("ADD", pod)
    assert code == 0, result
    mine = ["bond0", "bond2", "bond4", "bond6"]
    assert r.in_pod(pod) == {b: HOST[b] for b in mine}
    assert r.gid_records() == {b: (HCA[b], HOST_GID_INDEX) for b in mine}
    assert r.run("DEL", pod)[0] == 0 and r.host() == HOST


def test_a_device_name_matching_no_bond_fails_add_naming_it_and_the_fix_and_changes_nothing(
    dra: DraNode,
) -> None:
    r = dra
    before = r.node.snapshot()
    rdma = claim("default", "rdma", device(DRIVER, POOL, "bond2"), device(DRIVER, POOL, "bond9"))
    pod = r.pod()
    with r.kubelet_says({"trainer": [rdma]}):
        code, err = r.run("ADD", pod)
    assert code != 0 and err["code"] == 7, err
    msg = err["msg"]
    assert "'bond9' (claim default/rdma)" in msg and DRIVER in msg and "tke-rdma-macvlan" in msg, msg
    assert "'masters'" in msg and "rdma-7 = Rdma_7" in msg, msg  # what it does know, and the fix
    assert {link["ifname"] for link in r.node.pod_json(pod, "link")} == {"lo"}
    assert r.host() == HOST and r.node.snapshot() == before and r.node.state_files() == []
    assert r.run("DEL", pod)[0] == 0  # what the runtime sends next


def test_without_pod_resources_kubelets_dra_checkpoint_says(dra: DraNode) -> None:
    r = dra
    r.dra_checkpoint("u-1", "rdma", ["bond5", "rdma-7"])
    pod = r.pod()
    code, result = r.run("ADD", pod)  # no socket in pod-resources/
    assert code == 0, result
    assert r.in_pod(pod) == {"bond5": HOST["bond5"], "Rdma_7": HOST["Rdma_7"]}
    log = (r.root / "multus.log").read_text()
    assert "no kubelet PodResources socket" in log and "from kubelet's DRA checkpoint" in log
    assert r.run("DEL", pod)[0] == 0 and r.host() == HOST


def test_an_unreadable_dra_checkpoint_without_pod_resources_fails_add_and_changes_nothing(
    dra: DraNode,
) -> None:
    r = dra
    before = r.node.snapshot()
    (r.kubelet / dra_checkpoint.CHECKPOINT).write_text(json.dumps({"Data": "{}", "Checksum": 1}))
    pod = r.pod()
    code, err = r.run("ADD", pod)
    assert code != 0 and err["code"] == 108, err
    assert "dra_manager_state fails its checksum" in err["msg"] and "PodResources" in err["msg"], err
    assert r.host() == HOST and r.node.snapshot() == before and r.node.state_files() == []
    assert r.run("DEL", pod)[0] == 0


def test_claimed_bonds_and_an_unreadable_annotation_fail_add_naming_them_and_both_fixes(dra: DraNode) -> None:
    r = dra
    pod = r.pod()
    with r.kubelet_says({"trainer": [claim("default", "rdma", device(DRIVER, POOL, "bond3"))]}):
        code, err = r.run("ADD", pod, r.config(annotation=None))  # no kubeconfig, no runtime annotations
    assert code != 0 and err["code"] == 7, err
    assert "bond3 (DRA claim default/rdma)" in err["msg"] and ANNOTATION in err["msg"], err
    assert '"kubeconfig"' in err["msg"] and CRI in err["msg"], err
    assert r.host() == HOST and r.node.state_files() == []
    assert r.run("DEL", pod, r.config(annotation=None))[0] == 0


def test_claimed_bonds_without_the_rdma_network_start_with_a_warning_and_no_grpc_call(dra: DraNode) -> None:
    r = dra
    r.dra_checkpoint("u-1", "rdma", ["bond4"])
    pod = r.pod()
    with r.kubelet_says({"trainer": [claim("default", "rdma", device(DRIVER, POOL, "bond4"))]}) as kubelet:
        code, result = r.run("ADD", pod, r.config(annotation="tke-route-eni"))
        assert kubelet.calls == []  # a pod without RDMA networks pays for no gRPC call
    assert code == 0, result
    assert {link["ifname"] for link in r.node.pod_json(pod, "link")} == {"lo", "eth0"}
    warned = [w for w in r.warnings() if "bond4 (DRA claim default/rdma)" in w]
    assert warned and "names no network using them" in warned[0] and "tke-rdma-macvlan" in warned[0], warned
    assert r.host() == HOST
    assert r.run("DEL", pod, r.config(annotation="tke-route-eni"))[0] == 0
