"""Seed 002's users on the real cluster: upstream Multus (v4.2.3, built from its Go module, installed
from its own thin DaemonSet manifest, tests/cluster/multus.py) is the node's meta plugin, with the
cluster network (ptp as tke-route-eni) as its clusterNetwork; our DaemonSet installs without its own
meta config, and rdma-macvlan runs as Multus's NAD delegate.

In order, on one single-node cluster (module scope): exclusive mode, a ``type: rdma-macvlan`` NAD
with ``resourceName`` tke-shared-rdma: a pod asking for 4 and referencing the NAD 4 times holds
exactly kubelet's 4 bonds (their device nodes, their IPs, the host's GID index), and Multus's
network-status carries our device plugin's device-info; a pod referencing the NAD more often than it
asks for is refused with a message and takes no bond of another pod; kubelet killed with -9, then
the pods deleted: the node exact.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from cluster import build, cluster, multus
from cluster import topology as topo
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import RDMA, kubectl
from cluster.node import Node
from cluster.versions import MULTUS_BUILD

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.multus]

NODE = Node(1)
DS = "k8s-app=rdma-cni"
APP = "app=multus-test"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"


def pod(name: str, networks: list[str], limits: dict[str, int]) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "multus-test", "pod": name},
                     "annotations": {"k8s.v1.cni.cncf.io/networks": ",".join(networks)}},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "app", "image": w.TEST_IMAGE, "command": ["sleep", "1000000"],
            "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
            "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]},
    })


@pytest.fixture(scope="module")
def kube() -> Iterator[Binaries]:
    """One node: Multus (thin) from its own manifest, the product without its meta config, 8 bonds."""
    with cluster.exclusive():
        t0 = time.monotonic()
        cluster.up(1)
        try:
            bins = build.binaries()
            w.label_nodes(bins, 1)
            multus.cluster_network(NODE)
            w.apply(bins, multus.deployment("thin"))
            w.apply(bins, multus.product_without_meta())
            w.wait_ready(bins, multus.SELECTOR, 1, "kube-system", timeout=240)
            w.wait_ready(bins, DS, 1, "kube-system", timeout=240)
            w.wait(f"{NODE.name} offers 8 {RDMA}", lambda: w.node_capacity(bins, NODE.name) == (8, 8), 90)
            print(f"\nmultus cluster ready in {time.monotonic() - t0:.1f} s")
            yield bins
        finally:
            cluster.down()
            assert cluster.our_shims() == []


@pytest.fixture(scope="module")
def baseline(kube: Binaries) -> dict[str, dict[str, Any]]:
    return {NODE.name: w.node_network(NODE)}


def status_of(bins: Binaries, name: str) -> list[dict[str, Any]]:
    doc = json.loads(kubectl(bins, "get", "pod", name, "-o", "json").stdout)
    entries: list[dict[str, Any]] = json.loads(doc["metadata"]["annotations"][NETWORK_STATUS])
    return entries


def addresses(bins: Binaries, name: str) -> dict[str, list[str]]:
    out = json.loads(w.pod_exec(bins, name, "ip", "-j", "-4", "addr"))
    return {a["ifname"]: [i["local"] for i in a["addr_info"]] for a in out if a["ifname"] != "lo"}


def infiniband(bins: Binaries, name: str) -> set[str]:
    return set(w.pod_exec(bins, name, "ls", "/dev/infiniband").split())


def sandbox_error(bins: Binaries, name: str) -> str | None:
    events = json.loads(kubectl(bins, "get", "events", "-o", "json", "--field-selector",
                                f"involvedObject.name={name}").stdout)["items"]
    said = [e["message"] for e in events if e.get("reason") == "FailedCreatePodSandBox"]
    return said[-1] if said else None


def test_multus_wraps_the_cluster_network_and_our_installer_left_no_meta_config(kube: Binaries) -> None:
    net_d = NODE.dir("/etc/cni/net.d")
    conf = w.wait("Multus's generated config", lambda: multus.generated(NODE), 60)
    assert conf["type"] == "multus" and [d["name"] for d in conf["delegates"]] == ["tke-route-eni"]
    assert not (net_d / "00-rdma-multus.conflist").exists(), "one node runs one meta plugin"
    installed = NODE.dir("/opt/cni/bin") / "multus"
    assert installed.read_bytes() == (MULTUS_BUILD.bin_dir / "multus").read_bytes()
    assert (NODE.dir("/opt/cni/bin") / "rdma-macvlan").exists()


def test_an_rdma_macvlan_nad_gives_the_pod_exactly_its_allocated_bonds_with_device_info(
    kube: Binaries, baseline: dict[str, dict[str, Any]]
) -> None:
    w.apply(kube, multus.nad("rdma-exclusive", multus.RDMA_MACVLAN, RDMA))
    t0 = time.monotonic()
    w.apply(kube, pod("rdma-4", ["rdma-exclusive"] * 4, {RDMA: 4}))
    w.wait_ready(kube, f"{APP},pod=rdma-4", 1, timeout=120)
    print(f"\nrdma-4 (4 bonds through Multus) Running {time.monotonic() - t0:.2f} s after create")
    bonds = {i: a for i, a in addresses(kube, "rdma-4").items() if i.startswith("bond")}
    indexes = sorted(int(i.removeprefix("bond")) for i in bonds)
    devs = infiniband(kube, "rdma-4")
    assert {d for d in devs if d.startswith("uverbs")} == {f"uverbs{i}" for i in indexes}, (
        "the bonds moved are exactly the devices kubelet allocated"
    )
    assert len(indexes) == 4
    for i in indexes:
        ip = topo.bond_ip(NODE.n, i)
        assert bonds[f"bond{i}"] == [ip], "the bond's own IP, moved from the host"
        port = NODE.sys_tree / "class" / "infiniband" / f"mlx5_bond_{i}" / "ports" / "1"
        o = [int(x) for x in ip.split(".")]
        tail = f"{o[0]:02x}{o[1]:02x}:{o[2]:02x}{o[3]:02x}"  # an IPv4-mapped GID's last two groups
        assert (port / "gids" / "3").read_text().strip().endswith(tail)
        assert (port / "gid_attrs" / "types" / "3").read_text().strip() == "RoCE v2", "the host's index"
    entries = status_of(kube, "rdma-4")
    assert entries[0]["name"] == "tke-route-eni" and entries[0].get("default") is True
    rdma = [e for e in entries if e["name"] == "default/rdma-exclusive"]
    assert sorted(e["interface"] for e in rdma) == sorted(bonds)
    for e in rdma:
        i = int(e["interface"].removeprefix("bond"))
        assert e["ips"] == [topo.bond_ip(NODE.n, i)]
        info = e["device-info"]
        assert info["type"] == "pci" and info["version"] == "1.1.0", info
        assert info["pci"]["rdma-device"] == f"mlx5_bond_{i}" and info["pci"]["pci-address"], info
    print("network-status of an RDMA bond under Multus:", json.dumps(rdma[0]))


def test_more_references_than_devices_is_refused_and_takes_no_other_pods_bond(kube: Binaries) -> None:
    before = addresses(kube, "rdma-4")
    w.apply(kube, pod("rdma-over", ["rdma-exclusive"] * 3, {RDMA: 2}))
    said = w.wait("rdma-over's sandbox refused", lambda: sandbox_error(kube, "rdma-over"), 90)
    assert "at most as many times as the pod asks for" in said, said
    assert addresses(kube, "rdma-4") == before, "the other pod keeps its bonds"
    kubectl(kube, "delete", "pod", "rdma-over", "--wait=true", timeout=120)


def test_kubelet_killed_then_pods_deleted_leaves_the_node_exact(
    kube: Binaries, baseline: dict[str, dict[str, Any]]
) -> None:
    before = addresses(kube, "rdma-4")
    back = w.restart_kubelet(NODE, signal.SIGKILL)
    print(f"\nkubelet -9: 8 bonds offered again {back:.2f} s after its socket")
    w.wait_ready(kube, f"{APP},pod=rdma-4", 1, timeout=120)
    assert addresses(kube, "rdma-4") == before
    kubectl(kube, "delete", "pod", "-l", APP, "--wait=true", timeout=120)
    w.wait_gone(kube, APP)
    w.wait_exact([NODE], baseline)
