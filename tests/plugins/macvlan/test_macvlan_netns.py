"""rdma-macvlan through its real executable, in namespaces the tests create (rdma.required: false).

Each test builds a node netns whose veth ends stand in for bonds, runs the plugin there like a
runtime would, and compares the node's ``ip -j addr`` / ``route`` / ``rule`` before ADD and after
DEL.
"""

from __future__ import annotations

import json
import os

import pytest
from netns import Node, Pod, sh

pytestmark = [pytest.mark.netns, pytest.mark.both_modes]


def add_bonds(n: Node, count: int, secondary: bool = True, routes: bool = True) -> list[tuple[str, str, str]]:
    """bond<i>: 198.51.100.(16i+2)/28 (+ .16i+3 secondary), peer .16i+1 in the switch.

    With ``routes``: a gateway route in main (metric 50), a default route in table 10+i and a
    ``from <ip> lookup 10+i`` rule, as a node with per-bond policy routing has.
    """
    out = []
    for i in range(count):
        base = 16 * i
        ip, peer = f"198.51.100.{base + 2}", f"198.51.100.{base + 1}"
        cidrs = [f"{ip}/28 brd +"] + ([f"198.51.100.{base + 3}/28"] if secondary else [])
        n.bond(f"bond{i}", *cidrs, peer=f"{peer}/28")
        if routes:
            n.ip("route", "add", f"203.0.113.{16 * i}/28", "via", peer, "metric", "50")
            n.ip("route", "add", "default", "via", peer, "table", str(10 + i))
            n.ip("rule", "add", "from", ip, "lookup", str(10 + i), "pref", str(1000 + i))
        out.append((f"bond{i}", ip, peer))
    return out


def v4(n_or_json: list[dict[str, object]], ifname: str) -> list[str]:
    for link in n_or_json:
        if link["ifname"] == ifname:
            infos = link["addr_info"]
            assert isinstance(infos, list)
            return [f"{a['local']}/{a['prefixlen']}" for a in infos if a["family"] == "inet"]
    return []


def pod_v4(n: Node, pod: Pod, ifname: str) -> list[str]:
    return v4(n.pod_json(pod, "addr"), ifname)


def test_one_bond_ip_move_round_trip_restores_node_exactly(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    n.ip("addr", "add", "203.0.113.200/26", "dev", "bond0")  # a second primary, after the secondary
    n.ip("addr", "add", "203.0.113.201/26", "dev", "bond0", "label", "bond0:vip")
    before = n.snapshot()
    pod = n.pod()
    res = n.plugin("ADD", n.config(masters=["bond0"]), pod)
    assert res.code == 0, res.stdout + res.stderr
    assert [i["name"] for i in res.out["interfaces"]] == ["bond0"]
    assert res.out["interfaces"][0]["sandbox"] == pod.path
    # The pod holds the bond's addresses in the bond's order (primaries, then secondaries) ...
    assert pod_v4(n, pod, "bond0") == v4(before["addr"], "bond0")
    assert [ip["address"] for ip in res.out["ips"]] == v4(before["addr"], "bond0")
    pod_addrs = n.pod_json(pod, "addr", "show", "bond0")[0]["addr_info"]
    secondary = [a.get("secondary", False) for a in pod_addrs if a["family"] == "inet"]
    assert secondary == [False, False, True, True]
    assert {a.get("label") for a in pod_addrs if a["family"] == "inet"} == {"bond0", "bond0:vip"}
    # ... no IPv6 link-local (addrgenmode none: it would take a RoCE GID slot) ...
    assert not [a for a in pod_addrs if a["family"] == "inet6"]
    # ... the bond kept none, and its link-local stays.
    assert v4(n.node_json("addr"), "bond0") == []
    assert n.ping(pod, "198.51.100.1", "bond0")
    pod_routes = n.pod_json(pod, "route")
    assert {"dst": "203.0.113.0/28", "gateway": "198.51.100.1"}.items() <= next(
        r for r in pod_routes if r["dst"] == "203.0.113.0/28").items()
    res = n.plugin("DEL", n.config(masters=["bond0"]), pod)
    assert res.code == 0, res.stdout + res.stderr
    assert n.snapshot() == before
    assert n.state_files() == []
    assert [link["ifname"] for link in n.pod_json(pod, "link")] == ["lo"]


def test_four_bonds_round_trip_with_per_bond_tables_and_ping_through_each(node_ns: Node) -> None:
    n = node_ns
    bonds = add_bonds(n, 4)
    before = n.snapshot()
    pod = n.pod()
    conf = n.config(masters=[b for b, _, _ in bonds], count=4)
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert [i["name"] for i in res.out["interfaces"]] == ["bond0", "bond1", "bond2", "bond3"]
    rules = n.pod_json(pod, "rule")
    for i, (bond, ip, peer) in enumerate(bonds):
        assert pod_v4(n, pod, bond) == [f"{ip}/28", f"198.51.100.{16 * i + 3}/28"]
        assert any(r.get("src") == ip and r.get("table") == str(100 + i) for r in rules), rules
        table = n.pod_json(pod, "route", "show", "table", str(100 + i))
        assert any(r["dst"] == "default" and r.get("gateway") == peer for r in table), table
        assert n.ping(pod, peer, bond), f"no reply from {peer} through {bond}"
        assert v4(n.node_json("addr"), bond) == []
    assert sorted(n.pins()) == ["bond0", "bond1", "bond2", "bond3"]
    res = n.plugin("DEL", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert n.snapshot() == before
    assert n.state_files() == []


def test_pod_if_name_cni_and_mac_from_runtime_config(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 2, routes=False)
    pod = n.pod()
    conf = n.config(masters=["bond0", "bond1"], count=2, podIfName="cni",
                    runtimeConfig={"mac": "02:00:00:00:00:42"})
    res = n.plugin("ADD", conf, pod, ifname="net1")
    assert res.code == 0, res.stdout + res.stderr
    names = [i["name"] for i in res.out["interfaces"]]
    assert names == ["net1", "net1_1"]
    links = {link["ifname"]: link for link in n.pod_json(pod, "link")}
    assert links["net1"]["address"] == "02:00:00:00:00:42"
    assert res.out["interfaces"][0]["mac"] == "02:00:00:00:00:42"
    assert pod_v4(n, pod, "net1_1") == ["198.51.100.18/28", "198.51.100.19/28"]
    assert n.plugin("DEL", conf, pod, ifname="net1").code == 0


def test_mac_from_cni_args(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1, routes=False)
    pod = n.pod()
    extra = {"CNI_ARGS": "IgnoreUnknown=1;MAC=02:00:00:00:00:07"}
    res = n.plugin("ADD", n.config(masters=["bond0"]), pod, extra=extra)
    assert res.code == 0, res.stdout + res.stderr
    assert n.pod_json(pod, "link", "show", "bond0")[0]["address"] == "02:00:00:00:00:07"


def test_device_ids_choose_the_named_bonds(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 3, routes=False)
    pod = n.pod()
    conf = n.config(masters=["bond0", "bond1", "bond2"], runtimeConfig={"deviceIDs": ["bond2", "bond0"]})
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert [i["name"] for i in res.out["interfaces"]] == ["bond2", "bond0"]
    assert n.pins() == {"bond2": "c1", "bond0": "c1"}
    # Opaque IDs (what a shared device plugin hands out) only give a count: the free bond1.
    pod2 = n.pod()
    conf2 = n.config(masters=["bond0", "bond1", "bond2"], deviceID="7")
    res = n.plugin("ADD", conf2, pod2, container_id="c2")
    assert res.code == 0, res.stdout + res.stderr
    assert [i["name"] for i in res.out["interfaces"]] == ["bond1"]
    # A named bond pinned to another live container: error 11 naming the holder (at once with
    # pinnedWaitMs 0; test_macvlan_pinned_wait has the wait for its DEL).
    pod3 = n.pod()
    res = n.plugin("ADD", n.config(masters=["bond0", "bond1", "bond2"], deviceID="bond1", pinnedWaitMs=0),
                   pod3, container_id="c3")
    assert res.code == 1 and res.out["code"] == 11
    assert "bond1" in res.out["msg"] and "c2" in res.out["msg"]


def test_add_fails_when_pod_interface_exists_and_node_unchanged(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    pod = n.pod()
    n.pod_exec(pod, "ip", "link", "add", "bond0", "type", "veth", "peer", "name", "x0")
    res = n.plugin("ADD", n.config(masters=["bond0"]), pod)
    assert res.code == 1
    assert "bond0 already exists" in res.out["msg"]
    assert n.snapshot() == before
    assert n.state_files() == []


@pytest.mark.parametrize(
    ("keys", "key"),
    [
        ({"count": "2"}, "count"),
        ({"rdma": {"required": "no"}}, "rdma.required"),
        ({"mtu": 9000}, "mtu"),
        ({"mode": "bridgee"}, "mode"),
        ({"masters": "bond0"}, "masters"),
        ({"podIfName": 3}, "podIfName"),
        ({"rdma": {"gidIndex": "three"}}, "rdma.gidIndex"),
    ],
)
def test_bad_config_is_error_7_naming_the_key_and_node_unchanged(
    node_ns: Node, keys: dict[str, object], key: str
) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    pod = n.pod()
    conf = n.config(masters=["bond0"])
    conf.update(keys)
    res = n.plugin("ADD", conf, pod)
    assert res.code == 1
    assert res.out["code"] == 7, res.out
    assert f"'{key}'" in res.out["msg"]
    assert n.snapshot() == before
    assert n.state_files() == []


def test_unknown_config_keys_are_ignored(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1, routes=False)
    pod = n.pod()
    res = n.plugin("ADD", n.config(masters=["bond0"], someFutureKey={"x": 1}), pod)
    assert res.code == 0, res.stdout


# ------------------------------------------------------------------ DEL oddities
def _added(
    n: Node, secondary: bool = True, version: str = "1.0.0"
) -> tuple[Pod, dict[str, object], dict[str, object]]:
    add_bonds(n, 1, secondary=secondary)
    before = n.snapshot()
    pod = n.pod()
    res = n.plugin("ADD", n.config(masters=["bond0"], cniVersion=version), pod)
    assert res.code == 0, res.stdout + res.stderr
    return pod, before, res.out


def test_del_with_empty_netns_restores_host(node_ns: Node) -> None:
    n = node_ns
    pod, before, _ = _added(n)
    res = n.plugin("DEL", n.config(masters=["bond0"]), "")
    assert res.code == 0, res.stdout
    assert n.snapshot() == before
    # The recorded netns was still there and still ours: the pod interface went first.
    assert [link["ifname"] for link in n.pod_json(pod, "link")] == ["lo"]


def test_del_after_netns_deleted_restores_host(node_ns: Node) -> None:
    n = node_ns
    pod, before, _ = _added(n)
    n.delete_pod(pod)
    res = n.plugin("DEL", n.config(masters=["bond0"]), pod)
    assert res.code == 0, res.stdout
    assert n.snapshot() == before
    assert n.state_files() == []


def test_del_with_netns_path_that_is_not_a_netns(node_ns: Node) -> None:
    n = node_ns
    _, before, _ = _added(n)
    bogus = os.path.join(n.tmp, "not-a-netns")
    with open(bogus, "w") as f:
        f.write("x")
    res = n.plugin("DEL", n.config(masters=["bond0"]), bogus)
    assert res.code == 0, res.stdout
    assert n.snapshot() == before


def test_del_without_state_and_repeated(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    pod = n.pod()
    for _ in range(2):
        res = n.plugin("DEL", n.config(masters=["bond0"]), pod, container_id="never-added")
        assert res.code == 0, res.stdout
    res = n.plugin("ADD", n.config(masters=["bond0"]), pod)
    assert res.code == 0
    for _ in range(3):
        assert n.plugin("DEL", n.config(masters=["bond0"]), pod).code == 0
    assert n.snapshot() == before


def test_containerd_double_del_second_without_netns_or_prev_result(node_ns: Node) -> None:
    n = node_ns
    pod, before, result = _added(n)
    conf = n.config(masters=["bond0"])
    conf["prevResult"] = result
    assert n.plugin("DEL", conf, pod).code == 0  # StopPodSandbox
    n.delete_pod(pod)
    assert n.plugin("DEL", n.config(masters=["bond0"]), "").code == 0  # RemovePodSandbox
    assert n.snapshot() == before


def test_del_does_not_touch_a_reused_netns_path(node_ns: Node) -> None:
    n = node_ns
    pod, before, _ = _added(n)
    n.delete_pod(pod)
    sh("ip", "netns", "add", pod.name)  # the same path now names a different netns with its own "bond0"
    n.pod_exec(pod, "ip", "link", "add", "bond0", "type", "veth", "peer", "name", "other0")
    res = n.plugin("DEL", n.config(masters=["bond0"]), pod)
    assert res.code == 0, res.stdout
    assert n.snapshot() == before
    assert {link["ifname"] for link in n.pod_json(pod, "link")} == {"lo", "bond0", "other0"}


# ------------------------------------------------------------------ CHECK, STATUS, GC
def _check(n: Node, pod: Pod, result: dict[str, object]) -> tuple[int, dict[str, object]]:
    conf = n.config(masters=["bond0"], cniVersion=result["cniVersion"])
    conf["prevResult"] = result
    res = n.plugin("CHECK", conf, pod)
    return res.code, res.out


@pytest.mark.parametrize(
    "drift",
    ["none", "pod_address_gone", "mtu_changed", "ip_back_on_bond", "interface_deleted", "route_gone"],
)
def test_check_detects_drift(node_ns: Node, drift: str) -> None:
    # 1.1.0: the chain's result carries the interface MTU, which is what CHECK compares in a chain
    # (a later plugin such as tuning may change MAC/MTU legitimately).
    n = node_ns
    pod, _, result = _added(n, secondary=False, version="1.1.0")
    if drift == "pod_address_gone":
        n.pod_exec(pod, "ip", "addr", "del", "198.51.100.2/28", "dev", "bond0")
    elif drift == "mtu_changed":
        n.pod_exec(pod, "ip", "link", "set", "bond0", "mtu", "1400")
    elif drift == "ip_back_on_bond":
        n.ip("addr", "add", "198.51.100.2/28", "dev", "bond0")
    elif drift == "interface_deleted":
        n.pod_exec(pod, "ip", "link", "del", "bond0")
    elif drift == "route_gone":
        n.pod_exec(pod, "ip", "route", "del", "203.0.113.0/28")
    code, out = _check(n, pod, result)
    if drift == "none":
        assert code == 0, out
    else:
        assert code == 1 and out["code"] == 107, out


def test_check_without_prev_result_compares_mtu_with_the_record(node_ns: Node) -> None:
    n = node_ns
    pod, _, _ = _added(n, secondary=False)
    n.pod_exec(pod, "ip", "link", "set", "bond0", "mtu", "1400")
    res = n.plugin("CHECK", n.config(masters=["bond0"]), pod)
    assert res.code == 1 and res.out["code"] == 107 and "MTU is 1400" in res.out["msg"], res.out


def test_check_without_add_fails(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    pod = n.pod()
    res = n.plugin("CHECK", n.config(masters=["bond0"], cniVersion="1.0.0"), pod)
    assert res.code == 1 and res.out["code"] == 107


def test_status_ok_then_50_when_every_bond_is_pinned(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    conf = n.config(masters=["bond0"], cniVersion="1.1.0")
    assert n.plugin("STATUS", conf).code == 0
    pod = n.pod()
    assert n.plugin("ADD", conf, pod, container_id="holder").code == 0
    res = n.plugin("STATUS", conf)
    assert res.code == 1 and res.out["code"] == 50
    assert "holder" in res.out["msg"]


def test_gc_cleans_every_attachment_not_in_the_valid_list(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 2)
    before = n.snapshot()
    conf = n.config(masters=["bond0", "bond1"], cniVersion="1.1.0")
    pods = [n.pod(), n.pod()]
    for i, pod in enumerate(pods):
        assert n.plugin("ADD", conf, pod, container_id=f"c{i}").code == 0
    gc = dict(conf)
    gc["cni.dev/valid-attachments"] = [{"containerID": "c0", "ifname": "net1"}]
    res = n.plugin("GC", gc)
    assert res.code == 0, res.stdout
    assert n.pins() == {"bond0": "c0"}
    assert [link["ifname"] for link in n.pod_json(pods[1], "link")] == ["lo"]
    assert n.ping(pods[0], "198.51.100.1", "bond0")
    gc["cni.dev/valid-attachments"] = []
    assert n.plugin("GC", gc).code == 0
    assert n.snapshot() == before
    assert n.state_files() == []


def test_add_reclaims_a_bond_pinned_to_a_dead_netns(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    conf = n.config(masters=["bond0"])
    old = n.pod()
    assert n.plugin("ADD", conf, old, container_id="dead").code == 0
    n.delete_pod(old)  # the runtime never called DEL
    new = n.pod()
    res = n.plugin("ADD", conf, new, container_id="alive")
    assert res.code == 0, res.stdout
    assert n.pins() == {"bond0": "alive"}
    assert n.plugin("DEL", conf, new, container_id="alive").code == 0
    assert n.snapshot() == before


def test_ipam_present_leaves_the_bond_ip_alone(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    ipam = {"type": "host-local", "dataDir": os.path.join(n.tmp, "ipam"),
            "ranges": [[{"subnet": "198.51.100.0/28", "rangeStart": "198.51.100.10",
                         "rangeEnd": "198.51.100.12"}]]}
    conf = n.config(masters=["bond0"], ipam=ipam)
    pod = n.pod()
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert [ip["address"] for ip in res.out["ips"]] == ["198.51.100.10/28"]
    assert pod_v4(n, pod, "bond0") == ["198.51.100.10/28"]
    assert v4(n.node_json("addr"), "bond0") == ["198.51.100.2/28", "198.51.100.3/28"]
    assert n.ping(pod, "198.51.100.1", "bond0")
    assert n.plugin("DEL", conf, pod).code == 0
    assert n.snapshot() == before
    assert "198.51.100.10" not in os.listdir(os.path.join(n.tmp, "ipam", "rdma-net"))  # lease released


def test_injected_error_at_every_add_step_rolls_back_both_bonds(node_ns: Node) -> None:
    from rdma_cni.plugins.macvlan.tx import ADD_STEPS

    n = node_ns
    add_bonds(n, 2)
    before = n.snapshot()
    conf = n.config(masters=["bond0", "bond1"], count=2)
    for step in ADD_STEPS:
        nth = "#2" if step.startswith(("link", "addresses", "routes", "rdma", "announced")) else ""
        pod = n.pod()
        res = n.plugin("ADD", conf, pod, extra={"RDMA_CNI_FAILPOINT": f"{step}{nth}:error"})
        assert res.code == 1, (step, res.stdout)
        assert "injected failure" in res.out["msg"], res.out
        assert n.snapshot() == before, step
        assert n.state_files() == [], step
        assert [link["ifname"] for link in n.pod_json(pod, "link")] == ["lo"], step
        n.delete_pod(pod)


def test_result_in_every_requested_version(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    for i, version in enumerate(("0.3.1", "0.4.0", "1.0.0", "1.1.0")):
        pod = n.pod()
        conf = n.config(masters=["bond0"], cniVersion=version)
        res = n.plugin("ADD", conf, pod, container_id=f"v{i}")
        assert res.code == 0, res.stdout
        assert res.out["cniVersion"] == version
        legacy = version < "1.0.0"
        assert all(("version" in ip) == legacy for ip in res.out["ips"]), json.dumps(res.out)
        assert ("mtu" in res.out["interfaces"][0]) == (version == "1.1.0")
        assert n.plugin("DEL", conf, pod, container_id=f"v{i}").code == 0


def test_del_succeeds_and_forgets_when_the_bond_itself_is_gone(node_ns: Node) -> None:
    n = node_ns
    pod, _, _ = _added(n)
    n.ip("link", "del", "bond0")  # the macvlan on it goes too
    res = n.plugin("DEL", n.config(masters=["bond0"]), pod)
    assert res.code == 0, res.stdout
    assert n.state_files() == []
    with open(os.path.join(n.tmp, "plugin.log")) as f:
        assert "bond bond0 no longer exists" in f.read()


def test_add_with_a_netns_path_that_is_missing_or_not_a_netns_is_error_4(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    bogus = os.path.join(n.tmp, "plain-file")
    with open(bogus, "w") as f:
        f.write("x")
    for path in (bogus, os.path.join(n.tmp, "missing")):
        res = n.plugin("ADD", n.config(masters=["bond0"]), path)
        assert res.code == 1 and res.out["code"] == 4, res.out
    assert not os.path.exists(os.path.join(n.tmp, "missing"))  # never created by accident
    assert n.snapshot() == before and n.state_files() == []


def test_a_second_add_of_the_same_attachment_replaces_the_first(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    pod = n.pod()
    conf = n.config(masters=["bond0"])
    first = n.plugin("ADD", conf, pod)
    second = n.plugin("ADD", conf, pod)
    assert first.code == 0 and second.code == 0, second.stdout
    assert n.pins() == {"bond0": "c1"}
    assert pod_v4(n, pod, "bond0") == ["198.51.100.2/28", "198.51.100.3/28"]
    assert n.plugin("DEL", conf, pod).code == 0
    assert n.snapshot() == before
