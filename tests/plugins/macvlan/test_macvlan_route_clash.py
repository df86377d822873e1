"""A pod netns that already routes what a bond brings: the other plugin's route stays, the bond's
routes go to the bond's own table behind ``from <bond address>`` rules, and the result lists only
routes that are really in the pod (``table`` in 1.1.0; before 1.1.0 only main-table routes).

The "other plugin" is an ``eth0`` veth end in the pod holding 203.0.113.129/25 and routes via
203.0.113.130, made before ADD, as a cluster network would leave it. Every test checks the pod's
``ip route show table all`` against the result, runs CHECK, and after DEL that the other plugin's
routes are untouched and the node is exactly as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any

import pytest
from netns import Node, Pod, finish

from tests.plugins.macvlan.test_macvlan_netns import add_bonds

pytestmark = pytest.mark.netns

VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
THEIR_GW = "203.0.113.130"


def other_plugin(n: Node, pod: Pod, *routes: str) -> list[dict[str, Any]]:
    """eth0 in the pod with ``routes`` (``"203.0.113.0/28 via 203.0.113.130"``); returns its routes."""
    n.pod_exec(pod, "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")  # no dummy here
    n.pod_exec(pod, "ip", "addr", "add", "203.0.113.129/25", "dev", "eth0")
    n.pod_exec(pod, "ip", "link", "set", "eth0p", "up")
    n.pod_exec(pod, "ip", "link", "set", "eth0", "up")
    for route in routes:
        n.pod_exec(pod, "ip", "route", "add", *route.split(), "dev", "eth0")
    return routes_of(n, pod, "eth0")


def all_routes(n: Node, pod: Pod) -> list[dict[str, Any]]:
    return [r for fam in ("-4", "-6") for r in n.pod_json(pod, fam, "route", "show", "table", "all")]


def routes_of(n: Node, pod: Pod, dev: str) -> list[dict[str, Any]]:
    return [r for r in all_routes(n, pod) if r.get("dev") == dev and r.get("table") != "local"]


def in_pod(route: dict[str, Any], live: list[dict[str, Any]]) -> bool:
    """A result route (``dst``, ``gw``, ``table`` absent = main) matches a route in the pod (no ``gw``:
    the spec's "a default gateway is assumed", so any)."""
    dst = "default" if route["dst"] in ("0.0.0.0/0", "::/0") else route["dst"]
    table = str(route.get("table", "main"))
    for r in live:
        if r["dst"] in (dst, dst.removesuffix("/32")) and r.get("table", "main") == table \
                and ("gw" not in route or r.get("gateway") == route["gw"]):
            return True
    return False


def assert_result_true(res: dict[str, Any], live: list[dict[str, Any]]) -> None:
    for route in res.get("routes", []):
        assert in_pod(route, live), f"the result lists {route}, which is not in the pod: {live}"


def route_get(n: Node, pod: Pod, dst: str, src: str = "") -> dict[str, Any]:
    args = ["route", "get", dst] + (["from", src] if src else [])
    (out,) = n.pod_json(pod, *args)
    return dict(out)


def rules_from(n: Node, pod: Pod) -> dict[str, str]:
    return {r["src"]: r["table"] for r in n.pod_json(pod, "rule") if r.get("src", "all") != "all"}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("count", [1, 4])
def test_a_prefix_the_pod_already_routes_stays_and_the_bonds_routes_get_their_own_table(
    node_ns: Node, count: int, version: str
) -> None:
    n = node_ns
    bonds = add_bonds(n, count)
    before = n.snapshot()
    pod = n.pod()
    theirs = other_plugin(n, pod, f"203.0.113.0/28 via {THEIR_GW}")  # bond0's prefix too
    conf = n.config(masters=[b for b, _, _ in bonds], count=count, cniVersion=version)
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr

    live = all_routes(n, pod)
    assert routes_of(n, pod, "eth0") == theirs, "the other plugin's route was changed"
    assert_result_true(res.out, live)
    rules = rules_from(n, pod)
    for i, (bond, ip, peer) in enumerate(bonds):
        table = str(100 + i)
        assert rules[ip] == table and rules[f"198.51.100.{16 * i + 3}"] == table, rules
        mine = {(r["dst"], r.get("gateway", "")) for r in routes_of(n, pod, bond) if r.get("table") == table}
        assert mine == {(f"198.51.100.{16 * i}/28", ""), (f"203.0.113.{16 * i}/28", peer), ("default", peer)}
        in_main = [r for r in routes_of(n, pod, bond) if "table" not in r]
        assert [r["protocol"] for r in in_main] == ["kernel"], in_main  # only the address's own subnet
        assert n.ping(pod, peer, bond)
    # Traffic from the bond's address takes the bond's path; everything else keeps the other plugin's.
    assert route_get(n, pod, "203.0.113.5", src=bonds[0][1])["dev"] == "bond0"
    assert route_get(n, pod, "203.0.113.5")["dev"] == "eth0"

    listed = {(r["dst"], r.get("gw"), r.get("table")) for r in res.out.get("routes", [])}
    if version == "1.1.0":
        assert ("203.0.113.0/28", "198.51.100.1", 100) in listed
        assert ("0.0.0.0/0", "198.51.100.1", 100) in listed
    else:
        assert listed == set(), "a route outside the main table listed without its table"

    if version >= "0.4.0":  # CHECK exists from 0.4.0
        check = n.plugin("CHECK", dict(conf, prevResult=res.out), pod)
        assert check.code == 0, check.stdout
    assert n.plugin("DEL", conf, pod).code == 0
    assert routes_of(n, pod, "eth0") == theirs, "DEL touched the other plugin's route"
    assert rules_from(n, pod) == {}
    assert n.snapshot() == before


@pytest.mark.both_modes  # also as shipped: the C client answered by an rdma-agent worker
def test_a_default_route_in_the_pod_sends_the_bonds_default_to_its_own_table(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)  # bond0's default route lives in the node's table 10
    before = n.snapshot()
    pod = n.pod()
    theirs = other_plugin(n, pod, f"default via {THEIR_GW}")
    conf = n.config(masters=["bond0"], cniVersion="1.1.0")
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert routes_of(n, pod, "eth0") == theirs
    assert_result_true(res.out, all_routes(n, pod))
    assert {"dst": "0.0.0.0/0", "gw": "198.51.100.1", "table": 100} in res.out["routes"]
    assert route_get(n, pod, "203.0.113.100", src="198.51.100.2")["dev"] == "bond0"
    assert route_get(n, pod, "203.0.113.100")["dev"] == "eth0"
    assert n.plugin("CHECK", dict(conf, prevResult=res.out), pod).code == 0
    assert n.plugin("DEL", conf, pod).code == 0
    assert routes_of(n, pod, "eth0") == theirs
    assert n.snapshot() == before


def test_without_a_clash_one_bonds_routes_stay_in_main(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    pod = n.pod()
    other_plugin(n, pod, f"203.0.113.64/28 via {THEIR_GW}")  # another prefix: no clash
    conf = n.config(masters=["bond0"], cniVersion="1.1.0")
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert res.out["routes"] == [{"dst": "203.0.113.0/28", "gw": "198.51.100.1", "priority": 50}]
    assert_result_true(res.out, all_routes(n, pod))
    assert rules_from(n, pod) == {}
    assert n.plugin("DEL", conf, pod).code == 0


def test_tables_another_plugin_uses_in_the_pod_are_skipped(node_ns: Node) -> None:
    n = node_ns
    bonds = add_bonds(n, 2)
    pod = n.pod()
    other_plugin(n, pod, f"default via {THEIR_GW} table 100", f"default via {THEIR_GW} table 102")
    n.pod_exec(pod, "ip", "rule", "add", "from", "203.0.113.129", "lookup", "101")
    conf = n.config(masters=[b for b, _, _ in bonds], count=2, cniVersion="1.1.0")
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    rules = rules_from(n, pod)
    assert (rules["198.51.100.2"], rules["198.51.100.18"]) == ("103", "104"), rules
    assert_result_true(res.out, all_routes(n, pod))
    assert n.plugin("CHECK", dict(conf, prevResult=res.out), pod).code == 0
    assert n.plugin("DEL", conf, pod).code == 0
    assert rules_from(n, pod) == {"203.0.113.129": "101"}
    assert [r["table"] for r in routes_of(n, pod, "eth0") if r.get("table") not in (None, "main")] == \
        ["100", "102"]


def _stopped(proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, finish(proc).stdout
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.02)
    raise AssertionError("the ADD never reached its failpoint")


def _add_with_a_route_slipped_in(n: Node, conf: dict[str, Any], pod: Pod, route: str) -> Any:
    """ADD held right before it adds routes; ``route`` is added in the pod meanwhile."""
    proc = n.start("ADD", conf, pod, extra={"RDMA_CNI_FAILPOINT": "link-up:stop"})
    try:
        _stopped(proc)
        n.pod_exec(pod, "ip", "route", "add", *route.split())
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    return finish(proc)


def test_the_same_route_already_there_counts_as_installed(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    pod = n.pod()
    conf = n.config(masters=["bond0"], cniVersion="1.1.0")
    res = _add_with_a_route_slipped_in(n, conf, pod, "203.0.113.0/28 via 198.51.100.1 dev bond0 metric 50")
    assert res.code == 0, res.stdout + res.stderr
    assert res.out["routes"] == [{"dst": "203.0.113.0/28", "gw": "198.51.100.1", "priority": 50}]
    assert_result_true(res.out, all_routes(n, pod))
    assert n.plugin("CHECK", dict(conf, prevResult=res.out), pod).code == 0
    assert n.plugin("DEL", conf, pod).code == 0
    assert n.snapshot() == before


def test_another_route_with_the_same_prefix_and_metric_appearing_mid_add_is_an_error_naming_both(
    node_ns: Node,
) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    pod = n.pod()
    theirs = other_plugin(n, pod)
    conf = n.config(masters=["bond0"], cniVersion="1.1.0")
    res = _add_with_a_route_slipped_in(n, conf, pod, f"203.0.113.0/28 via {THEIR_GW} dev eth0 metric 50")
    assert res.code == 1 and res.out["code"] == 100, res.stdout
    msg = res.out["msg"]
    assert "203.0.113.0/28 via 198.51.100.1 dev bond0 table main metric 50" in msg, msg
    assert f"203.0.113.0/28 via {THEIR_GW} dev eth0 table main metric 50" in msg, msg
    after = routes_of(n, pod, "eth0")
    assert after[: len(theirs)] == theirs or all(r in after for r in theirs), after
    assert any(r["dst"] == "203.0.113.0/28" and r["gateway"] == THEIR_GW for r in after), "theirs went"
    assert [link["ifname"] for link in n.pod_json(pod, "link")] == ["lo", "eth0p", "eth0"]
    assert n.snapshot() == before and n.state_files() == []


def test_an_ipam_route_the_pod_already_routes_is_an_add_error_naming_both(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    pod = n.pod()
    theirs = other_plugin(n, pod, f"203.0.113.0/28 via {THEIR_GW}")
    ipam = {"type": "host-local", "dataDir": os.path.join(n.tmp, "ipam"),
            "ranges": [[{"subnet": "198.51.100.0/28", "rangeStart": "198.51.100.10",
                         "rangeEnd": "198.51.100.12"}]],
            "routes": [{"dst": "203.0.113.0/28", "gw": "198.51.100.1"}]}
    conf = n.config(masters=["bond0"], ipam=ipam)
    res = n.plugin("ADD", conf, pod)
    assert res.code == 1 and res.out["code"] == 100, res.stdout
    assert "203.0.113.0/28 via 198.51.100.1 dev bond0 table main (from IPAM)" in res.out["msg"], res.out
    assert f"203.0.113.0/28 via {THEIR_GW} dev eth0 table main" in res.out["msg"], res.out
    assert routes_of(n, pod, "eth0") == theirs
    assert n.snapshot() == before and n.state_files() == []
    assert "198.51.100.10" not in os.listdir(os.path.join(n.tmp, "ipam", "rdma-net"))  # lease released


def test_check_notices_a_missing_source_rule(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    pod = n.pod()
    other_plugin(n, pod, f"default via {THEIR_GW}")
    conf = n.config(masters=["bond0"], cniVersion="1.1.0")
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    n.pod_exec(pod, "ip", "rule", "del", "from", "198.51.100.3", "lookup", "100")
    check = n.plugin("CHECK", dict(conf, prevResult=res.out), pod)
    assert check.out["code"] == 107 and "198.51.100.3" in check.out["msg"], check.stdout
    assert n.plugin("DEL", conf, pod).code == 0


def test_del_after_a_kill_9_right_after_the_rules_removes_them(node_ns: Node) -> None:
    n = node_ns
    add_bonds(n, 1)
    before = n.snapshot()
    pod = n.pod()
    theirs = other_plugin(n, pod, f"default via {THEIR_GW}")
    conf = n.config(masters=["bond0"])
    res = n.plugin("ADD", conf, pod, extra={"RDMA_CNI_FAILPOINT": "routes-added"})
    assert res.code == -signal.SIGKILL, res.stdout
    assert rules_from(n, pod) == {"198.51.100.2": "100", "198.51.100.3": "100"}
    assert n.plugin("DEL", conf, pod).code == 0
    assert rules_from(n, pod) == {}
    assert routes_of(n, pod, "eth0") == theirs
    assert n.snapshot() == before and n.state_files() == []


def test_an_ipv6_prefix_the_pod_already_routes_stays_and_the_bonds_gets_its_own_table(
    node_ns: Node,
) -> None:
    n = node_ns
    n.bond("bond0", "198.51.100.2/28", "2001:db8:1::2/64 nodad", peer="198.51.100.1/28")
    n.ip("route", "add", "2001:db8:2::/64", "via", "2001:db8:1::1", "dev", "bond0")
    before = n.snapshot()
    pod = n.pod()
    n.pod_exec(pod, "sysctl", "-qw", "net.ipv6.conf.default.dad_transmits=0")
    other_plugin(n, pod)
    n.pod_exec(pod, "ip", "addr", "add", "2001:db8:9::2/64", "dev", "eth0", "nodad")
    n.pod_exec(pod, "ip", "route", "add", "2001:db8:2::/64", "via", "2001:db8:9::1", "dev", "eth0")
    theirs = routes_of(n, pod, "eth0")
    conf = n.config(masters=["bond0"], cniVersion="1.1.0")
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert routes_of(n, pod, "eth0") == theirs
    assert_result_true(res.out, all_routes(n, pod))
    route6 = {"dst": "2001:db8:2::/64", "gw": "2001:db8:1::1", "table": 100, "priority": 1024}
    assert route6 in res.out["routes"], res.out
    assert rules_from(n, pod) == {"198.51.100.2": "100"}
    (rule6,) = [r for r in n.pod_json(pod, "-6", "rule") if r.get("src", "all") != "all"]
    assert (rule6["src"], rule6["table"]) == ("2001:db8:1::2", "100")
    assert route_get(n, pod, "2001:db8:2::5", src="2001:db8:1::2")["dev"] == "bond0"
    assert route_get(n, pod, "2001:db8:2::5")["dev"] == "eth0"
    assert n.plugin("CHECK", dict(conf, prevResult=res.out), pod).code == 0
    assert n.plugin("DEL", conf, pod).code == 0
    assert routes_of(n, pod, "eth0") == theirs
    assert [r for r in n.pod_json(pod, "-6", "rule") if r.get("src", "all") != "all"] == []
    assert n.snapshot() == before
