"""What a namespace user (a NAD's config) or a pod author (annotations, runtimeConfig, CNI_ARGS) can
do to a node through rdma-macvlan and rdma-ipvlan, tried the way upstream Multus hands their input
to the delegate: nothing beyond the pod's own allocation.

The node: a simulated 4-bond RDMA node (:mod:`rdma_cni.sim.node`) plus a NIC that backs no RDMA device
and carries the node's own address (``hostnic0``, 203.0.113.11, as a node IP would), kubelet's real
PodResources API (tests/podresources_server.py) with two pods' allocations, and the node policy file
the installer writes, here with this node's paths. The node's own network config names no path at
all: the policy gives them. Each attempt is refused (or, for DEL, has no effect), names the key,
and leaves the node's addresses, routes, rules, links and files exactly as they were; then the
pods' own allocations still start. The real plugin, in-process and through rdma-agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netns import REPO, Node, Pod
from simnode import sim_node

from rdma_cni.sim.sync import wait_watched
from tests.podresources_server import PodResourcesServer

pytestmark = [pytest.mark.netns, pytest.mark.tenant, pytest.mark.both_modes]

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
HOST = {f"bond{i}": f"198.51.100.{16 * i + 2}/28" for i in range(4)}
NODE_IP = "203.0.113.11/24"


class Tenant:
    """The node as its admin set it up, and what a tenant may hand its plugins."""

    def __init__(self, n: Node, root: str, policy: Path, server: PodResourcesServer) -> None:
        self.n, self.root, self.policy, self.server = n, root, policy, server
        self.kubelet = os.path.join(n.tmp, "kubelet")
        self.evil = Path(n.tmp, "tenant-chose")  # where a tenant's paths point: must never appear

    def node_config(self, **keys: Any) -> dict[str, Any]:
        """The node's own tke-rdma-macvlan config as the installer writes it: no path in it."""
        conf = {"cniVersion": "1.0.0", "name": "tke-rdma-macvlan", "type": "rdma-macvlan",
                "resourceName": RESOURCE, "rdma": {"gidTimeoutMs": 5000}}
        conf.update(keys)
        return conf

    def pod(self, name: str) -> tuple[Pod, dict[str, str]]:
        pod = self.n.pod()
        wait_watched(f"/run/netns/{self.n.name}", pod.path)
        args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME={name};K8S_POD_UID=u-{name}"
        return pod, {"CNI_ARGS": args}


@pytest.fixture
def tenant(node_ns: Node, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tenant]:
    n = node_ns
    for i in range(4):
        n.bond(f"bond{i}", HOST[f"bond{i}"], peer=f"198.51.100.{16 * i + 1}/28")
    n.bond("hostnic0", NODE_IP, peer="203.0.113.1/24")
    root = os.path.join(n.tmp, "sys")
    kubelet = Path(n.tmp, "kubelet")
    (kubelet / "pod-resources").mkdir(parents=True)
    policy = tmp_path / "node-policy.json"
    policy.write_text(json.dumps({
        "trust": "node", "bondsFrom": "kubelet",
        "paths": {
            "rdma-macvlan": {"dataDir": n.data_dir, "runDir": n.run_dir, "sysfsRoot": root,
                             "logFile": os.path.join(n.tmp, "plugin.log"), "kubeletRootDir": str(kubelet),
                             "devicePluginDir": str(kubelet / "device-plugins")},
            "rdma-ipvlan": {"dataDir": os.path.join(n.tmp, "ipvlan"), "runDir": n.run_dir, "sysfsRoot": root,
                            "logFile": os.path.join(n.tmp, "plugin.log")},
        },
    }))  # fmt: skip
    monkeypatch.setenv("RDMA_CNI_NODE_POLICY", str(policy))
    with (
        sim_node(root, HOST, n.name, f"h2-{n.tag}-pod-"),
        PodResourcesServer(str(kubelet / "pod-resources" / "kubelet.sock")) as server,
    ):
        server.set_pod("team-a", "ibv-app-0", {"trainer": {RESOURCE: ["mlx5_bond_3", "mlx5_bond_2"]}})
        server.set_pod("team-b", "other-0", {"trainer": {RESOURCE: ["mlx5_bond_0"]}})
        server.set_allocatable(RESOURCE, {f"mlx5_bond_{i}": 0 for i in range(4)})
        yield Tenant(n, root, policy, server)


def refused(t: Tenant, conf: dict[str, Any], key: str, pod_name: str = "ibv-app-0", code: int = 7,
            ifname: str = "net1", del_code: int = 0) -> str:
    """ADD of ``conf`` for ``pod_name``: refused with ``code`` naming ``key``; nothing on the node
    changed, no file appeared where the tenant pointed, nothing is pinned."""
    before = t.n.snapshot()
    pod, args = t.pod(pod_name)
    r = t.n.plugin("ADD", conf, pod, "c-tenant", ifname, extra=args)
    assert r.code != 0 and r.out["code"] == code, r.out
    assert key in r.out["msg"], r.out
    assert t.n.snapshot() == before
    assert not t.evil.exists(), sorted(str(p) for p in t.evil.rglob("*"))
    assert t.n.pins() == {}
    assert {link["ifname"] for link in t.n.pod_json(pod, "link")} == {"lo"}
    # the runtime's DEL of the refused sandbox, with the same config: succeeds and changes nothing
    d = t.n.plugin("DEL", conf, pod, "c-tenant", ifname, extra=args)
    assert (d.out or {}).get("code", 0) == del_code, d.out
    assert t.n.snapshot() == before and not t.evil.exists()
    return str(r.out["msg"])


def test_a_nad_naming_the_nodes_own_nic_never_moves_the_node_ip(tenant: Tenant) -> None:
    msg = refused(tenant, tenant.node_config(masters=["hostnic0"], podIfName="cni"), "'masters'")
    assert "hostnic0" in msg and "bond0, bond1, bond2, bond3" in msg
    # the whole NAD of the cluster finding: masters, rdma off, a resource nobody holds
    refused(tenant, tenant.node_config(masters=["hostnic0"], podIfName="cni", rdma={"required": False},
                                       resourceName="example.com/none"), "config key")


@pytest.mark.parametrize("key", ["dataDir", "runDir", "logFile", "sysfsRoot", "kubeletRootDir",
                                 "podResourcesDir", "devicePluginDir"])
def test_a_nad_naming_a_host_or_kubelet_path_is_refused_and_nothing_is_created_there(
    tenant: Tenant, key: str
) -> None:
    target = str(tenant.evil / key / ("x.log" if key == "logFile" else ""))
    msg = refused(tenant, tenant.node_config(**{key: target}), f"config key {key!r}")
    assert str(tenant.policy) in msg and "the node's admin" in msg


@pytest.mark.parametrize(
    ("keys", "key"),
    [
        ({"rdma": {"required": False}}, "'rdma.required'"),
        ({"rdma": {"netnsMode": "exclusive"}}, "'rdma.netnsMode'"),
        ({"ipam": {"type": "static", "addresses": [{"address": "203.0.113.11/24"}]}}, "'ipam'"),
        ({"resourceName": "example.com/none"}, "'resourceName'"),
    ],
)
def test_a_nad_turning_a_node_knob_is_refused(tenant: Tenant, keys: dict[str, Any], key: str) -> None:
    refused(tenant, tenant.node_config(**keys), key)


@pytest.mark.parametrize(
    "where", ["top-level deviceID", "runtimeConfig.deviceIDs", "runtimeConfig.deviceID"]
)
def test_a_device_id_naming_another_pods_bond_is_refused_naming_both(tenant: Tenant, where: str) -> None:
    dev = "mlx5_bond_0"  # kubelet gave it to team-b/other-0
    keys: dict[str, Any] = (
        {"deviceID": dev} if where.startswith("top") else
        {"runtimeConfig": {"deviceIDs": [dev]}} if where.endswith("s")
        else {"runtimeConfig": {"deviceID": dev}}
    )
    msg = refused(tenant, tenant.node_config(**keys), "bond0")
    assert "team-b/other-0" in msg and "team-a/ibv-app-0" in msg and "bond2, bond3" in msg


def test_a_device_id_naming_a_bond_nobody_holds_is_refused(tenant: Tenant) -> None:
    msg = refused(tenant, tenant.node_config(deviceID="bond1"), "bond1")
    assert "no pod" in msg


def test_a_pod_holding_no_device_gets_no_bond(tenant: Tenant) -> None:
    msg = refused(tenant, tenant.node_config(), "holds no", pod_name="no-devices")
    assert RESOURCE in msg


def test_a_pod_whose_allocation_cannot_be_read_gets_no_bond_and_is_told_why(tenant: Tenant) -> None:
    tenant.server.stop()
    msg = refused(tenant, tenant.node_config(), "cannot be read", code=11)
    assert "bondsFrom: kubelet" in msg


def test_the_pods_own_allocation_still_starts_and_gives_everything_back(tenant: Tenant) -> None:
    """The node's config under the node's policy: the pod gets exactly its bonds, by device ID and by
    none (upstream Multus's two ways), and DEL leaves the node exact."""
    n = tenant.n
    before = n.snapshot()
    pod, args = tenant.pod("ibv-app-0")
    first = n.plugin("ADD", tenant.node_config(deviceID="mlx5_bond_3"), pod, "c1", "net1", extra=args)
    assert first.code == 0, first.out
    second = n.plugin("ADD", tenant.node_config(), pod, "c1", "net2", extra=args)
    assert second.code == 0, second.out
    assert n.pins() == {"bond3": "c1", "bond2": "c1"}
    third = n.plugin("ADD", tenant.node_config(), pod, "c1", "net3", extra=args)
    assert third.code != 0 and third.out["code"] == 7 and "bond0" not in n.pins(), third.out
    for ifname in ("net2", "net1"):
        assert n.plugin("DEL", tenant.node_config(), pod, "c1", ifname, extra=args).code == 0
    assert n.snapshot() == before and n.pins() == {}


def test_del_with_a_tenants_data_dir_still_gives_back_what_the_nodes_records_hold(tenant: Tenant) -> None:
    """A NAD edited after ADD to point dataDir elsewhere: DEL reads the node's records anyway."""
    n = tenant.n
    before = n.snapshot()
    pod, args = tenant.pod("ibv-app-0")
    assert n.plugin("ADD", tenant.node_config(), pod, "c1", "net1", extra=args).code == 0
    edited = tenant.node_config(dataDir=str(tenant.evil / "records"))
    assert n.plugin("DEL", edited, pod, "c1", "net1", extra=args).code == 0
    assert n.snapshot() == before and n.pins() == {} and not tenant.evil.exists()


def test_a_broken_policy_file_refuses_every_add_and_del_naming_it(tenant: Tenant) -> None:
    """DEL too: without the node's paths it could not find the records, and answering "nothing
    recorded" would lose a bond; refused, the runtime retries it once the admin fixed the file."""
    tenant.policy.write_text('{"trust": "node", "bonds": "bond0"}')
    msg = refused(tenant, tenant.node_config(), str(tenant.policy), del_code=7)
    assert "'bonds'" in msg


@pytest.mark.in_process_only
@pytest.mark.parametrize(
    ("keys", "key"),
    [
        ({"link": "macvlan"}, "'link'"),
        ({"ipvlanMode": "l3"}, "'ipvlanMode'"),
        ({"masters": ["hostnic0"]}, "'masters'"),
        ({"dataDir": "/TENANT"}, "'dataDir'"),
        ({"rdma": {"required": False}}, "'rdma.required'"),
    ],
)
def test_shared_mode_nad_keys_the_node_decides_are_refused(
    tenant: Tenant, keys: dict[str, Any], key: str
) -> None:
    """rdma-ipvlan (its IPVLAN links need a kernel this machine lacks; every refusal comes first)."""
    n = tenant.n
    before = n.snapshot()
    pod, args = tenant.pod("ibv-app-0")
    conf = {"cniVersion": "1.0.0", "name": "tke-rdma-ipvlan", "type": "rdma-ipvlan", **keys}
    env = n.env("ADD", pod, "c1", "net1", args)
    proc = subprocess.run(["ip", "netns", "exec", n.name, sys.executable, "-m", "rdma_cni.cli.ipvlan"],
                          input=json.dumps(conf).encode(), capture_output=True, env=env, cwd=REPO,
                          check=False)
    err = json.loads(proc.stdout)
    assert proc.returncode != 0 and err["code"] == 7 and key in err["msg"], err
    assert n.snapshot() == before and not os.path.exists("/TENANT")


def test_ips_and_cni_args_a_pod_author_sets_never_take_the_node_ip(tenant: Tenant) -> None:
    """What rdma-multus and Multus hand a delegate from the JSON annotation (``ips`` as the ``ips``
    capability and ``IP=`` in CNI_ARGS, ``cni-args`` as ``args.cni``): the pod still gets its own
    allocated bond with that bond's own address, never the node's IP it asked for."""
    n = tenant.n
    before = n.snapshot()
    pod, args = tenant.pod("ibv-app-0")
    extra = {"CNI_ARGS": args["CNI_ARGS"] + f";IP={NODE_IP}"}
    conf = tenant.node_config(deviceID="mlx5_bond_3", runtimeConfig={"ips": [NODE_IP]},
                              args={"cni": {"ips": [NODE_IP], "masters": ["hostnic0"]}})
    r = n.plugin("ADD", conf, pod, "c1", "net1", extra=extra)
    assert r.code == 0, r.out
    assert [ip["address"] for ip in r.out["ips"]] == [HOST["bond3"]]
    assert n.pins() == {"bond3": "c1"}
    assert n.snapshot()["addr"] != before["addr"]  # bond3's address is in the pod now, hostnic0's is not
    host = {link["ifname"]: link for link in n.node_json("addr")}
    v4 = [f"{a['local']}/{a['prefixlen']}" for a in host["hostnic0"]["addr_info"] if a["family"] == "inet"]
    assert v4 == [NODE_IP]
    assert n.plugin("DEL", conf, pod, "c1", "net1", extra=extra).code == 0
    assert n.snapshot() == before and n.pins() == {}
