"""Netlink mechanisms on the real kernel, inside namespaces made here: the netns opener, address
ordering through remove/restore (secondaries, promote_secondaries, a crash half-way), route/rule
replay, and the gratuitous ARP reaching a peer."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from netns import Node, sh

from rdma_cni.net import addresses, links, routes, rtnl
from rdma_cni.net.announce import arm_arp_notify
from rdma_cni.net.netns import NetnsUnavailable, current_inode, netlink_in, open_netns

pytestmark = pytest.mark.netns


def test_open_netns_never_creates_a_missing_path(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "no-such-netns")
    with pytest.raises(NetnsUnavailable) as err:
        open_netns(path)
    assert err.value.gone and err.value.code == 4
    assert not os.path.exists(path)


def test_open_netns_refuses_a_file_that_is_not_a_netns(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "plain")
    with open(path, "w") as f:
        f.write("x")
    with pytest.raises(NetnsUnavailable, match="not a network namespace"):
        open_netns(path)
    with pytest.raises(NetnsUnavailable, match="not a network namespace"):
        open_netns("/proc/self/ns/uts")  # nsfs too, but a UTS namespace (NS_GET_NSTYPE tells)


def test_netlink_in_talks_to_the_netns_without_forking_and_returns_home(node_ns: Node) -> None:
    n = node_ns
    n.bond("bond0", "198.51.100.2/28")
    forks = []
    os.register_at_fork(before=lambda: forks.append(1))
    home = current_inode()
    with open_netns(f"/run/netns/{n.name}") as ns:
        assert ns.inode == os.stat(f"/run/netns/{n.name}").st_ino
        ipr = netlink_in(ns)
        try:
            assert sorted(link.name for link in links.all_links(ipr)) == ["bond0", "lo"]
        finally:
            ipr.close()
    assert current_inode() == home
    assert forks == []


def _ns_ipr(n: Node) -> tuple[object, int]:
    ns = open_netns(f"/run/netns/{n.name}")
    ipr = netlink_in(ns)
    ns.close()
    link = links.get_link(ipr, "bond0")
    assert link is not None
    return ipr, link.index


def _v4(n: Node) -> list[tuple[str, bool, str]]:
    link = n.node_json("addr", "show", "bond0")[0]
    return [(f"{a['local']}/{a['prefixlen']}", a.get("secondary", False), a.get("label", ""))
            for a in link["addr_info"] if a["family"] == "inet"]


@pytest.mark.parametrize("promote", ["0", "1"])
def test_remove_then_restore_keeps_order_and_secondaries(node_ns: Node, promote: str) -> None:
    n = node_ns
    n.bond("bond0", "198.51.100.2/28", "198.51.100.3/28", "203.0.113.9/24", "198.51.100.4/28 label bond0:x",
           "203.0.113.10/24")
    sh("ip", "netns", "exec", n.name, "sysctl", "-qw", f"net.ipv4.conf.bond0.promote_secondaries={promote}")
    before = _v4(n)
    assert [s for _, s, _ in before] == [False, False, True, True, True]
    ipr, index = _ns_ipr(n)
    snap = addresses.snapshot(ipr, index)
    assert [addresses.cidr(a) for a in snap] == [c for c, _, _ in before]
    addresses.remove(ipr, index, snap)
    assert _v4(n) == []
    assert addresses.restore(ipr, index, snap) == 5
    assert _v4(n) == before
    # A crash after removing only the last two: the remainder is a prefix, restore fills the rest.
    addresses.remove(ipr, index, snap[3:])
    assert addresses.restore(ipr, index, snap) == 2
    assert _v4(n) == before
    ipr.close()  # type: ignore[attr-defined]


def test_routes_and_rules_are_replayed_exactly_after_the_kernel_flushed_them(node_ns: Node) -> None:
    n = node_ns
    n.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
    n.ip("route", "add", "203.0.113.0/28", "via", "198.51.100.1", "metric", "50", "mtu", "1400")
    n.ip("route", "add", "203.0.113.16/28", "nexthop", "via", "198.51.100.1", "weight", "2",
         "nexthop", "via", "198.51.100.4", "weight", "1")
    n.ip("route", "add", "default", "via", "198.51.100.1", "table", "1000", "proto", "static")
    n.ip("rule", "add", "from", "198.51.100.2", "lookup", "1000", "pref", "900")
    n.snapshot()  # let the bond's IPv6 link-local settle first
    before = (n.node_json("route", "show", "table", "all"), n.node_json("rule"))
    ipr, index = _ns_ipr(n)
    snap = addresses.snapshot(ipr, index)
    [rts] = routes.snapshot_routes_of(ipr, [(index, {"198.51.100.2"})])
    [rules] = routes.snapshot_rules_of(ipr, [("bond0", {"198.51.100.2"})])
    assert len(rts) == 3 and len(rules) == 1
    addresses.remove(ipr, index, snap)
    assert not [r for r in n.node_json("route") if r.get("dev") == "bond0"]  # the kernel flushed them
    addresses.restore(ipr, index, snap)
    assert routes.restore_routes(ipr, rts, index, index) == []
    assert routes.restore_rules(ipr, rules) == []  # already there: not an error
    assert (n.node_json("route", "show", "table", "all"), n.node_json("rule")) == before
    ipr.close()  # type: ignore[attr-defined]


def test_kernel_gratuitous_arp_at_link_up_moves_the_peer_neighbour_to_the_new_mac(node_ns: Node) -> None:
    n = node_ns
    n.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
    sw_if = next(link["ifname"] for link in json.loads(sh("ip", "-n", n.switch, "-j", "link").stdout)
             if link["ifname"] != "lo")
    sh("ip", "netns", "exec", n.switch, "sysctl", "-qw", f"net.ipv4.neigh.{sw_if}.locktime=0")
    # The peer learns 198.51.100.2 at the bond's MAC ...
    sh("ip", "-n", n.switch, "neigh", "replace", "198.51.100.2", "lladdr",
       n.node_json("link", "show", "bond0")[0]["address"], "dev", sw_if, "nud", "stale")
    pod = n.pod()
    ns = open_netns(pod.path)
    ipr = netlink_in(ns)
    host, bond = _ns_ipr(n)
    links.create_macvlan(host, bond, ns.fd, "mvtest0", "bridge")
    link, armed = links.configure_link(ipr, "mvtest0", "net9", 1500, addrgen_off=True, arp_notify=True)
    index = link.index
    assert armed  # through IFLA_INET_CONF, in the rename's own request
    rtnl.create(ipr, "addr", addresses.address_record(index, "198.51.100.2", 28))
    pod_sysctl = sh("ip", "netns", "exec", pod.name, "sysctl", "-n", "net.ipv4.conf.net9.arp_notify")
    assert pod_sysctl.stdout.strip() == "1"
    # The sysctl path (the fallback for a kernel that refuses it by netlink) sets the same knob.
    links.create_macvlan(host, bond, ns.fd, "mvtest1", "bridge")
    other, armed_other = links.configure_link(ipr, "mvtest1", "net8", 1500, addrgen_off=True)
    assert not armed_other

    def net8_arp_notify() -> str:
        knob = "net.ipv4.conf.net8.arp_notify"
        return sh("ip", "netns", "exec", pod.name, "sysctl", "-n", knob).stdout.strip()

    assert other.name == "net8" and net8_arp_notify() == "0"
    arm_arp_notify(ns, "net8")
    assert net8_arp_notify() == "1"
    node_sysctl = sh("ip", "netns", "exec", n.name, "sysctl", "-n", "net.ipv4.conf.all.arp_notify")
    assert node_sysctl.stdout.strip() == "0"  # only the pod's interface, in the pod's netns
    mac = links.get_link(ipr, "net9").mac  # type: ignore[union-attr]
    links.set_up(ipr, index)  # the kernel's gratuitous ARP goes out now
    deadline = time.monotonic() + 3
    seen = ""
    while time.monotonic() < deadline:
        entries = json.loads(sh("ip", "-n", n.switch, "-j", "neigh", "show", "198.51.100.2").stdout)
        seen = entries[0].get("lladdr", "") if entries else ""
        if seen == mac:
            break
        time.sleep(0.1)
    assert seen == mac
    ns.close()
    ipr.close()
    host.close()  # type: ignore[attr-defined]


def test_the_plugin_path_imports_no_pyroute2_machinery_yet_the_full_package_still_works() -> None:
    """In a fresh interpreter: links and addresses read without pyroute2's IPRoute, asyncio or its
    package ``__init__`` (conntrack/ndb/ipdb); ``pyroute2.X`` still loads them on use."""
    import subprocess
    import sys

    code = """
import sys
from rdma_cni.net import addresses, links
from rdma_cni.net.netns import netlink_in
ipr = netlink_in(None)
lo = links.get_link(ipr, "lo")
assert lo is not None and lo.index == 1, lo
assert "127.0.0.1/8" in addresses.live_cidrs(ipr, lo.index)
ipr.close()
heavy = [m for m in ("asyncio", "pyroute2.iproute", "pyroute2.ndb", "pyroute2.ipdb", "pyroute2.conntrack")
         if m in sys.modules]
assert heavy == [], heavy
from pyroute2 import config  # a submodule through the bare package
import pyroute2
assert pyroute2.IPRoute is not None and "pyroute2.ndb" in sys.modules  # the real __init__ ran
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.stdout.strip() == "ok", proc.stderr


def test_kernel_refusals_carry_errno_and_the_kernels_own_reason(node_ns: Node) -> None:
    """The stdlib rtnetlink socket: errors are OSErrors with the errno (and ``.code``, like pyroute2's)
    plus the extended-ack text the kernel gave; absent links are None, not errors."""
    from rdma_cni.net.nlsock import NetlinkError

    n = node_ns
    n.bond("bond0", "198.51.100.2/28")
    ipr, index = _ns_ipr(n)
    try:
        assert links.get_link(ipr, "nosuchlink0") is None
        assert links.get_link(ipr, index=999999) is None
        pod = n.pod()
        with open_netns(pod.path) as ns:
            with pytest.raises(NetlinkError) as err:
                links.create_macvlan(ipr, 999999, ns.fd, "mvbad0", "bridge")  # no such parent
            assert err.value.code == err.value.errno and err.value.errno in (19, 22)
            links.create_macvlan(ipr, index, ns.fd, "mvok0", "bridge")
            with pytest.raises(NetlinkError) as err:
                links.create_macvlan(ipr, index, ns.fd, "mvok0", "bridge")  # exists in the pod netns
            assert err.value.errno == 17
            pod_ipr = netlink_in(ns)
            try:
                link = links.get_link(pod_ipr, "mvok0")
                assert link is not None and link.kind == "macvlan" and link.parent_index == index
                with pytest.raises(NetlinkError) as err:
                    pod_ipr.link_set(link.index, mtu=70000)  # above what the parent allows
                assert err.value.errno == 22
                assert str(err.value).count(":") >= 1 and "mtu" in str(err.value).lower(), str(err.value)
                assert links.delete_link(pod_ipr, "mvok0") and not links.delete_link(pod_ipr, "mvok0")
            finally:
                pod_ipr.close()
    finally:
        ipr.close()  # type: ignore[attr-defined]


def test_a_dump_read_while_the_table_changes_misses_nothing(node_ns: Node, tmp_path: str) -> None:
    """An address table spread over several dump datagrams, changed all the time by another process:
    every dump still holds every address that stayed (the kernel marks a dump that saw the table
    change; it is read again)."""
    import subprocess

    n = node_ns
    n.bond("bond0", "198.51.100.2/28")
    n.bond("bond1", "198.51.100.18/28")
    batch = os.path.join(tmp_path, "addrs")
    stable = {"198.51.100.2", "198.51.100.18"}
    with open(batch, "w") as f:
        for i in range(1, 255):
            f.write(f"address add 203.0.113.{i}/32 dev bond1\n")
            stable.add(f"203.0.113.{i}")
        for i in range(32, 255):
            f.write(f"address add 198.51.100.{i}/32 dev bond1\n")
            stable.add(f"198.51.100.{i}")
    n.ip("-batch", batch)
    churn = subprocess.Popen(
        ["ip", "netns", "exec", n.name, "sh", "-c",
         "while :; do ip addr add 198.51.100.3/28 dev bond0; ip addr del 198.51.100.3/28 dev bond0; done"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        with open_netns(f"/run/netns/{n.name}") as ns:
            ipr = netlink_in(ns)
            try:
                for _ in range(1000):  # until the kernel flagged a few dumps (9 of 50 here)
                    got = {rtnl.attr(m, "IFA_LOCAL") for m in ipr.addr_dump(socket.AF_INET)}
                    assert stable <= got, sorted(stable - got)[:5]
                    if ipr.dumps_repeated >= 3:
                        break
            finally:
                ipr.close()
            assert ipr.dumps_repeated >= 3  # the flagged dumps were read again, and were whole
    finally:
        os.killpg(churn.pid, 9)
        churn.wait()


def test_links_of_a_group_go_with_one_request_and_a_refusal_falls_back_to_one_by_one(node_ns: Node) -> None:
    """``delete_together`` on the real kernel: a group holding only ours goes with one request; when
    the kernel refuses the group request (here: ``lo``, which cannot be deleted, joined the group
    after the caller looked), ours are deleted one by one and the link that is not ours stays."""
    from rdma_cni.net.nlsock import NetlinkError

    n = node_ns
    n.bond("bond0", "198.51.100.2/28")
    host, bond = _ns_ipr(n)
    pod = n.pod()
    try:
        with open_netns(pod.path) as ns:
            for i in range(3):
                links.create_macvlan(host, bond, ns.fd, f"mv{i}", "bridge", group=70000)  # type: ignore[arg-type]
            links.create_macvlan(host, bond, ns.fd, "mvother", "bridge", group=70001)  # type: ignore[arg-type]
            ipr = netlink_in(ns)
            try:
                present = links.all_links(ipr)
                assert {link.name: link.group for link in present} == {
                    "lo": 0, "mv0": 70000, "mv1": 70000, "mv2": 70000, "mvother": 70001}
                ours = [link for link in present if link.name in ("mv0", "mv1")]
                done = links.delete_together(ipr, ours, 70000, present)  # mv2 is in it too: not ours
                assert not done.batched and "also holds mv2" in done.why
                assert sorted(link.name for link in links.all_links(ipr)) == ["lo", "mv2", "mvother"]
                sh("ip", "-n", pod.name, "link", "set", "lo", "group", "70001")
                with pytest.raises(NetlinkError) as err:
                    ipr.link_del_group(70001)
                assert err.value.code == 95  # EOPNOTSUPP: nothing of the group was deleted
                stale = [link for link in present if link.name in ("lo", "mvother")]
                done = links.delete_together(ipr, [stale[1]], 70001, [stale[0], stale[1]])
                assert not done.batched and "refused" in done.why, done
                left = {link.name: link.group for link in links.all_links(ipr)}
                assert left == {"lo": 70001, "mv2": 70000}
                mv2 = [link for link in links.all_links(ipr) if link.name == "mv2"]
                assert links.delete_together(ipr, mv2, 70000, mv2) == links.Deleted(batched=True)
                assert sorted(link.name for link in links.all_links(ipr)) == ["lo"]
                with pytest.raises(NetlinkError) as err:
                    ipr.link_del_group(70000)
                assert err.value.code == 19  # ENODEV: an empty group
            finally:
                ipr.close()
    finally:
        host.close()  # type: ignore[attr-defined]


def test_free_group_skips_taken_numbers_and_zero() -> None:
    assert links.free_group({5, 6}, 5) == 7
    assert links.free_group({links.GROUP_MAX}, links.GROUP_MAX) == 1
    assert links.free_group(set(), 0) == 1
