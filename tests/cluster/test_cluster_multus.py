"""Seed 002's users on the real cluster: upstream Multus (v4.2.3, built from its Go module, installed
from its own thin DaemonSet manifest, tests/cluster/multus.py) is the node's meta plugin, with the
cluster network (ptp as tke-route-eni) as its clusterNetwork; our DaemonSet installs without its own
meta config, and rdma-macvlan runs as Multus's NAD delegate.

In order, on one single-node cluster (module scope): exclusive mode, a ``type: rdma-macvlan`` NAD
with ``resourceName`` tke-shared-rdma: a pod asking for 4 and referencing the NAD 4 times holds
exactly kubelet's 4 bonds (their device nodes, their IPs, the host's GID index), and Multus's
network-status carries our device plugin's device-info; a pod referencing the NAD more often than it
asks for is refused with a message and takes no bond of another pod; kubelet killed with -9, then
the pods deleted: the node exact. Then Multus's thick variant, its daemon killed -9 mid-ADD (the
delegate runs chrooted into the host's root: the agent's worker must take that root). Then seed
002's user as they are (Mellanox's config.json to our device plugin, the reference macvlan NAD, their
pod) and the same NAD with only its type swapped to rdma-ipvlan (shared mode). Last, DRA through
Multus v4.2's PodResources path: a NAD naming a ResourceClaim. Between the two, a namespace user
with NAD rights in their own namespace tries every door of the tenant boundary (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from seed002 import COPY, from_seed

from cluster import build, cluster, dra, multus, tenant
from cluster import topology as topo
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import RDMA, kubectl, node_resources
from cluster.node import Node
from cluster.versions import MULTUS_BUILD

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.multus]

NODE = Node(1)
DS = "k8s-app=rdma-cni"
APP = "app=multus-test"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"
MLX_RESOURCE = "rdma/hca_shared_devices_a"  # seed 002's resource: resourcePrefix/resourceName
MLX_BONDS = (0, 1)  # the NICs its selector names on this node (two HCAs of one shared pool)
DRA_CLASS = "rdma.tke.cloud.tencent.com"  # the chart's exclusive DeviceClass


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


# --- a namespace user, under upstream Multus (docs/security.md) ------------------------------------

def tenant_pod(name: str, network: str, limits: dict[str, int]) -> str:
    doc = yaml.safe_load(pod(name, [network], limits))
    doc["metadata"]["namespace"] = tenant.NAMESPACE
    return yaml.safe_dump(doc)


def node_ip() -> list[str]:
    out = json.loads(topo.ip("-j", "-4", "addr", "show", "dev", "eth0", netns=NODE.netns).stdout)
    return [f"{a['local']}/{a['prefixlen']}" for link in out for a in link["addr_info"]]


@pytest.mark.tenant
def test_a_namespace_user_with_nad_rights_reaches_nothing_of_the_node(
    kube: Binaries, baseline: dict[str, dict[str, Any]]
) -> None:
    """Each attempt of the tenant-boundary finding, made through ``kubectl --as`` by a user whose Role
    grants pods and NADs in team-a only, with the DaemonSet as the chart ships it: every sandbox is
    refused naming the key and the node policy; the node's IP, bonds and files stay; another
    namespace's pod keeps its bonds, and a pod asking for every bond left still gets them."""
    w.apply(kube, tenant.rbac())
    w.apply(kube, multus.nad("rdma-exclusive", multus.RDMA_MACVLAN, RDMA))
    w.apply(kube, pod("victim", ["rdma-exclusive"] * 4, {RDMA: 4}))
    w.wait_ready(kube, f"{APP},pod=victim", 1, timeout=120)
    victim = addresses(kube, "victim")
    stolen = next(i for i in victim if i.startswith("bond"))
    ip_before, shipped = node_ip(), json.loads((NODE.dir("/etc/cni/net.d") / "rdma-multus.d" /
                                                "tke-rdma-macvlan.conf").read_text())
    attempts: dict[str, tuple[dict[str, Any], dict[str, int], str]] = {  # NAD -> (config, limits, refusal)
        "node-nic": ({"type": "rdma-macvlan", "masters": ["eth0"], "podIfName": "cni",
                      "rdma": {"required": False}, "resourceName": "example.com/none"}, {}, "config key"),
        "kubelet-paths": ({"type": "rdma-macvlan", "kubeletRootDir": "/var/tmp/tenant-kubelet",
                           "podResourcesDir": "/var/tmp/tenant-kubelet",
                           "devicePluginDir": "/var/tmp/tenant-kubelet"}, {}, "config key 'kubeletRootDir'"),
        "host-paths": ({**{k: v for k, v in shipped.items() if k not in ("cniVersion", "name")},
                        "dataDir": "/var/tmp/tenant-data", "runDir": "/var/tmp/tenant-run"}, {},
                       "config key 'dataDir'"),
        "log-file": ({"type": "rdma-macvlan", "logFile": "/var/tmp/tenant.log"}, {}, "config key 'logFile'"),
        "other-bond": ({"type": "rdma-macvlan", "deviceID": stolen}, {RDMA: 1}, "default/victim"),
        "no-device": ({"type": "rdma-macvlan"}, {}, "holds no"),
    }  # fmt: skip
    for name, (config, limits, _) in attempts.items():
        tenant.as_tenant(kube, "apply", "-f", "-", stdin=tenant.nad(name, config))
        tenant.as_tenant(kube, "apply", "-f", "-", stdin=tenant_pod(f"t-{name}", name, limits))
    assert tenant.forbidden_elsewhere(kube)
    for name, (_, _, expected) in attempts.items():
        said = w.wait(f"t-{name}'s sandbox refused", partial(tenant.refusal, kube, f"t-{name}"), 120)
        print(f"\ntenant {name}: {said[-400:]}")
        assert expected in said, said
        if expected.startswith("config key"):
            assert "/etc/rdma-cni/node-policy.json" in said and "node's admin" in said, said
    assert node_ip() == ip_before, "the node's own address stays on eth0"
    for path in ("/var/tmp/tenant-data", "/var/tmp/tenant-run", "/var/tmp/tenant.log",
                 "/var/tmp/tenant-kubelet"):
        # not a directory of the node's own (cluster/node.py NODE_DIRS): the node sees this machine's
        assert not Path(path).exists(), f"{path} was created on the node"
    assert addresses(kube, "victim") == victim, "another namespace's pod keeps its bonds"
    tenant.as_tenant(kube, "delete", "pod", "--all", "--wait=true")
    w.apply(kube, pod("rest", ["rdma-exclusive"] * 4, {RDMA: 4}))
    w.wait_ready(kube, f"{APP},pod=rest", 1, timeout=120)
    assert not set(addresses(kube, "rest")) & {i for i in victim if i.startswith("bond")}
    kubectl(kube, "delete", "pod", "-l", APP, "--wait=true", timeout=120)
    kubectl(kube, "delete", "namespace", tenant.NAMESPACE, "--wait=false")  # its pods are gone already
    w.wait_gone(kube, APP)
    w.wait_exact([NODE], baseline)


def test_thick_multus_daemon_killed_mid_add_loses_nothing(
    kube: Binaries, baseline: dict[str, dict[str, Any]]
) -> None:
    """Multus's thick variant (its own -thick manifest: the same DaemonSet name, so an update) with
    its daemon killed -9 while it runs rdma-macvlan's ADD (the first attachment record written):
    the runtime tears down and tries again, the pod Runs with exactly its 4 bonds, and after its
    delete the node is exact."""
    w.apply(kube, multus.deployment("thick"))
    kubectl(kube, "-n", "kube-system", "rollout", "status", "daemonset/kube-multus-ds", "--timeout=240s",
            timeout=260)
    w.wait("the thick config", lambda: (multus.generated(NODE) or {}).get("type") == "multus-shim", 90)
    w.wait("multus-daemon running", lambda: multus.daemon_pids(NODE), 60)
    records = NODE.dir("/var/lib/cni") / "rdma-macvlan" / "attachments"
    before = set(os.listdir(records)) if records.exists() else set()
    w.apply(kube, pod("rdma-thick", ["rdma-exclusive"] * 4, {RDMA: 4}))
    try:
        deadline = time.monotonic() + 120
        while not (set(os.listdir(records)) - before if records.exists() else set()):
            if time.monotonic() > deadline:
                logs = kubectl(kube, "-n", "kube-system", "logs", "-l", multus.SELECTOR, "--tail=30").stdout
                said = sandbox_error(kube, "rdma-thick")
                raise AssertionError(f"no ADD reached rdma-macvlan: {said}\n{logs}")
            time.sleep(0.005)
        killed = multus.daemon_pids(NODE)
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        print(f"\nkilled multus-daemon {killed} mid-ADD")
        w.wait_ready(kube, f"{APP},pod=rdma-thick", 1, timeout=240)
        bonds = {i for i in addresses(kube, "rdma-thick") if i.startswith("bond")}
        uverbs = {d for d in infiniband(kube, "rdma-thick") if d.startswith("uverbs")}
        assert len(bonds) == 4 and uverbs == {f"uverbs{b.removeprefix('bond')}" for b in bonds}
    finally:
        kubectl(kube, "delete", "pod", "rdma-thick", "--wait=true", timeout=120)
        w.wait_gone(kube, APP)
    w.wait_exact([NODE], baseline)


def _mellanox_config(tmp: Path) -> Path:
    """Seed 002's config.json with its selector set to this node's NICs, as its user sets it for theirs."""
    doc = json.loads(from_seed() or COPY)
    doc["configList"][0]["selectors"] = {"ifNames": [f"bond{b}" for b in MLX_BONDS]}
    path = tmp / "config.json"
    path.write_text(json.dumps(doc, indent=4))
    return path


def test_the_network_operator_user_runs_and_swapping_only_the_type_gives_rdma_ipvlan(
    kube: Binaries, baseline: dict[str, dict[str, Any]]
) -> None:
    """Seed 002's user as they are: Mellanox's config.json to our device plugin, a NAD as
    network-operator writes it (the reference macvlan on the RDMA NIC, host-local), their pod. Then
    the same NAD with only its type swapped to rdma-ipvlan: each pod a child of every bond with an
    address of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        w.apply(kube, multus.product_without_meta("shared", _mellanox_config(Path(tmp))))
    w.rollout(kube)
    w.use_macvlan_link(NODE)  # this kernel has no IPVLAN: the node's shared delegate uses macvlan
    w.wait(f"{NODE.name} offers 200 {MLX_RESOURCE}",
           lambda: node_resources(kube, NODE.name, MLX_RESOURCE) == (200, 200), 90)
    subnet = topo.bond_subnet(NODE.n, MLX_BONDS[0])
    hosts = list(subnet.hosts())
    # network-operator's MacvlanNetwork -> NAD: type macvlan on the RDMA NIC, host-local IPAM, no resourceName
    operator = {"cniVersion": "0.3.1", "name": "rdma-shared-macvlan", "type": "macvlan",
                "master": f"bond{MLX_BONDS[0]}", "mode": "bridge", "mtu": 1500,
                "ipam": {"type": "host-local", "subnet": str(subnet), "rangeStart": str(hosts[-4]),
                         "rangeEnd": str(hosts[-1])}}
    # the same NAD with only its type swapped: rdma-ipvlan reads its own keys (link: macvlan, as this
    # test kernel has no IPVLAN) and ignores master, mode and ipam
    ours = {**operator, "name": "rdma-shared-ipvlan", "type": "rdma-ipvlan", "link": "macvlan"}
    ours.pop("ipam")
    w.apply(kube, multus.nad("rdma-shared-macvlan", operator))
    w.apply(kube, multus.nad("rdma-shared-ipvlan", ours))
    w.apply(kube, pod("seed002", ["rdma-shared-macvlan"], {MLX_RESOURCE: 1}))
    w.apply(kube, pod("swapped-a", ["rdma-shared-ipvlan"], {MLX_RESOURCE: 1}))
    w.apply(kube, pod("swapped-b", ["rdma-shared-ipvlan"], {MLX_RESOURCE: 1}))
    try:
        w.wait_ready(kube, APP, 3, timeout=180)
    except (AssertionError, TimeoutError) as e:
        said = {n: sandbox_error(kube, n) for n in ("seed002", "swapped-a", "swapped-b")}
        raise AssertionError(f"{e}: {said}") from e

    pool = {f"uverbs{b}" for b in MLX_BONDS}
    assert {d for d in infiniband(kube, "seed002") if d.startswith("uverbs")} == pool, "the pool's devices"
    net1 = addresses(kube, "seed002")["net1"]
    assert len(net1) == 1 and ipaddress.ip_address(net1[0]) in subnet
    entries = status_of(kube, "seed002")
    assert [(e["name"], e.get("interface")) for e in entries][1:] == [("default/rdma-shared-macvlan", "net1")]

    seen: set[str] = set()
    host = {f"bond{b}": topo.bond_ip(NODE.n, b) for b in range(topo.BONDS)}
    for name in ("swapped-a", "swapped-b"):
        mine = {i: a for i, a in addresses(kube, name).items() if i != "eth0"}
        assert len(mine) == topo.BONDS, f"{name}: a child of every bond, {mine}"
        for addrs in mine.values():
            assert len(addrs) == 1 and addrs[0] not in host.values() and addrs[0] not in seen
            seen.add(addrs[0])
        rdma = [e for e in status_of(kube, name) if e["name"] == "default/rdma-shared-ipvlan"]
        assert sum(len(e.get("ips", [])) for e in rdma) == topo.BONDS
    assert json.dumps(w.node_network(NODE)["addr"]).count(host["bond0"]) == 1, "the host keeps its addresses"
    kubectl(kube, "delete", "pod", "-l", APP, "--wait=true", timeout=120)
    w.wait_gone(kube, APP)
    w.wait_exact([NODE], baseline)


def test_device_info_files_follow_the_pools_the_plugin_serves(kube: Binaries) -> None:
    """After the switch to Mellanox's pool of two HCAs (a shared pool of several HCAs gets none) the
    old pool's 8 files are gone, though the new run never served that resource."""
    dp = NODE.dir("/run/k8s.cni.cncf.io") / "devinfo" / "dp"
    w.wait("the old pool's device-info files removed",
           lambda: not [n for n in os.listdir(dp) if n.endswith("-device.json")], 30)


def claim(name: str, count: int) -> str:
    return yaml.safe_dump({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "nics", "exactly": {
            "deviceClassName": DRA_CLASS, "count": count}}]}},
    })


def test_dra_claims_reach_rdma_macvlan_through_multus_v4_2(
    kube: Binaries, baseline: dict[str, dict[str, Any]]
) -> None:
    """Multus v4.2.x's DRA path: PodResources' DynamicResources (GA in kubelet 1.36), keyed by the
    ResourceClaim's name, each device the part of its CDI ID after "=" (``<claim uid>-mlx5_bond_N``,
    our driver's naming). A NAD whose resourceName is the claim's name hands each reference one of
    the claim's bonds; rdma-macvlan moves exactly those."""
    w.apply(kube, multus.product_without_meta(front_end="dra"))
    w.rollout(kube)
    w.wait("the driver's 8 devices published", lambda: len(dra.devices(kube, node=NODE.name)) == 8, 120)
    w.apply(kube, claim("rdma-pair", 2))
    w.apply(kube, multus.nad("rdma-dra", multus.RDMA_MACVLAN, "rdma-pair"))
    doc = yaml.safe_load(pod("dra-pair", ["rdma-dra", "rdma-dra"], {}))
    doc["spec"]["resourceClaims"] = [{"name": "nics", "resourceClaimName": "rdma-pair"}]
    doc["spec"]["containers"][0]["resources"] = {"claims": [{"name": "nics"}]}
    w.apply(kube, yaml.safe_dump(doc))
    try:
        w.wait_ready(kube, f"{APP},pod=dra-pair", 1, timeout=120)
    except (AssertionError, TimeoutError) as e:
        raise AssertionError(f"{e}: {sandbox_error(kube, 'dra-pair')}") from e
    held = json.loads(kubectl(kube, "get", "resourceclaim", "rdma-pair", "-o", "json").stdout)
    published = dra.devices(kube, node=NODE.name)
    allocated = {published[r["device"]]["attrs"]["bond"] for r in dra.results(held)}
    bonds = {i: a for i, a in addresses(kube, "dra-pair").items() if i.startswith("bond")}
    assert set(bonds) == allocated and len(allocated) == 2, (bonds, allocated)
    for b, ips in bonds.items():
        assert ips == [topo.bond_ip(NODE.n, int(b.removeprefix("bond")))]
    uverbs = {d for d in infiniband(kube, "dra-pair") if d.startswith("uverbs")}
    assert uverbs == {f"uverbs{b.removeprefix('bond')}" for b in allocated}
    kubectl(kube, "delete", "pod", "dra-pair", "--wait=true", timeout=120)
    kubectl(kube, "delete", "resourceclaim", "rdma-pair", "--wait=true", timeout=60)
    w.wait_gone(kube, APP)
    w.wait_exact([NODE], baseline)
