"""rdma-ipvlan (shared mode) on real namespaces, with ``link: macvlan`` (this kernel has no IPVLAN):
veth "bonds" in a node netns, their peers in a switch netns, real pods. Every pod shares every bond
through a child of its own holding an address of its own from the bond's subnet; the host bond is
never changed. Each test runs in-process and through rdma-agent (``both_modes``)."""

from __future__ import annotations

import ipaddress
import subprocess
import uuid

import pytest
from ipvlan_support import Shared, ip_of
from netns import Node, Pod, policy_env

pytestmark = [pytest.mark.netns, pytest.mark.both_modes]

VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")


def masters(count: int) -> list[str]:
    return [f"bond{i}" for i in range(count)]


def add(s: Shared, conf: dict[str, object], pod: Pod, cid: str) -> dict[str, object]:
    res = s.plugin("ADD", conf, pod, container_id=cid)
    assert res.code == 0, res.stdout + res.stderr[-3000:]
    return res.out


def addresses_by_bond(out: dict[str, object]) -> dict[str, list[str]]:
    names = [i["name"] for i in out["interfaces"]]  # type: ignore[attr-defined]
    got: dict[str, list[str]] = {n: [] for n in names}
    for entry in out["ips"]:  # type: ignore[attr-defined]
        got[names[entry["interface"]]].append(ip_of(entry))
    return got


@pytest.mark.parametrize("count", [1, 4, 8])
def test_pods_share_every_bond_with_their_own_addresses_ping_and_del_leaves_the_node_exact(
    node_ns: Node, count: int
) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(count)
    conf = s.config(masters=masters(count))
    before = n.snapshot()
    pods = [n.pod(), n.pod()]
    outs = [add(s, conf, pod, f"c{i}") for i, pod in enumerate(pods)]
    assert n.snapshot() == before  # the host bonds keep all their addresses, routes and rules
    got = [addresses_by_bond(out) for out in outs]
    for b in range(count):
        # .1 is the peer (a gateway of the bond's route), .2 the bond: the pods get .3 and .4
        assert got[0][f"bond{b}"] == [f"198.51.100.{16 * b + 3}"]
        assert got[1][f"bond{b}"] == [f"198.51.100.{16 * b + 4}"]
        assert s.pod_addresses(pods[0])[f"bond{b}"] == [f"198.51.100.{16 * b + 3}/28"]
    for b in range(count):
        bond = f"bond{b}"
        assert n.ping(pods[0], f"198.51.100.{16 * b + 1}", iface=bond), bond  # pod -> switch
        assert n.ping(pods[1], f"198.51.100.{16 * b + 1}", iface=bond), bond
        assert n.ping(pods[0], got[1][bond][0], iface=bond), bond  # pod -> pod over the same bond
        assert n.ping(pods[1], got[0][bond][0], iface=bond), bond
    for i, pod in enumerate(pods):
        assert s.plugin("DEL", conf, pod, container_id=f"c{i}").code == 0
        assert s.pod_links(pod) == ["lo"]
    assert n.snapshot() == before
    assert s.state_files() == []


def test_each_bond_gets_a_pod_table_with_its_routes_from_the_pod_address_and_from_rules(
    node_ns: Node,
) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    pod = n.pod()
    add(s, s.config(masters=masters(2)), pod, "c1")
    rules = {(r.get("src"), r.get("table")) for r in n.pod_json(pod, "rule")}
    assert {("198.51.100.3", "100"), ("198.51.100.19", "101")} <= rules
    for table, b in (("100", 0), ("101", 1)):
        routes = n.pod_json(pod, "route", "show", "table", table)
        dsts = {(r["dst"], r.get("gateway"), r.get("prefsrc")) for r in routes}
        assert (f"203.0.113.{16 * b}/28", f"198.51.100.{16 * b + 1}", None) in dsts
        assert (f"198.51.100.{16 * b}/28", None, f"198.51.100.{16 * b + 3}") in dsts
    # a copy of the bond's route reaches its network from the pod's address, not the bond's
    assert n.ping(pod, "198.51.100.1", iface="bond0")
    # each child answers ARP only for its own address (no ARP flux between bonds of one subnet)
    for bond in ("bond0", "bond1"):
        conf = {
            k: n.pod_exec(pod, "cat", f"/proc/sys/net/ipv4/conf/{bond}/{k}").stdout.strip()
            for k in ("arp_ignore", "arp_announce", "arp_notify")
        }
        assert conf == {"arp_ignore": "1", "arp_announce": "2", "arp_notify": "1"}, (bond, conf)


def test_two_then_twelve_pods_fill_a_28_and_the_next_is_error_11_naming_bond_subnet_and_holders(
    node_ns: Node,
) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=masters(2))
    before = n.snapshot()
    pods = [n.pod() for _ in range(13)]
    for i in range(12):  # .3-.14: 12 addresses once the peer (gateway) and the bond are left out
        add(s, conf, pods[i], f"c{i}")
    assert len(s.held()["bond0"]) == 12 and len(s.held()["bond1"]) == 12
    res = s.plugin("ADD", conf, pods[12], container_id="c12")
    assert res.code == 1 and res.out["code"] == 11, res.stdout
    msg = res.out["msg"]
    assert "bond0" in msg and "198.51.100.0/28" in msg and "12 pod(s)" in msg, msg
    assert s.pod_links(pods[12]) == ["lo"]  # nothing left behind
    assert "c12@net1.json" not in s.state_files()
    assert s.plugin("DEL", conf, pods[5], container_id="c5").code == 0
    out = add(s, conf, pods[12], "c12")  # the freed address is the one the next pod gets
    assert addresses_by_bond(out) == {"bond0": ["198.51.100.8"], "bond1": ["198.51.100.24"]}
    for i in [*range(5), *range(6, 13)]:
        assert s.plugin("DEL", conf, pods[i], container_id=f"c{i}").code == 0
    assert n.snapshot() == before and s.state_files() == []


@pytest.mark.parametrize("version", VERSIONS)
def test_result_in_every_spec_version(node_ns: Node, version: str) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=masters(2), cniVersion=version)
    pod = n.pod()
    out = add(s, conf, pod, "c1")
    assert out["cniVersion"] == version
    assert [i["name"] for i in out["interfaces"]] == ["bond0", "bond1"]  # type: ignore[attr-defined]
    assert all(i["sandbox"] == pod.path for i in out["interfaces"])  # type: ignore[attr-defined]
    assert addresses_by_bond(out) == {"bond0": ["198.51.100.3"], "bond1": ["198.51.100.19"]}
    if version.startswith("0.3"):
        assert all(ip["version"] == "4" for ip in out["ips"])  # type: ignore[attr-defined]
    assert s.plugin("DEL", conf, pod, container_id="c1").code == 0


def test_ranges_and_exclude_bound_what_pods_get(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(
        masters=masters(2),
        ranges={
            "bond0": "198.51.100.10-198.51.100.13",
            "bond1": ["198.51.100.20-198.51.100.23", "198.51.100.25"],
        },
        exclude=["198.51.100.11", "198.51.100.20/31"],
    )
    pods = [n.pod() for _ in range(4)]
    outs = [add(s, conf, pods[i], f"c{i}") for i in range(3)]
    assert [addresses_by_bond(o) for o in outs] == [
        {"bond0": ["198.51.100.10"], "bond1": ["198.51.100.22"]},
        {"bond0": ["198.51.100.12"], "bond1": ["198.51.100.23"]},
        {"bond0": ["198.51.100.13"], "bond1": ["198.51.100.25"]},
    ]
    res = s.plugin("ADD", conf, pods[3], container_id="c3")
    assert res.code == 1 and res.out["code"] == 11, res.stdout
    assert "bond0" in res.out["msg"] and "198.51.100.10-198.51.100.13" in res.out["msg"]
    assert "3 pod(s)" in res.out["msg"]
    assert s.pod_links(pods[3]) == ["lo"]
    for i in range(3):
        assert s.plugin("DEL", conf, pods[i], container_id=f"c{i}").code == 0


def test_a_range_outside_the_subnet_or_an_unknown_master_is_error_7_and_changes_nothing(
    node_ns: Node,
) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(1)
    before = n.snapshot()
    pod = n.pod()
    for conf, words in (
        (
            s.config(masters=["bond0"], ranges={"bond0": "198.51.100.10-198.51.100.40"}),
            ("'ranges.bond0'", "198.51.100.0/28"),
        ),
        (s.config(masters=["bond0", "bond7"]), ("'masters'", "'bond7'")),
        (s.config(masters=["bond0"], mtu=9000), ("'mtu'", "bond0")),
        (s.config(masters=["bond0"], link="vxlan"), ("'link'", "macvlan")),
    ):
        res = s.plugin("ADD", conf, pod, container_id="c1")
        assert res.code == 1 and res.out["code"] == 7, res.stdout
        assert all(w in res.out["msg"] for w in words), res.out["msg"]
        assert s.pod_links(pod) == ["lo"] and s.state_files() == []
    assert n.snapshot() == before


def ipvlan_missing() -> bool:
    name = f"h2-probe-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        proc = subprocess.run(
            ["ip", "-n", name, "link", "add", "x", "type", "ipvlan"],
            capture_output=True,
            text=True,
            check=False,
        )
        # ipvlan needs a parent: a kernel that has it complains about that, not about the type
        return "Unknown device type" in proc.stderr
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_link_ipvlan_on_a_kernel_without_it_names_the_module_and_link_macvlan_and_leaves_nothing(
    node_ns: Node,
) -> None:
    if not ipvlan_missing():
        pytest.skip("this kernel has IPVLAN (the VM test covers link: ipvlan)")
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    before = n.snapshot()
    pod = n.pod()
    conf = s.config(masters=masters(2), link="ipvlan")
    res = s.plugin("ADD", conf, pod, container_id="c1")
    assert res.code == 1 and res.out["code"] == 7, res.stdout
    msg = res.out["msg"]
    assert "'ipvlan'" in msg and '"link": "macvlan"' in msg and "modprobe ipvlan" in msg, msg
    assert s.pod_links(pod) == ["lo"] and s.state_files() == [] and s.held() == {}
    assert n.snapshot() == before
    assert s.plugin("DEL", conf, pod, container_id="c1").code == 0  # the runtime's DEL after it
    out = add(s, s.config(masters=masters(2)), pod, "c1")  # the same bonds, link: macvlan: fine
    assert addresses_by_bond(out)["bond0"] == ["198.51.100.3"]


def test_ipv6_too_when_the_bond_holds_a_global_ipv6(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2, v6=True)
    for i in range(2):  # the peer as an IPv6 gateway too: never a pod's
        n.ip("-6", "route", "add", f"2001:db8:ff{i}::/64", "via", f"2001:db8:{i}::1")
    conf = s.config(masters=masters(2))
    before = n.snapshot()
    pods = [n.pod(), n.pod()]
    outs = [add(s, conf, pod, f"c{i}") for i, pod in enumerate(pods)]
    assert addresses_by_bond(outs[0]) == {
        "bond0": ["198.51.100.3", "2001:db8::3"],
        "bond1": ["198.51.100.19", "2001:db8:1::3"],
    }
    assert addresses_by_bond(outs[1])["bond1"] == ["198.51.100.20", "2001:db8:1::4"]
    assert "2001:db8:1::4/64" in s.pod_addresses(pods[1])["bond1"]
    rules = {(r.get("src"), r.get("table")) for r in n.pod_json(pods[0], "-6", "rule")}
    assert ("2001:db8::3", "100") in rules and ("2001:db8:1::3", "101") in rules
    routes = n.pod_json(pods[0], "-6", "route", "show", "table", "101")
    assert {"dst": "2001:db8:ff1::/64", "gateway": "2001:db8:1::1"}.items() <= {
        k: v for r in routes if r["dst"] == "2001:db8:ff1::/64" for k, v in r.items()
    }.items()
    assert n.ping(pods[0], "198.51.100.17", iface="bond1")
    for i, pod in enumerate(pods):
        assert s.plugin("DEL", conf, pod, container_id=f"c{i}").code == 0
    assert n.snapshot() == before and s.state_files() == []


@pytest.mark.parametrize("drift", ["address", "route", "rule", "down", "mtu", "gone"])
def test_check_passes_after_add_and_fails_after_drift(node_ns: Node, drift: str) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=masters(2))
    pod = n.pod()
    add(s, conf, pod, "c1")
    assert s.plugin("CHECK", conf, pod, container_id="c1").code == 0
    change = {
        "address": ["addr", "del", "198.51.100.19/28", "dev", "bond1"],
        "route": ["route", "del", "203.0.113.16/28", "table", "101"],
        "rule": ["rule", "del", "from", "198.51.100.3", "table", "100"],
        "down": ["link", "set", "bond0", "down"],
        "mtu": ["link", "set", "bond1", "mtu", "1400"],
        "gone": ["link", "del", "bond1"],
    }[drift]
    subprocess.run(["ip", "-n", pod.name, *change], check=True)
    res = s.plugin("CHECK", conf, pod, container_id="c1")
    assert res.code == 1 and res.out["code"] == 107, (drift, res.stdout)
    assert s.plugin("DEL", conf, pod, container_id="c1").code == 0


def test_check_without_add_fails_and_del_of_nothing_or_twice_succeeds(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(1)
    conf = s.config(masters=["bond0"])
    pod = n.pod()
    assert s.plugin("CHECK", conf, pod, container_id="never").out["code"] == 107
    assert s.plugin("DEL", conf, pod, container_id="never").code == 0
    assert s.plugin("DEL", conf, "", container_id="never").code == 0
    add(s, conf, pod, "c1")
    n.delete_pod(pod)  # the netns went first (the kernel took the child with it)
    assert s.plugin("DEL", conf, pod, container_id="c1").code == 0
    assert s.plugin("DEL", conf, pod, container_id="c1").code == 0
    assert s.held() == {}


def test_gc_frees_the_addresses_of_attachments_not_in_the_valid_list(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=masters(2), cniVersion="1.1.0")
    before = n.snapshot()
    pods = [n.pod() for _ in range(3)]
    for i, pod in enumerate(pods):
        add(s, conf, pod, f"c{i}")
    gc = dict(conf)
    gc["cni.dev/valid-attachments"] = [{"containerID": "c1", "ifname": "net1"}]
    res = s.plugin("GC", gc)
    assert res.code == 0, res.stdout + res.stderr[-2000:]
    assert s.held() == {"bond0": {"198.51.100.4": "c1"}, "bond1": {"198.51.100.20": "c1"}}
    assert s.pod_links(pods[0]) == ["lo"] and s.pod_links(pods[2]) == ["lo"]
    assert s.pod_links(pods[1]) == ["bond0", "bond1", "lo"]
    out = add(s, conf, n.pod(), "c3")
    assert addresses_by_bond(out)["bond0"] == ["198.51.100.3"]  # c0's, freed
    gc["cni.dev/valid-attachments"] = []
    assert s.plugin("GC", gc).code == 0
    assert s.held() == {} and s.state_files() == [] and n.snapshot() == before


def test_status_ready_then_50_when_a_bond_has_no_free_address(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=masters(2), cniVersion="1.1.0", ranges={"bond1": "198.51.100.20"})
    assert s.plugin("STATUS", conf).code == 0
    pod = n.pod()
    add(s, conf, pod, "c1")
    res = s.plugin("STATUS", conf)
    assert res.code == 1 and res.out["code"] == 50 and "bond1" in res.out["msg"], res.stdout
    assert s.plugin("DEL", conf, pod, container_id="c1").code == 0
    assert s.plugin("STATUS", conf).code == 0


def test_a_repeated_add_of_one_attachment_replaces_it_and_keeps_one_address_per_bond(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(1)
    conf = s.config(masters=["bond0"])
    pod = n.pod()
    add(s, conf, pod, "c1")
    out = add(s, conf, pod, "c1")
    assert addresses_by_bond(out) == {"bond0": ["198.51.100.3"]}
    assert s.held() == {"bond0": {"198.51.100.3": "c1"}}
    assert s.pod_links(pod) == ["bond0", "lo"]


def test_an_injected_error_at_every_add_step_rolls_back_every_bond_and_frees_the_addresses(
    node_ns: Node,
) -> None:
    from rdma_cni.plugins.ipvlan.tx import ADD_STEPS, PER_BOND_STEPS

    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=masters(2))
    before = n.snapshot()
    pod = n.pod()
    for point in [*ADD_STEPS[1:], *(f"{p}#2" for p in PER_BOND_STEPS)]:
        res = s.plugin("ADD", conf, pod, container_id="c1", extra={"RDMA_CNI_FAILPOINT": f"{point}:error"})
        assert res.code == 1 and "nothing left behind" in res.out["msg"], (point, res.stdout)
        assert s.pod_links(pod) == ["lo"] and s.state_files() == [], point
    assert n.snapshot() == before
    out = add(s, conf, pod, "c1")
    assert addresses_by_bond(out) == {"bond0": ["198.51.100.3"], "bond1": ["198.51.100.19"]}


def test_a_pod_address_is_never_another_nodes_gateway_or_the_bonds_own_secondary(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(1, gateway=False)
    n.ip("addr", "add", "198.51.100.3/28", "dev", "bond0")  # a secondary of the bond
    n.ip("route", "add", "default", "via", "198.51.100.4", "table", "50")
    conf = s.config(masters=["bond0"], exclude=["198.51.100.1"])  # the peer, known to nobody else
    out = add(s, conf, n.pod(), "c1")
    assert addresses_by_bond(out) == {"bond0": ["198.51.100.5"]}
    assert ipaddress.ip_address("198.51.100.5") in ipaddress.ip_network("198.51.100.0/28")


COLD = """
import json, sys
from rdma_cni.cli.ipvlan import SPEC
from rdma_cni.cni import dispatch
out, code = dispatch.run(json.loads(sys.argv[1]), sys.argv[2].encode(), SPEC)
print(json.dumps({"code": code, "out": out, "pyroute2": any(m.startswith("pyroute2") for m in sys.modules)}))
"""


@pytest.mark.in_process_only
def test_a_cold_add_and_del_with_ipv4_and_ipv6_load_no_pyroute2(node_ns: Node) -> None:
    """Every address, route and rule rdma-ipvlan sends is one rtcodec encodes: a cold ADD/DEL (the
    fallback when no agent answers) pays for no pyroute2 import (~250 ms)."""
    import json
    import os
    import sys

    from netns import REPO

    n = node_ns
    s = Shared(n)
    s.bonds(2, v6=True)
    pod = n.pod()
    conf = s.config(masters=masters(2))
    for command in ("ADD", "DEL"):
        env = {
            "CNI_COMMAND": command, **policy_env(),
            "CNI_CONTAINERID": "cold",
            "CNI_NETNS": pod.path,
            "CNI_IFNAME": "net1",
            "CNI_PATH": "/usr/lib/cni",
        }
        proc = subprocess.run(
            ["ip", "netns", "exec", n.name, sys.executable, "-c", COLD, json.dumps(env), json.dumps(conf)],
            capture_output=True, text=True, cwd="/", check=True,
            env={**os.environ, "PYTHONPATH": REPO, "RDMA_CNI_AGENT": "off"},
        )  # fmt: skip
        got = json.loads(proc.stdout)
        assert got["code"] == 0 and got["pyroute2"] is False, (command, got)
    assert s.held() == {}


def test_two_bonds_on_one_subnet_never_give_one_address_twice(node_ns: Node) -> None:
    """Bonds on one subnet share one segment: no pod address is another bond's own, and no two
    children (of any bond) get the same address."""
    n = node_ns
    s = Shared(n)
    n.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
    n.bond("bond1", "198.51.100.3/28")
    conf = s.config(masters=masters(2), exclude=["198.51.100.1"])
    outs = [add(s, conf, n.pod(), f"c{i}") for i in range(2)]
    assert [addresses_by_bond(o) for o in outs] == [
        {"bond0": ["198.51.100.4"], "bond1": ["198.51.100.5"]},
        {"bond0": ["198.51.100.6"], "bond1": ["198.51.100.7"]},
    ]


def test_concurrent_adds_each_get_addresses_of_their_own_and_concurrent_dels_free_them(node_ns: Node) -> None:
    from netns import finish

    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=masters(2))
    before = n.snapshot()
    pods = [n.pod() for _ in range(6)]
    procs = [s.start("ADD", conf, pod, container_id=f"cc{i}") for i, pod in enumerate(pods)]
    outs = [finish(p) for p in procs]
    assert all(o.code == 0 for o in outs), [o.stdout for o in outs if o.code]
    got = [addresses_by_bond(o.out) for o in outs]
    for bond in ("bond0", "bond1"):
        ips = [g[bond][0] for g in got]
        assert len(set(ips)) == 6, (bond, ips)
    assert {ip for per in s.held().values() for ip in per} == {g[b][0] for g in got for b in g}
    procs = [s.start("DEL", conf, pod, container_id=f"cc{i}") for i, pod in enumerate(pods)]
    assert all(finish(p).code == 0 for p in procs)
    assert s.held() == {} and n.snapshot() == before
