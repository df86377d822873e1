"""rdma-macvlan called as upstream Multus calls a NetworkAttachmentDefinition's delegate: once per
reference of the network, each with the pod's next allocated device as top-level ``deviceID``, and
none once the references outnumber the allocation (Multus v4.2.3 passes nothing then, and no error).

Found under upstream Multus on the test cluster: a pod given bond2 and bond3 that referenced the NAD
three times Ran with bond0's IP as well, a bond kubelet had allocated to another pod. With no device
ID the plugin now asks kubelet (the test kubelet's real PodResources API here) and takes only the
pod's own allocation: the third reference is error 7, and the other pod's bond stays its own.
A simulated 4-bond RDMA node (:mod:`rdma_cni.sim.node`), the real plugin, both in-process and
through rdma-agent.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import Node, Pod

from rdma_cni.sim.daemon import daemon
from rdma_cni.sim.sync import wait_watched
from tests.podresources_server import PodResourcesServer

pytestmark = [pytest.mark.netns, pytest.mark.both_modes]

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
HOST = {f"bond{i}": f"198.51.100.{16 * i + 2}/28" for i in range(4)}


@pytest.fixture
def node4(node_ns: Node) -> Iterator[tuple[Node, str, PodResourcesServer]]:
    n = node_ns
    for i in range(4):
        n.bond(f"bond{i}", HOST[f"bond{i}"], peer=f"198.51.100.{16 * i + 1}/28")
    root = os.path.join(n.tmp, "sys")
    kubelet = Path(n.tmp, "kubelet")
    (kubelet / "pod-resources").mkdir(parents=True)
    args = ["--sysfs-root", root, "--bonds", ",".join(HOST), "--node-netns", f"/run/netns/{n.name}",
            "--pods-dir", "/run/netns", "--pods-prefix", f"h2-{n.tag}-pod-", "--gid-slots", "16"]  # fmt: skip
    with daemon(args), PodResourcesServer(str(kubelet / "pod-resources" / "kubelet.sock")) as server:
        server.set_pod("default", "ibv-app-0", {"trainer": {RESOURCE: ["mlx5_bond_3", "mlx5_bond_2"]}})
        server.set_pod("default", "ibv-app-1", {"trainer": {RESOURCE: ["mlx5_bond_0"]}})
        server.set_allocatable(RESOURCE, {f"mlx5_bond_{i}": 0 for i in range(4)})
        yield n, root, server


def nad(n: Node, root: str, device_id: str = "") -> dict[str, Any]:
    """The delegate config Multus hands over: the NAD's config, plus deviceID/pciBusID when it has one."""
    conf = n.config(sysfsRoot=root, rdma={"required": True, "gidTimeoutMs": 5000},
                    kubeletRootDir=os.path.join(n.tmp, "kubelet"),
                    devicePluginDir=os.path.join(n.tmp, "kubelet", "device-plugins"))  # fmt: skip
    if device_id:
        conf.update(deviceID=device_id, pciBusID=device_id)
    return conf


def pod_of(n: Node, name: str) -> tuple[Pod, dict[str, str]]:
    pod = n.pod()
    wait_watched(f"/run/netns/{n.name}", pod.path)
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={name};K8S_POD_UID=u-{name}"
    return pod, {"CNI_ARGS": args}


def host_v4(n: Node) -> dict[str, str]:
    out = {}
    for link in n.node_json("addr"):
        if link["ifname"] in HOST:
            v4 = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"]
            out[link["ifname"]] = v4[0] if v4 else ""
    return out


def test_a_reference_beyond_the_allocation_is_refused_and_never_takes_another_pods_bond(
    node4: tuple[Node, str, PodResourcesServer],
) -> None:
    n, root, _ = node4
    before = n.snapshot()
    a, args_a = pod_of(n, "ibv-app-0")
    for ifname, dev in (("net1", "mlx5_bond_3"), ("net2", "mlx5_bond_2")):
        r = n.plugin("ADD", nad(n, root, dev), a, "ca", ifname, extra=args_a)
        assert r.code == 0, r.out
    r = n.plugin("ADD", nad(n, root), a, "ca", "net3", extra=args_a)  # Multus ran out of device IDs
    assert r.code != 0 and r.out["code"] == 7, r.out
    msg = r.out["msg"]
    assert f"pod default/ibv-app-0 was allocated 2 {RESOURCE} device(s) (bond3, bond2)" in msg, msg
    assert "reference the network at most as many times" in msg, msg
    assert host_v4(n) == {"bond0": HOST["bond0"], "bond1": HOST["bond1"], "bond2": "", "bond3": ""}
    assert n.pins() == {"bond2": "ca", "bond3": "ca"}

    b, args_b = pod_of(n, "ibv-app-1")  # a NAD without resourceName: no device ID, its own allocation
    r = n.plugin("ADD", nad(n, root), b, "cb", "net1", extra=args_b)
    assert r.code == 0, r.out
    assert [i["name"] for i in r.out["interfaces"] if i.get("sandbox")] == ["bond0"]

    deletes = ((a, "ca", ("net3", "net2", "net1"), args_a), (b, "cb", ("net1",), args_b))
    for pod, cid, ifnames, args in deletes:
        for ifname in ifnames:  # Multus deletes in reverse, the refused one included
            r = n.plugin("DEL", nad(n, root), pod, cid, ifname, extra=args)
            assert r.code == 0, r.out
    assert host_v4(n) == HOST and n.pins() == {} and n.snapshot() == before


def test_a_pod_without_the_resource_gets_no_bond_where_kubelet_serves_it(
    node4: tuple[Node, str, PodResourcesServer],
) -> None:
    n, root, server = node4
    server.set_pod("default", "plain", {"app": {}})
    before = n.snapshot()
    pod, args = pod_of(n, "plain")
    r = n.plugin("ADD", nad(n, root), pod, "cp", "net1", extra=args)
    assert r.code != 0 and r.out["code"] == 7, r.out
    assert f"pod default/plain holds no {RESOURCE} device" in r.out["msg"], r.out
    assert n.snapshot() == before and n.pins() == {}
