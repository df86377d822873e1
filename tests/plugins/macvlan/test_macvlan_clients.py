"""rdma-macvlan driven by real CNI clients, not only by direct plugin execs: upstream cnitool (built
from Debian's source), the project's cni-tool, both against each other, and containerd's CRI plugin
with rdma-macvlan as the pod network itself (no multus in between).

Each flow checks the promise of the plugin from the outside: after ADD the pod holds the bond's
address(es) and reaches the switch through each interface; CHECK passes; after DEL the node's
``ip -j addr``/``route``/``rule`` (and link list) are exactly what they were before ADD; DEL again
(and containerd's second DEL with an empty ``CNI_NETNS`` and no ``prevResult``) still succeeds.
Setup and cleanup live in :mod:`clients`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from clients import (
    ClientNode,
    Tool,
    build_cnitool,
    client_node,
    containerd,
    pod_links,
    pod_view,
    sandbox_netns,
)
from netns import can_run, sh

from rdma_cni.cli.tool import container_id_for

pytestmark = pytest.mark.netns

NET = "h8-rdma"
MAC = "02:00:5e:10:00:88"

BONDS = {  # bond -> (its address, the switch peer's address, a subnet routed via the peer)
    "bond0": ("198.51.100.2/28", "198.51.100.1/28", "203.0.113.0/28"),
    "bond1": ("198.51.100.18/28", "198.51.100.17/28", "203.0.113.16/28"),
}


@pytest.fixture(scope="module")
def cnitool() -> str:
    reason = can_run() or ("" if shutil.which("unshare") else "needs unshare(1) for cnitool's cache dir")
    if reason:
        pytest.skip(reason)
    path, why = build_cnitool()
    if not path:
        pytest.skip(why)
    return path


@pytest.fixture
def node() -> Iterator[ClientNode]:
    reason = can_run()
    if reason:
        pytest.skip(reason)
    with client_node() as n:
        yield n


def cable(n: ClientNode, *bonds: str) -> None:
    """The bonds with their host address and a route through the switch peer (moved and given back)."""
    for bond in bonds:
        cidr, peer, routed = BONDS[bond]
        n.bond(bond, cidr, peer=peer)
        n.ip("route", "add", routed, "via", peer.split("/")[0], "dev", bond)
        sh("ip", "-n", n.switch, "addr", "add", f"{far_ip(bond)}/32", "dev", "lo")  # reached via the route


def peer_ip(bond: str) -> str:
    return BONDS[bond][1].split("/")[0]


def far_ip(bond: str) -> str:
    """An address of the switch that only the bond's route (moved into the pod) leads to."""
    return str(ipaddress.ip_network(BONDS[bond][2])[1])


def node_inet(n: ClientNode, bond: str) -> list[str]:
    links = n.node_json("-4", "addr", "show", "dev", bond)
    return [f"{a['local']}/{a['prefixlen']}" for link in links for a in link["addr_info"]]


def tools(n: ClientNode, cnitool: str) -> dict[str, Tool]:
    return {name: Tool(name, n, cnitool) for name in ("cnitool", "cni-tool")}


def assert_clean(n: ClientNode, before: dict[str, object]) -> None:
    assert n.snapshot() == before, "node addresses/routes/rules/links differ from before ADD"
    assert n.state_files() == [] and n.pins() == {}


# --- 1 + 2: cnitool and cni-tool, one bond and two -------------------------------------------------------


@pytest.mark.parametrize("client", ["cnitool", "cni-tool"])
def test_one_bond_round_trip(client: str, cnitool: str, node: ClientNode) -> None:
    cable(node, "bond0")
    node.conflist(NET, [node.macvlan(masters=["bond0"])])
    before = node.snapshot()
    pod = node.pod()
    tool = tools(node, cnitool)[client]

    result = json.loads(tool.ok("add", NET, pod))
    assert [i["name"] for i in result["interfaces"]] == ["bond0"]
    assert [ip["address"] for ip in result["ips"]] == ["198.51.100.2/28"]
    assert pod_view(pod.name, "bond0")["inet"] == ["198.51.100.2/28"]
    assert pod_view(pod.name, "bond0")["mac"] == result["interfaces"][0]["mac"]
    assert node_inet(node, "bond0") == [], "the bond still holds the address it gave the pod"
    assert result["routes"] == [{"dst": "203.0.113.0/28", "gw": "198.51.100.1"}]
    assert node.ping(pod, peer_ip("bond0"), "bond0") and node.ping(pod, far_ip("bond0"), "bond0")
    assert set(node.pins()) == {"bond0"}

    tool.ok("check", NET, pod)
    tool.ok("del", NET, pod)
    assert pod_links(pod.name) == {"lo"}
    assert_clean(node, before)
    tool.ok("del", NET, pod)  # again: nothing recorded, still success
    assert_clean(node, before)
    assert list((node.cache / "results").iterdir()) == []


@pytest.mark.parametrize("client", ["cnitool", "cni-tool"])
def test_two_bond_pod_round_trip(client: str, cnitool: str, node: ClientNode) -> None:
    cable(node, "bond0", "bond1")
    node.conflist(NET, [node.macvlan(masters=["bond0", "bond1"], count=2)])
    before = node.snapshot()
    pod = node.pod()
    tool = tools(node, cnitool)[client]

    result = json.loads(tool.ok("add", NET, pod))
    assert sorted(i["name"] for i in result["interfaces"]) == ["bond0", "bond1"]
    assert sorted(ip["address"] for ip in result["ips"]) == ["198.51.100.18/28", "198.51.100.2/28"]
    for bond in ("bond0", "bond1"):
        assert pod_view(pod.name, bond)["inet"] == [BONDS[bond][0]]
        for dst in (peer_ip(bond), far_ip(bond)):
            assert node.ping(pod, dst, bond), f"no reply from {dst} through {bond}"
        assert node_inet(node, bond) == []
    assert set(node.pins()) == {"bond0", "bond1"}

    tool.ok("check", NET, pod)
    tool.ok("del", NET, pod)
    assert pod_links(pod.name) == {"lo"}
    assert_clean(node, before)
    tool.ok("del", NET, pod)
    assert_clean(node, before)


def tuning(n: ClientNode, **keys: object) -> dict[str, object]:
    """Debian's tuning, keeping its backup of the original values in the test's dir (not /run/cni)."""
    if not (n.bin_dir / "tuning").exists():
        pytest.skip("Debian's containernetworking-plugins missing: no /usr/lib/cni/tuning (scripts/setup)")
    return {"type": "tuning", "dataDir": os.path.join(n.tmp, "tuning"), **keys}


@pytest.mark.parametrize("client", ["cnitool", "cni-tool"])
def test_tuning_chained_after_rdma_macvlan(client: str, cnitool: str, node: ClientNode) -> None:
    """Debian's tuning gets our result as prevResult, sets sysctls in the pod and passes the result
    on; CHECK of the whole list (ours with the chain's result, then tuning) passes; DEL (tuning first,
    then ours) gives the node back."""
    cable(node, "bond0")
    node.conflist(NET, [
        node.macvlan(masters=["bond0"], podIfName="cni"),
        tuning(node, sysctl={"net.ipv4.conf.eth0.arp_notify": "1", "net.ipv4.conf.eth0.arp_ignore": "2"}),
    ])  # fmt: skip
    before = node.snapshot()
    pod = node.pod()
    tool = tools(node, cnitool)[client]

    result = json.loads(tool.ok("add", NET, pod))
    assert [i["name"] for i in result["interfaces"]] == ["eth0"]
    assert result["interfaces"][0]["sandbox"] == pod.path
    assert [ip["address"] for ip in result["ips"]] == ["198.51.100.2/28"]
    assert pod_view(pod.name, "eth0")["inet"] == ["198.51.100.2/28"]
    for key, value in (("arp_notify", "1"), ("arp_ignore", "2")):
        assert node.pod_exec(pod, "cat", f"/proc/sys/net/ipv4/conf/eth0/{key}").stdout.strip() == value
    assert node.ping(pod, peer_ip("bond0"), "eth0")

    tool.ok("check", NET, pod)
    tool.ok("del", NET, pod)
    assert pod_links(pod.name) == {"lo"}
    assert_clean(node, before)
    backups = os.path.join(node.tmp, "tuning")
    assert not os.path.exists(backups) or os.listdir(backups) == []


@pytest.mark.parametrize("change", ["mac", "mtu"])
def test_check_accepts_a_mac_or_mtu_set_by_a_later_plugin(change: str, cnitool: str,
                                                           node: ClientNode) -> None:  # fmt: skip
    cable(node, "bond0")
    keys: dict[str, object] = {"capabilities": {"mac": True}} if change == "mac" else {"mtu": 1400}
    node.conflist(NET, [node.macvlan(masters=["bond0"], podIfName="cni"), tuning(node, **keys)])
    before = node.snapshot()
    pod = node.pod()
    tool = tools(node, cnitool)["cnitool"]
    env = {"CAP_ARGS": json.dumps({"mac": MAC})}

    result = json.loads(tool.ok("add", NET, pod, **env))
    view = pod_view(pod.name, "eth0")
    if change == "mac":
        assert result["interfaces"][0]["mac"] == MAC and view["mac"] == MAC  # the chain's final result
    else:
        assert view["mtu"] == 1400
    assert view["inet"] == ["198.51.100.2/28"] and node.ping(pod, peer_ip("bond0"), "eth0")
    check = tool.run("check", NET, pod, **env)
    tool.ok("del", NET, pod, **env)  # DEL and the node's restoration work either way
    assert_clean(node, before)
    assert check.returncode == 0, f"CHECK after tuning changed the {change}: {check.stderr.strip()}"


# --- 2: cross-tool -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("adder,deleter", [("cnitool", "cni-tool"), ("cni-tool", "cnitool")])
def test_one_tool_adds_the_other_checks_and_deletes(adder: str, deleter: str, cnitool: str,
                                                    node: ClientNode) -> None:  # fmt: skip
    cable(node, "bond0", "bond1")
    node.conflist(NET, [node.macvlan(masters=["bond0", "bond1"], count=2)])
    before = node.snapshot()
    pod = node.pod()
    t = tools(node, cnitool)

    t[adder].ok("add", NET, pod)
    assert set(node.pins()) == {"bond0", "bond1"}
    t[deleter].ok("check", NET, pod)
    t[deleter].ok("del", NET, pod)
    assert pod_links(pod.name) == {"lo"}
    assert_clean(node, before)
    t[adder].ok("del", NET, pod)
    assert_clean(node, before)
    assert os.listdir(node.cache / "results") == []


# --- 3: containerd's CRI plugin, rdma-macvlan as the pod network ------------------------------------------


@pytest.fixture
def cri_node(node: ClientNode) -> ClientNode:
    for need in ("containerd", "runc", "ctr", "nsenter"):
        if shutil.which(need) is None:
            pytest.skip(f"needs {need} (Debian's containerd, runc, util-linux)")
    if not (node.bin_dir / "loopback").exists():
        pytest.skip("Debian's containernetworking-plugins missing: containerd needs /usr/lib/cni/loopback")
    if not os.path.exists("/bin/busybox"):
        pytest.skip("needs /bin/busybox (busybox-static) for the sandbox image")
    pytest.importorskip("grpc", reason="needs grpcio for the CRI client")
    return node


def cri_conf(n: ClientNode, **keys: object) -> Path:
    """containerd's conf_dir: one conflist whose first (only) plugin is rdma-macvlan."""
    conf_dir = Path(n.tmp) / "cri-net.d"
    conf_dir.mkdir(exist_ok=True)
    plugin = n.macvlan(masters=["bond0", "bond1"], **keys)
    (conf_dir / "10-h8-rdma.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": NET, "plugins": [plugin]}))  # fmt: skip
    return conf_dir


@pytest.mark.parametrize("count", [1, 2])
def test_containerd_runs_a_pod_on_rdma_macvlan_and_gives_the_bonds_back(
    count: int, cri_node: ClientNode
) -> None:
    n = cri_node
    cable(n, "bond0", "bond1")
    before = n.snapshot()
    # containerd takes the pod IP from the interface named eth0: podIfName "cni" names it so (eth0,
    # then eth0_1 for a second bond).
    pod_ifs = {"bond0": "eth0", "bond1": "eth0_1"} if count == 2 else {"bond0": "eth0"}
    with containerd(n, cri_conf(n, podIfName="cni", count=count)) as cri:
        sid = cri.run_pod_sandbox("h8-app", "default", str(uuid.uuid4()), {})
        state, ip, info = cri.sandbox_status(sid)
        assert state == 0 and ip == "198.51.100.2", "the pod IP is the first bond's IP"
        pod = sandbox_netns(info)
        assert pod_links(pod.name) == {"lo", *pod_ifs.values()}
        for bond, ifname in pod_ifs.items():
            assert pod_view(pod.name, ifname)["inet"] == [BONDS[bond][0]]
            assert node_inet(n, bond) == []
            for dst in (peer_ip(bond), far_ip(bond)):
                assert n.ping(pod, dst, ifname), f"no reply from {dst} through {ifname}"
        if count == 1:
            assert node_inet(n, "bond1") == ["198.51.100.18/28"], "the second bond was not touched"
        assert set(n.pins()) == set(pod_ifs)

        cri.stop_pod_sandbox(sid)  # DEL with the netns and prevResult
        assert_clean(n, before)
        cri.remove_pod_sandbox(sid)  # DEL again: CNI_NETNS="" and no prevResult
        assert_clean(n, before)
    calls = [(cmd, bool(netns), prev) for cmd, netns, prev in n.calls()]
    assert calls == [("ADD", True, False), ("DEL", True, True), ("DEL", False, False)], n.calls()
    assert not os.path.exists(n.calls()[0][1]), "containerd removed the sandbox netns"


def test_containerd_refuses_a_pod_without_eth0_and_the_node_gets_everything_back(
    cri_node: ClientNode,
) -> None:
    """podIfName "master" (the default) names the pod interface bond0: containerd then finds no pod IP
    in the result, fails RunPodSandbox and tears the network down — the bond must get its IP back."""
    n = cri_node
    cable(n, "bond0", "bond1")
    before = n.snapshot()
    with containerd(n, cri_conf(n)) as cri:
        with pytest.raises(grpc_error()) as failed:
            cri.run_pod_sandbox("h8-app", "default", str(uuid.uuid4()), {})
        assert "failed to find network info" in str(failed.value)
        assert_clean(n, before)
    calls = [(cmd, bool(netns), prev) for cmd, netns, prev in n.calls()]
    assert calls == [("ADD", True, False), ("DEL", True, True)], n.calls()
    assert not os.path.exists(n.calls()[0][1]), "containerd removed the sandbox netns"


def test_containerd_pods_share_out_the_bonds_and_a_third_gets_error_11(cri_node: ClientNode) -> None:
    """Each sandbox gets its own bond; with none left, containerd reports our error 11 (naming who
    holds what) and the two running pods keep theirs; stopping them gives everything back."""
    n = cri_node
    cable(n, "bond0", "bond1")
    before = n.snapshot()
    with containerd(n, cri_conf(n, podIfName="cni")) as cri:
        first = cri.run_pod_sandbox("h8-a", "default", str(uuid.uuid4()), {})
        second = cri.run_pod_sandbox("h8-b", "default", str(uuid.uuid4()), {})
        ips = {cri.sandbox_status(sid)[1]: sid for sid in (first, second)}
        assert set(ips) == {"198.51.100.2", "198.51.100.18"}
        assert n.pins() == {"bond0": ips["198.51.100.2"], "bond1": ips["198.51.100.18"]}
        with pytest.raises(grpc_error()) as refused:
            cri.run_pod_sandbox("h8-c", "default", str(uuid.uuid4()), {})
        why = str(refused.value)
        assert 'plugin type="rdma-macvlan" failed (add): no free bond' in why
        assert f"bond0 by container {ips['198.51.100.2']}" in why
        assert f"bond1 by container {ips['198.51.100.18']}" in why
        # containerd DELs the refused sandbox at once: that DEL must not give back the others' bonds
        assert [cmd for cmd, _, _ in n.calls()] == ["ADD", "ADD", "ADD", "DEL"]
        assert n.pins() == {"bond0": ips["198.51.100.2"], "bond1": ips["198.51.100.18"]}
        assert node_inet(n, "bond0") == node_inet(n, "bond1") == []
        for sid in (first, second):
            pod = sandbox_netns(cri.sandbox_status(sid)[2])
            assert n.ping(pod, "198.51.100.1" if ips["198.51.100.2"] == sid else "198.51.100.17", "eth0")
            cri.stop_pod_sandbox(sid)
            cri.remove_pod_sandbox(sid)
        assert_clean(n, before)


def grpc_error() -> type[BaseException]:
    import grpc  # type: ignore[import-untyped]

    return grpc.RpcError  # type: ignore[no-any-return]


# --- result versions and CHECK failures as the clients see them ------------------------------------------


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0"])
def test_older_result_versions_through_cnitool(version: str, cnitool: str, node: ClientNode) -> None:
    """libcni caches our result in the list's version and hands it back as prevResult (CHECK from 0.4.0)."""
    cable(node, "bond0")
    node.conflist(NET, [node.macvlan(masters=["bond0"])], version=version)
    before = node.snapshot()
    pod = node.pod()
    tool = tools(node, cnitool)["cnitool"]

    result = json.loads(tool.ok("add", NET, pod))
    assert result["cniVersion"] == version
    assert result["ips"] == [{"version": "4", "interface": 0, "address": "198.51.100.2/28"}]
    assert node.ping(pod, peer_ip("bond0"), "bond0")
    check = tool.run("check", NET, pod)
    if version == "0.3.1":  # CHECK came with 0.4.0: libcni refuses it before calling the plugin
        assert check.returncode != 0 and "0.3.1" in check.stderr
        assert [c for c, _, _ in node.calls()] == ["ADD"]
    else:
        assert check.returncode == 0, check.stderr
        assert [(c, prev) for c, _, prev in node.calls()] == [("ADD", False), ("CHECK", True)]
    tool.ok("del", NET, pod)
    # libcni hands DEL the cached result only from 0.4.0 on; ours needs neither (its own state)
    assert node.calls()[-1][0] == "DEL" and node.calls()[-1][2] == (version != "0.3.1")
    assert_clean(node, before)


@pytest.mark.parametrize("client", ["cnitool", "cni-tool"])
def test_check_fails_when_the_host_took_the_ip_back_and_del_still_restores(
    client: str, cnitool: str, node: ClientNode
) -> None:
    cable(node, "bond0")
    node.conflist(NET, [node.macvlan(masters=["bond0"])])
    before = node.snapshot()
    pod = node.pod()
    tool = tools(node, cnitool)[client]
    tool.ok("add", NET, pod)
    node.ip("addr", "add", "198.51.100.2/28", "dev", "bond0")  # an admin (or a DHCP client) puts it back

    check = tool.run("check", NET, pod)
    assert check.returncode != 0
    assert "198.51.100.2/28 is back on bond0" in check.stderr
    if client == "cni-tool":  # cnitool prints only the message
        assert "CNI error code 107" in check.stderr
    tool.ok("del", NET, pod)
    assert pod_links(pod.name) == {"lo"}
    assert_clean(node, before)


# --- the pod netns is gone before DEL (kubelet/runtime crashed, node rebooted the pod away) ---------------


@pytest.mark.parametrize("client", ["cnitool", "cni-tool"])
def test_del_after_the_pod_netns_is_gone(client: str, cnitool: str, node: ClientNode) -> None:
    cable(node, "bond0", "bond1")
    node.conflist(NET, [node.macvlan(masters=["bond0", "bond1"], count=2)])
    before = node.snapshot()
    pod = node.pod()
    tool = tools(node, cnitool)[client]
    tool.ok("add", NET, pod)
    node.delete_pod(pod)  # the macvlans die with it; the addresses are only in our state now
    assert not os.path.exists(pod.path)

    tool.ok("del", NET, pod)
    assert_clean(node, before)
    tool.ok("del", NET, pod)
    assert_clean(node, before)


def test_cni_tool_gc_gives_back_the_bonds_of_a_vanished_pod(cnitool: str, node: ClientNode) -> None:
    """cni-tool gc DELs cached attachments whose netns is gone, then sends the plugin GC (CNI 1.1)
    with the live ones: the vanished pod's bond comes back, the live pod keeps its own."""
    cable(node, "bond0", "bond1")
    node.conflist(NET, [node.macvlan(masters=["bond0", "bond1"])], version="1.1.0")
    before = node.snapshot()
    t = tools(node, cnitool)["cni-tool"]
    gone, live = node.pod(), node.pod()
    t.ok("add", NET, gone)
    t.ok("add", NET, live)
    live_id = container_id_for(live.path)
    [bond] = [b for b, holder in node.pins().items() if holder == live_id]
    other = "bond1" if bond == "bond0" else "bond0"
    assert node_inet(node, other) == [] and node.pins()[other] == container_id_for(gone.path)
    node.delete_pod(gone)

    out = t.ok("gc", NET, live)
    assert f"deleted stale attachment {container_id_for(gone.path)}" in out
    assert node.pins() == {bond: live_id}
    assert node_inet(node, other) == [BONDS[other][0]], "the vanished pod's bond has its address back"
    assert pod_view(live.name, bond)["inet"] == [BONDS[bond][0]] and node.ping(live, peer_ip(bond), bond)
    t.ok("check", NET, live)
    t.ok("del", NET, live)
    assert_clean(node, before)
