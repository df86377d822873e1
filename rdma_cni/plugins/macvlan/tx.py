"""The ADD transaction of rdma-macvlan, one bond at a time, and the teardown that undoes it.

ADD per bond (DESIGN.md "rdma-macvlan: behaviour"; the order is what keeps the RoCE GID index):

    write-ahead record  ->  macvlan created in the pod netns (temp name)  ->  rename, MTU, addrgen off
    ->  addresses deleted from the bond  ->  added to the pod interface, primary first
    ->  arp_notify on  ->  link up (the kernel broadcasts a gratuitous ARP per IPv4)  ->  routes/rules
    ->  RDMA (GID check, record)  ->  unsolicited NA for moved IPv6 addresses

Where the routes go (the pod's main table or a table of the bond's own) is decided write-ahead
(:func:`plan_pod_routing`). Every step is undone by :func:`teardown`, which needs only the record: it
deletes the ``from`` rules ADD made and the pod interface first (if the recorded netns is still there
— checked by inode), then replays the bond's addresses, routes and rules — unless the bond was
re-addressed meanwhile (it holds a global address the record does not): then none of the record's
addresses, routes or rules go back. DEL, GC, a failed ADD and
a crashed ADD all end there.

Test-only failpoints: ``RDMA_CNI_FAILPOINT=<step>`` (or ``<step>#<n>`` for the n-th time the step is
reached, e.g. the second bond) makes the plugin SIGKILL itself right after that step; a ``:error``
suffix raises an I/O error there instead (to test rollback); ``:stop`` SIGSTOPs it there until the
test sends SIGCONT (to hold a call in flight and race others against it). Steps, in order:
``locked``, ``write-ahead``, ``ipam-added``, ``link-created``, ``link-configured``,
``addresses-removed``, ``addresses-added``, ``link-up``, ``routes-added``, ``rdma-checked``,
``announced``, ``committed``; on DEL/GC: ``del-locked``, ``del-pod-cleaned``, ``del-host-restored``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.attachments import AddressDrift, AttachmentRecord, BondRecord, bond_drift
from rdma_cni.cni.errors import NETLINK_FAILURE, CniError
from rdma_cni.failpoints import Failpoints as Failpoints  # moved there (shared): still tx.Failpoints
from rdma_cni.net import addresses, links, pod_routing, routes, rtnl
from rdma_cni.net.announce import announce_ipv6, arm_arp_notify
from rdma_cni.net.netns import Netns
from rdma_cni.net.nlsock import RtnlSocket
from rdma_cni.net.pod_links import (  # moved there: shared with rdma-ipvlan; the names stay here too
    LINK_GROUP_FIRST as LINK_GROUP_FIRST,
)
from rdma_cni.net.pod_links import (
    LINK_GROUP_SPAN as LINK_GROUP_SPAN,
)
from rdma_cni.net.pod_links import (
    delete_pod_links,
    delete_pod_rules,
    recorded_netns,
)
from rdma_cni.net.pod_links import (
    pick_link_group as pick_link_group,
)
from rdma_cni.net.rtnl import attr

log = logging.getLogger("rdma_cni.macvlan")

ADD_STEPS = (
    "locked", "write-ahead", "ipam-added", "link-created", "link-configured", "addresses-removed",
    "addresses-added", "link-up", "routes-added", "rdma-checked", "announced", "committed",
)
DEL_STEPS = ("del-locked", "del-pod-cleaned", "del-host-restored")
POD_TABLE_BASE = 100  # pod-side per-bond routing tables: the first free ones from 100 up
POD_RULE_PRIORITY = 100


def temp_name() -> str:
    # os.urandom, not secrets.token_hex (the same bytes): secrets imports hmac and OpenSSL, ~7 ms of
    # a cold call's import CPU (python -X importtime) for 4 random bytes.
    return "mvtmp" + os.urandom(4).hex()


def snapshot_bond(
    host: Any, bond: links.Link, pod_ifname: str, mtu: int, moves: bool,
    addrs: list[dict[str, Any]] | None = None,
) -> BondRecord:
    """What write-ahead records for one bond under the node lock; its routes and rules are left to
    :func:`snapshot_routing` (after the lock, for all the bonds at once).
    ``addrs``: the bond's address snapshot when it was just taken (under the same node lock)."""
    if addrs is None or not moves:
        addrs = addresses.snapshot(host, bond.index) if moves else []
    return BondRecord(
        bond=bond.name,
        bond_index=bond.index,
        pod_ifname=pod_ifname,
        temp_name=temp_name(),
        mtu=mtu,
        addresses=addrs,
        moves_addresses=moves,
    )


def snapshot_routing(host: Any, rec: AttachmentRecord) -> None:
    """Each moving bond's routes and rules (through it, or naming its addresses), as the kernel
    reports them: what DEL replays after the kernel flushed them with the addresses. One dump of
    each table for all the bonds."""
    moving = [b for b in rec.bonds if b.moves_addresses]
    for b in rec.bonds:
        b.routes, b.rules = [], []
    if not moving:
        return
    ips = [{addresses.ip_of(a) for a in b.addresses} for b in moving]
    found = routes.snapshot_routes_of(host, [(b.bond_index, i) for b, i in zip(moving, ips, strict=True)])
    rules = routes.snapshot_rules_of(host, [(b.bond, i) for b, i in zip(moving, ips, strict=True)])
    for b, r, u in zip(moving, found, rules, strict=True):
        b.routes, b.rules = r, u


@dataclass
class AddContext:
    """What each step of one ADD works on: both netlink sockets, the pod netns, the record, the failpoints."""

    host: Any
    ns: Netns
    pod: Any
    rec: AttachmentRecord
    fp: Failpoints
    save: Callable[[], None]
    mode: str = "bridge"
    mac: str = ""
    ipam_routes: list[tuple[str, str]] = field(default_factory=list)  # IPAM: (dst, gw) for bond 0
    extra_ips: dict[int, list[tuple[str, int]]] = field(default_factory=dict)  # IPAM: bond# -> (ip, plen)
    rdma_step: Callable[[BondRecord, int], None] | None = None  # (bond, its position)


def add_bond(ctx: AddContext, b: BondRecord, i: int, step: list[str]) -> None:
    """Plug one bond into the pod; ``step[0]`` always names where we are (for the error message)."""
    step[0] = "create macvlan"
    links.create_macvlan(ctx.host, b.bond_index, ctx.ns.fd, b.temp_name, ctx.mode, ctx.mac if i == 0 else "",
                         group=ctx.rec.link_group)
    ctx.fp.hit("link-created")
    step[0] = "configure pod interface"
    # No kernel-made link-local in the pod, also when IPv6 moves: it would take a RoCE GID slot (the
    # moved global IPv6 addresses are enough for neighbour discovery and the pod's traffic).
    pod_link, armed = links.configure_link(ctx.pod, b.temp_name, b.pod_ifname, b.mtu, addrgen_off=True,
                                           arp_notify=True)
    index = pod_link.index
    ctx.fp.hit("link-configured")
    step[0] = "remove addresses from the bond"
    addresses.remove(ctx.host, b.bond_index, b.addresses)
    ctx.fp.hit("addresses-removed")
    step[0] = "add addresses to the pod interface"
    addresses.add_to_pod(ctx.pod, index, b.addresses, b.bond, b.pod_ifname)
    for ip, plen in ctx.extra_ips.get(i, []):
        _add_plain_ip(ctx.pod, index, ip, plen)
    ctx.fp.hit("addresses-added")
    step[0] = "bring the pod interface up"
    try:  # the kernel's gratuitous ARP at link-up is the IPv4 announcement (armed by configure_link)
        if not armed:
            arm_arp_notify(ctx.ns, b.pod_ifname)
    except OSError as exc:  # a lost announcement only delays peers' caches; not worth failing the pod
        log.warning("arp_notify on %s: %s; peers learn the new MAC as caches expire", b.pod_ifname, exc)
    links.set_up(ctx.pod, index)
    ctx.fp.hit("link-up")
    step[0] = "add routes"
    _pod_routing(ctx, b, i, index)
    ctx.fp.hit("routes-added")
    if ctx.rdma_step is not None:
        step[0] = "RDMA"
        ctx.rdma_step(b, i)
    ctx.fp.hit("rdma-checked")
    step[0] = "announce the addresses"
    b.mac = pod_link.mac
    ips = [addresses.ip_of(a) for a in b.addresses] + [ip for ip, _ in ctx.extra_ips.get(i, [])]
    try:
        announce_ipv6(ctx.ns, index, b.mac, ips)  # IPv4 was announced by the kernel at link-up
    except OSError as exc:  # a lost announcement only delays peers' caches; not worth failing the pod
        log.warning("announcing %s on %s failed: %s", ips, b.pod_ifname, exc)
    ctx.fp.hit("announced")


def _add_plain_ip(pod: RtnlSocket, index: int, ip: str, plen: int) -> None:
    rtnl.create(pod, "addr", addresses.address_record(index, ip, plen))


def plan_pod_routing(pod: RtnlSocket, rec: AttachmentRecord) -> None:
    """Write-ahead: where each bond's routes go in the pod, and the rules that select them.

    Several bonds: each gets a table of its own. One bond: the pod's main table, unless a route it
    brings (its subnets, its main-table routes, its default route) names a prefix the main table
    already routes (another plugin's: :func:`pod_routing.main_clashes`); then it gets its own table
    too, so that route stays and traffic from the bond's address still leaves by the bond. The
    tables are ones nothing in the pod uses yet. Planned here, before the pod is touched, so the
    record names the rules a crash may leave for DEL to remove.
    """
    movers = [(i, b) for i, b in enumerate(rec.bonds) if b.moves_addresses]
    if len(rec.bonds) == 1 and movers:
        clashes = pod_routing.main_clashes(pod, _main_wanted(movers[0][1]))
        if not clashes:
            movers = []
        names = pod_routing.link_names(pod) if clashes else {}
        for ours, theirs in clashes:
            log.warning("%s: the bond's route %s would clash with %s already in the pod: the bond's "
                        "routes go to a table of their own", rec.bonds[0].bond, pod_routing.describe(ours),
                        pod_routing.describe(theirs, names))
    tables = pod_routing.free_tables(pod, len(movers), POD_TABLE_BASE)
    for (i, b), table in zip(movers, tables, strict=True):
        b.pod_table = table
        b.pod_rules = [routes.source_rule(a["family"], addresses.ip_of(a), table, POD_RULE_PRIORITY + i)
                       for a in b.addresses]


def _subnets(b: BondRecord) -> list[tuple[int, str, int, str]]:
    out = []
    for a in b.addresses:
        net = addresses.network_of(a)
        out.append((a["family"], net.split("/")[0], a["prefixlen"], addresses.ip_of(a)))
    return out


def _main_wanted(b: BondRecord) -> list[dict[str, Any]]:
    """What one bond would bring to the pod's main table: the subnet routes its addresses make,
    the routes copied from its main table, and its default routes through it (any table)."""
    main = routes.RT_TABLE_MAIN
    wanted = [pod_routing.subnet_route(f, main, net, plen, src) for f, net, plen, src in _subnets(b)]
    wanted += routes.pod_routes(b.routes, b.bond_index, 0, [], None)
    return wanted + [r for r in b.routes if r["dst_len"] == 0 and attr(r, "RTA_OIF") == b.bond_index]


def _pod_routing(ctx: AddContext, b: BondRecord, i: int, index: int) -> None:
    """Install what :func:`plan_pod_routing` decided; the record keeps exactly what is in the pod."""
    wanted = routes.pod_routes(b.routes, b.bond_index, index, _subnets(b), b.pod_table)
    b.pod_routes = pod_routing.distinct(wanted)
    pod_routing.install(ctx.pod, "route", b.pod_routes)
    b.pod_rules = pod_routing.install(ctx.pod, "rule", b.pod_rules)  # an identical rule there: not ours
    if i == 0 and ctx.ipam_routes:
        ipam = [routes.static_route(dst, gw, index) for dst, gw in ctx.ipam_routes]
        for ours, theirs in pod_routing.main_clashes(ctx.pod, ipam):
            # The IPAM result lists these routes for the main table, and the result is handed on
            # as the IPAM plugin made it: they cannot move to a table of their own.
            names = pod_routing.link_names(ctx.pod)
            raise pod_routing.RouteClash(pod_routing.describe(ours, names) + " (from IPAM)",
                                         pod_routing.describe(theirs, names))
        pod_routing.install(ctx.pod, "route", ipam)


def restore_host(host: Any, b: BondRecord) -> tuple[list[str], AddressDrift | None]:
    """Put the bond's addresses, then routes, then rules back; returns what could not be restored,
    and the drift when the bond was re-addressed meanwhile (then nothing of the record goes back:
    its present configuration is the truth, see :func:`rdma_cni.attachments.address_drift`)."""
    if not b.moves_addresses:
        return [], None
    bond = links.get_link(host, b.bond)
    if bond is None:
        log.error("bond %s no longer exists: its addresses %s cannot be restored", b.bond,
                  [addresses.cidr(a) for a in b.addresses])
        return [], None
    drift = bond_drift(b, [addresses.cidr(a) for a in addresses.snapshot(host, bond.index)])
    if drift.readdressed:
        log.warning("%s was re-addressed (holds %s, the record %s): not restoring the record's "
                    "addresses, %d route(s) and %d rule(s)", b.bond, ", ".join(drift.current),
                    ", ".join(drift.recorded) or "nothing", len(b.routes), len(b.rules))
        return [], drift
    problems = []
    try:
        addresses.restore(host, bond.index, b.addresses)
    except Exception as exc:  # noqa: BLE001 - reported with the bond's name
        problems.append(f"addresses of {b.bond}: {exc}")
    problems += routes.restore_routes(host, b.routes, b.bond_index, bond.index)
    problems += routes.restore_rules(host, b.rules)
    return problems, None


Detach = Callable[[BondRecord, "Netns | None"], None]


def teardown(
    rec: AttachmentRecord, host: Any, netns_path: str, fp: Failpoints | None = None,
    detach: Detach | None = None,
) -> list[tuple[BondRecord, AddressDrift]]:
    """Undo an attachment from its record alone: pod interfaces first, then the host's addresses.

    ``detach`` (the RDMA steps) runs per bond between the two, with the pod netns when it is still
    there: giving back an exclusive-mode device, waiting for the pod's GID to leave its slot.
    Returns the bonds whose restore was skipped because they were re-addressed meanwhile.
    """
    ns = recorded_netns(rec, netns_path)
    problems: list[str] = []
    skipped: list[tuple[BondRecord, AddressDrift]] = []
    try:
        if ns is not None:
            delete_pod_rules(rec, ns)
            delete_pod_links(rec, ns)
        if fp:
            fp.hit("del-pod-cleaned")
        for b in rec.bonds:
            if detach is not None:
                detach(b, ns)
            failed, drift = restore_host(host, b)
            problems += failed
            if drift is not None:
                skipped.append((b, drift))
            if fp:
                fp.hit("del-host-restored")
    finally:
        if ns is not None:
            ns.close()
    if problems:
        raise CniError(NETLINK_FAILURE, "could not restore the host: " + "; ".join(problems))
    return skipped


def result_gateway(b: BondRecord, a: dict[str, Any]) -> str:
    """The gateway of a default route through the bond that lies in this address's subnet."""
    import ipaddress

    net = ipaddress.ip_network(addresses.network_of(a))
    for r in b.routes:
        gw = attr(r, "RTA_GATEWAY")
        if r["dst_len"] == 0 and gw and ipaddress.ip_address(gw) in net:
            return str(gw)
    return ""
