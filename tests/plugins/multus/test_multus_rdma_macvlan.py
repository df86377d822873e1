"""The seed's pod, end to end: ``tke-route-eni,tke-rdma-macvlan`` through rdma-multus to the real
``rdma-macvlan`` (``rdma.required: false``: this kernel has no RDMA) on two veth "bonds".

The pod asks for two ``tke-shared-rdma`` devices; the kubelet checkpoint says which; rdma-multus
passes them on; rdma-macvlan moves both bonds' addresses into the pod (interfaces named like the
bonds) and gives them back on DEL — also when the API server is gone and the netns with it.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube_server import KubeServer, Pki
from tests.multus_node import ANNOTATION, RESOURCE, Node, addrs, links, reachable, sh

pytestmark = pytest.mark.netns

NODE_LINKS = {"lo", "bond0", "bond1"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("h5-pki"))


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tag=f"{os.getpid()}-{uuid.uuid4().hex[:6]}", root=tmp_path)
    try:
        n.up()
        n.add_bond("bond1", "198.51.100.130/28", "198.51.100.129/28")
        wrapper = n.bin_dir / "rdma-macvlan"
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m rdma_cni.cli.macvlan\n")
        wrapper.chmod(0o755)
        n.rdma_macvlan_network(tmp_path)
        yield n
    finally:
        n.down()


@pytest.fixture
def api(node: Node, pki: Pki) -> Iterator[KubeServer]:
    with KubeServer(pki, netns=node.name) as server:
        yield server


def host_addresses(node: Node) -> dict[str, list[str]]:
    return {bond: addrs(node.name, bond) for bond in ("bond0", "bond1")}


HOST = {"bond0": ["203.0.113.2/24"], "bond1": ["198.51.100.130/28"]}


def add_seed_pod(
    node: Node, api: KubeServer, tmp_path: Path, devices: int
) -> tuple[dict[str, object], str, str]:
    uid = str(uuid.uuid4())
    api.add_pod("default", "ibv-app-0", uid=uid, annotations={ANNOTATION: "tke-route-eni,tke-rdma-macvlan"},
                limits={RESOURCE: str(devices)})  # fmt: skip
    node.checkpoint(uid, [str(i) for i in range(devices)])
    return node.config(api.kubeconfig(tmp_path / "kc")), node.pod_netns(), uid


def test_seed_pod_gets_eth0_and_both_bonds_and_del_gives_them_back(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, uid = add_seed_pod(node, api, tmp_path, devices=2)
    code, result = node.run("ADD", conf, "c1", pod, uid=uid)
    assert code == 0, result
    assert links(pod) == {"lo", "eth0", "bond0", "bond1"}
    assert addrs(pod, "bond0") == ["203.0.113.2/24"] and addrs(pod, "bond1") == ["198.51.100.130/28"]
    assert host_addresses(node) == {"bond0": [], "bond1": []}  # the IPs left the host (TKE behaviour)
    assert reachable(pod, "203.0.113.1") and reachable(pod, "198.51.100.129")
    names = [i["name"] for i in result["interfaces"] if i.get("sandbox")]
    assert names[0] == "eth0" and {"bond0", "bond1"} <= set(names)
    assert {"203.0.113.2/24", "198.51.100.130/28"} <= {ip["address"] for ip in result["ips"]}

    code, out = node.run("CHECK", {**conf, "prevResult": result}, "c1", pod, uid=uid)
    assert code == 0, out

    code, out = node.run("DEL", conf, "c1", pod, uid=uid)
    assert code == 0, out
    assert links(pod) == {"lo"}
    assert host_addresses(node) == HOST
    assert links(node.name) == NODE_LINKS


def test_del_after_api_server_stopped_and_netns_gone_restores_the_host(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, uid = add_seed_pod(node, api, tmp_path, devices=2)
    code, result = node.run("ADD", conf, "c1", pod, uid=uid)
    assert code == 0, result
    assert host_addresses(node) == {"bond0": [], "bond1": []}
    api.stop()
    sh("ip", "netns", "del", pod)
    code, out = node.run("DEL", conf, "c1", None, uid=uid)  # containerd's RemovePodSandbox DEL
    assert code == 0, out
    assert host_addresses(node) == HOST
    assert links(node.name) == NODE_LINKS
    assert not list((node.cache_dir / "attachments").iterdir())


def test_failing_rdma_delegate_rolls_back_the_default_network(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    conf, pod, uid = add_seed_pod(node, api, tmp_path, devices=3)  # three devices, two bonds
    code, err = node.run("ADD", conf, "c1", pod, uid=uid)
    assert code != 0 and "tke-rdma-macvlan" in err["msg"], err
    assert links(pod) == {"lo"}
    assert host_addresses(node) == HOST
    assert links(node.name) == NODE_LINKS
    assert not [p for p in (node.ipam_dir).rglob("*") if p.is_file() and p.name[0].isdigit()]


def test_gc_tells_rdma_macvlan_which_of_its_attachments_live(
    node: Node, api: KubeServer, tmp_path: Path
) -> None:
    """rdma-macvlan knows attachments as (container, net1); the runtime lists (container, eth0).

    If rdma-multus forwarded the runtime's list untranslated, rdma-macvlan's GC would tear down the
    live pod too.
    """
    uids = [str(uuid.uuid4()), str(uuid.uuid4())]
    for i, uid in enumerate(uids):
        api.add_pod("default", f"p{i}", uid=uid, annotations={ANNOTATION: "tke-rdma-macvlan"},
                    limits={RESOURCE: "1"})  # fmt: skip
    conf = node.config(api.kubeconfig(tmp_path / "kc"), version="1.1.0")
    pods = [node.pod_netns(), node.pod_netns()]
    for i, pod in enumerate(pods):
        code, result = node.run("ADD", conf, f"c{i}", pod, pod=f"p{i}", uid=uids[i])
        assert code == 0, result
    assert host_addresses(node) == {"bond0": [], "bond1": []}
    gc = {**conf, "cni.dev/valid-attachments": [{"containerID": "c0", "ifname": "eth0"}]}
    code, out = node.run("GC", gc, "", None, ifname="")
    assert code == 0, out
    assert links(pods[0]) == {"lo", "eth0", "bond0"}  # c0 took bond0 first and keeps it
    assert links(pods[1]) == {"lo"}
    assert host_addresses(node) == {"bond0": [], "bond1": ["198.51.100.130/28"]}
    assert node.run("DEL", conf, "c0", pods[0], pod="p0")[0] == 0
    assert host_addresses(node) == HOST


def test_status_is_forwarded_to_the_default_network(node: Node, tmp_path: Path) -> None:
    node.network("h5-status", {"plugins": [{
        "type": "rdma-macvlan", "masters": ["no-such-bond"], "rdma": {"required": False},
        "dataDir": str(tmp_path / "rm-state"), "runDir": str(tmp_path / "rm-run"),
    }]}, version="1.1.0")  # fmt: skip
    ok = node.config(None, version="1.1.0")
    code, out = node.run("STATUS", ok, "", None, ifname="")
    assert code == 0, out  # ptp's network is 1.0.0: STATUS is not a verb there, nothing to forward
    bad = node.config(None, version="1.1.0", defaultDelegates="h5-status")
    code, out = node.run("STATUS", bad, "", None, ifname="")
    # rdma-macvlan's own answer, as its ADD would give it: 7 naming the masters entry
    assert code != 0 and out["code"] == 7 and "'masters' names 'no-such-bond'" in out["msg"], out
    missing = node.config(None, version="1.1.0", defaultDelegates="h5-nowhere")
    code, out = node.run("STATUS", missing, "", None, ifname="")
    assert code != 0 and out["code"] == 50 and "h5-nowhere" in out["msg"], out
