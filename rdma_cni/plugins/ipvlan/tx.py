"""The ADD transaction of rdma-ipvlan, one bond at a time, and the teardown that undoes it.

The host bond is never changed: it keeps its addresses, routes and rules. Per bond:

    write-ahead record (the pod's addresses chosen: they are held from here)  ->  child link created
    in the pod netns (temp name)  ->  rename, MTU, addrgen off, arp_notify  ->  the pod's addresses
    ->  link up (the kernel's gratuitous ARP)  ->  the bond's table in the pod and its ``from`` rules
    ->  RDMA (the pod address's RoCE v2 GID, recorded)  ->  unsolicited NA for IPv6

:func:`teardown` needs only the record: the ``from`` rules and the pod's children go (one group
request), then the GID records; the caller removes the record last, which frees the addresses. So a
kill -9 anywhere leaves a record from which DEL or GC finishes the job, and no address is freed
before the pod's interfaces holding it are gone.

Failpoints (:mod:`rdma_cni.failpoints`): ``ADD_STEPS`` and ``DEL_STEPS`` in order.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from rdma_cni.attachments import AttachmentRecord, BondRecord
from rdma_cni.cni.errors import ConfigKeyError
from rdma_cni.failpoints import Failpoints
from rdma_cni.net import addresses, links, pod_routing, routes, rtnl
from rdma_cni.net.announce import announce_ipv6, arm_arp_notify
from rdma_cni.net.netns import Netns
from rdma_cni.net.nlsock import RtnlSocket
from rdma_cni.net.pod_links import delete_pod_links, delete_pod_rules, recorded_netns
from rdma_cni.net.rtnl import Record, attr, error_code

log = logging.getLogger("rdma_cni.ipvlan")

ADD_STEPS = (
    "locked",
    "write-ahead",
    "link-created",
    "link-configured",
    "addresses-added",
    "link-up",
    "routes-added",
    "rdma-checked",
    "announced",
    "committed",
)
PER_BOND_STEPS = ADD_STEPS[2:-1]
DEL_STEPS = ("del-locked", "del-pod-cleaned", "del-gids-removed")
KINDS = ("ipvlan", "macvlan")  # what a pod child of ours can be (the record's names say which are ours)
POD_TABLE_BASE = 100
POD_RULE_PRIORITY = 100


def temp_name() -> str:
    # os.urandom, not secrets.token_hex (the same bytes): secrets imports hmac and OpenSSL, ~7 ms of
    # a cold call's import CPU (python -X importtime) for 4 random bytes.
    return "ivtmp" + os.urandom(4).hex()


def no_ipvlan_error() -> ConfigKeyError:
    return ConfigKeyError(
        "link",
        "config key 'link' is \"ipvlan\", but this kernel has no IPVLAN support (module 'ipvlan' is "
        'not built in and cannot be loaded): `modprobe ipvlan` on a kernel that has it, or set "link": '
        '"macvlan" for this node (a macvlan child per pod, a MAC of its own)',
    )


@dataclass
class AddContext:
    """What each step of one ADD works on: both netlink sockets, the pod netns, the record, the failpoints."""

    host: RtnlSocket
    ns: Netns
    pod: RtnlSocket
    rec: AttachmentRecord
    fp: Failpoints
    link: str = "ipvlan"
    ipvlan_mode: str = "l2"
    rdma_step: Callable[[BondRecord], None] | None = None


def _create(ctx: AddContext, b: BondRecord) -> None:
    if ctx.link == "macvlan":
        links.create_macvlan(
            ctx.host, b.bond_index, ctx.ns.fd, b.temp_name, "bridge", group=ctx.rec.link_group
        )
        return
    try:
        links.create_ipvlan(
            ctx.host, b.bond_index, ctx.ns.fd, b.temp_name, ctx.ipvlan_mode, group=ctx.rec.link_group
        )
    except OSError as exc:
        if error_code(exc) == errno.EOPNOTSUPP:  # no rtnl_link_ops "ipvlan", even after request_module
            raise no_ipvlan_error() from exc
        raise


def add_bond(ctx: AddContext, b: BondRecord, step: list[str]) -> None:
    """Give the pod its child of one bond; ``step[0]`` always names where we are (for the error)."""
    step[0] = f"create {ctx.link}"
    _create(ctx, b)
    ctx.fp.hit("link-created")
    step[0] = "configure pod interface"
    # No kernel-made link-local: it would take a RoCE GID slot of the shared table for nothing.
    pod_link, armed = links.configure_link(
        ctx.pod, b.temp_name, b.pod_ifname, b.mtu, addrgen_off=True, arp_notify=True, arp_own_only=True
    )
    index = pod_link.index
    ctx.fp.hit("link-configured")
    step[0] = "add the pod's addresses"
    for a in b.addresses:
        rtnl.create(ctx.pod, "addr", dict(a, index=index))
    ctx.fp.hit("addresses-added")
    step[0] = "bring the pod interface up"
    try:  # the kernel's gratuitous ARP at link-up announces the IPv4 address
        if not armed:
            arm_arp_notify(ctx.ns, b.pod_ifname)
    except OSError as exc:  # a lost announcement only delays peers' caches; not worth failing the pod
        log.warning("arp_notify on %s: %s; peers learn the address as they ARP for it", b.pod_ifname, exc)
    links.set_up(ctx.pod, index)
    ctx.fp.hit("link-up")
    step[0] = "add routes"
    _pod_routing(ctx, b, index)
    ctx.fp.hit("routes-added")
    if ctx.rdma_step is not None:
        step[0] = "RDMA"
        ctx.rdma_step(b)
    ctx.fp.hit("rdma-checked")
    step[0] = "announce the addresses"
    b.mac = pod_link.mac
    ips = [addresses.ip_of(a) for a in b.addresses]
    try:
        announce_ipv6(ctx.ns, index, b.mac, ips)
    except OSError as exc:
        log.warning("announcing %s on %s failed: %s", ips, b.pod_ifname, exc)
    ctx.fp.hit("announced")


def plan_pod_routing(pod: RtnlSocket, rec: AttachmentRecord) -> None:
    """Write-ahead: each bond's table in the pod (one no route or rule there uses yet) and the
    ``from <pod address>`` rules that select it, so 8 children on 8 subnets never fight over the
    pod's main table (nor with eth0's routes); recorded before the pod is touched."""
    tables = pod_routing.free_tables(pod, len(rec.bonds), POD_TABLE_BASE)
    for i, (b, table) in enumerate(zip(rec.bonds, tables, strict=True)):
        b.pod_table = table
        b.pod_rules = [
            routes.source_rule(a["family"], addresses.ip_of(a), table, POD_RULE_PRIORITY + i)
            for a in b.addresses
        ]


def _subnets(b: BondRecord) -> list[tuple[int, str, int, str]]:
    return [
        (a["family"], addresses.network_of(a).split("/")[0], a["prefixlen"], addresses.ip_of(a))
        for a in b.addresses
    ]


def _from_pod(rec: Record, sources: dict[int, str]) -> Record:
    """A copy of the bond's route with the pod's address as ``src`` (the bond's is not the pod's)."""
    if attr(rec, "RTA_PREFSRC") is None:
        return rec
    src = sources.get(rec["family"])
    out = [a for a in rec["attrs"] if a[0] != "RTA_PREFSRC"]
    if src:
        out.append(["RTA_PREFSRC", src])
    return dict(rec, attrs=out)


def _pod_routing(ctx: AddContext, b: BondRecord, index: int) -> None:
    sources = {a["family"]: addresses.ip_of(a) for a in b.addresses}
    wanted = routes.pod_routes(b.routes, b.bond_index, index, _subnets(b), b.pod_table)
    b.pod_routes = pod_routing.distinct(_from_pod(r, sources) for r in wanted)
    pod_routing.install(ctx.pod, "route", b.pod_routes)
    b.pod_rules = pod_routing.install(ctx.pod, "rule", b.pod_rules)  # an identical rule there: not ours


Detach = Callable[[BondRecord], None]


def teardown(
    rec: AttachmentRecord, netns_path: str, fp: Failpoints | None = None, detach: Detach | None = None
) -> None:
    """Undo an attachment's pod side from its record alone (the host bond was never changed):
    the rules and the children (if the recorded netns is still there), then ``detach`` per bond."""
    ns = recorded_netns(rec, netns_path)
    try:
        if ns is not None:
            delete_pod_rules(rec, ns)
            delete_pod_links(rec, ns, kinds=KINDS)
    finally:
        if ns is not None:
            ns.close()
    if fp:
        fp.hit("del-pod-cleaned")
    for b in rec.bonds:
        if detach is not None:
            detach(b)
    if fp:
        fp.hit("del-gids-removed")


def pod_address(ip: str, plen: int) -> Record:
    """The record of one address a pod holds (its link index is set when it is added). The family
    as a plain int: the struct codec (:mod:`rdma_cni.net.rtcodec`) takes nothing else, and its
    pyroute2 fallback costs an import of ~250 ms on a cold start and ~0.15 ms per message."""
    rec = addresses.address_record(0, ip, plen)
    rec["family"] = int(rec["family"])
    return rec


def result_gateway(b: BondRecord, a: Record) -> str:
    """The gateway of a default route through the bond inside this address's subnet."""
    import ipaddress

    net = ipaddress.ip_network(addresses.network_of(a))
    for r in b.routes:
        gw = attr(r, "RTA_GATEWAY")
        if r["dst_len"] == 0 and gw and ipaddress.ip_address(gw) in net:
            return str(gw)
    return ""


def describe(b: BondRecord) -> str:
    return f"{b.bond} ({', '.join(addresses.cidr(a) for a in b.addresses)})"
