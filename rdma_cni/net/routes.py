"""Routes and policy rules that use a bond: snapshot, restore, and the pod's copy of them.

When the last IPv4 address leaves a link the kernel flushes every IPv4 route through it (and any
route whose preferred source was that address), in every table. The snapshot therefore keeps every
route that goes through the bond, or names one of its addresses as ``src``, as the kernel reported
it, so DEL can replay it exactly. Rules are not flushed by the kernel; they are recorded so that DEL
can put back any that went missing, and so CHECK and ``cni-tool state`` can show them.

In the pod: the subnet routes come with the addresses. One bond: the bond's non-default main-table
routes are copied. Several bonds, or one whose routes clash with routes already in the pod
(:mod:`rdma_cni.net.pod_routing`): each gets its own table (subnet + all its routes, default
included) and a ``from <ip>`` rule, so replies leave by the NIC that owns the source address.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from rdma_cni.net import rtnl
from rdma_cni.net.nlsock import RtnlSocket
from rdma_cni.net.rtnl import Record, attr

RT_TABLE_MAIN = 254
RT_TABLE_LOCAL = 255
RTPROT_KERNEL = 2
RTPROT_RA = 9
RTPROT_BOOT = 3
RTPROT_STATIC = 4
RT_SCOPE_LINK = 253
RTN_UNICAST = 1
FR_ACT_TO_TBL = 1


def _oifs(rec: Record) -> set[int]:
    oifs = {attr(rec, "RTA_OIF")}
    for hop in attr(rec, "RTA_MULTIPATH") or []:
        oifs.add(hop.get("oif"))
    return {o for o in oifs if o}


def _uses(rec: Record, index: int, ips: set[str]) -> bool:
    """Through the bond or from one of its addresses (a route ``_maybe_ours`` already let through)."""
    return index in _oifs(rec) or attr(rec, "RTA_PREFSRC") in ips


def _maybe_ours(table: int, proto: int) -> bool:
    """Not the local table, not a kernel- or RA-made route: those come back with the addresses."""
    return table != RT_TABLE_LOCAL and proto not in (RTPROT_KERNEL, RTPROT_RA)


def _not_local_or_kernel(table: int, proto: int) -> bool:
    return table != RT_TABLE_LOCAL and proto != RTPROT_KERNEL


def snapshot_routes_of(ipr: RtnlSocket, bonds: list[tuple[int, set[str]]]) -> list[list[Record]]:
    """Each bond's routes (by ifindex and its IPs), from one dump per family for all of them: an
    8-bond ADD read the node's routing table 16 times (~0.2 ms each) for what one pair of dumps says."""
    out: list[list[Record]] = [[] for _ in bonds]
    indexes = {index for index, _ in bonds}
    packed = {_packed(ip) for _, ips in bonds for ip in ips}
    for family in (socket.AF_INET, socket.AF_INET6):
        # The header says enough to skip most of a dump (local table, kernel routes) undecoded, and
        # the raw attributes the routes of other links (every bond's table would be decoded for each).
        for msg in ipr.route_dump(family, _maybe_ours, links=indexes, sources=packed):
            rec = rtnl.record("route", msg)
            for i, (index, ips) in enumerate(bonds):
                if _uses(rec, index, ips):
                    out[i].append(rec)
    return out


def snapshot_rules_of(ipr: RtnlSocket, bonds: list[tuple[str, set[str]]]) -> list[list[Record]]:
    """Each bond's rules (naming it or one of its IPs), from one dump per family for all of them."""
    # A rule naming a bond or one of its addresses carries those bytes: the others (the kernel's
    # default rules, other networks') are skipped without decoding.
    needles = [bond.encode() + b"\0" for bond, _ in bonds] + [_packed(ip) for _, ips in bonds for ip in ips]
    out: list[list[Record]] = [[] for _ in bonds]
    for family in (socket.AF_INET, socket.AF_INET6):
        for msg in ipr.rule_dump(family, lambda raw: any(n in raw for n in needles)):
            rec = rtnl.record("rule", msg)
            names = {attr(rec, "FRA_IIFNAME"), attr(rec, "FRA_OIFNAME")}
            for i, (bond, ips) in enumerate(bonds):
                if bond in names or attr(rec, "FRA_SRC") in ips or attr(rec, "FRA_DST") in ips:
                    out[i].append(rec)
    return out


def _packed(ip: str) -> bytes:
    return ipaddress.ip_address(ip).packed


def _reindex(rec: Record, old: int, new: int) -> Record:
    """The same route with the bond's old ifindex replaced (the bond may have been re-created)."""
    attrs = []
    for key, value in rec["attrs"]:
        if key == "RTA_OIF" and value == old:
            value = new
        elif key == "RTA_MULTIPATH":
            value = [dict(h, oif=new) if h.get("oif") == old else h for h in value]
        attrs.append([key, value])
    return dict(rec, attrs=attrs)


def restore_routes(ipr: RtnlSocket, routes: list[Record], old_index: int, new_index: int) -> list[str]:
    """Re-create missing routes; a route whose gateway needs another route is retried after it.

    Returns a description of each route that could not be restored (the caller decides whether
    that fails DEL).
    """
    pending = [_reindex(r, old_index, new_index) for r in routes]
    errors: list[str] = []
    while pending:
        failed = []
        errors = []
        for rec in pending:
            try:
                rtnl.create(ipr, "route", rec)
            except Exception as exc:  # noqa: BLE001 - collected and retried, then reported
                failed.append(rec)
                errors.append(f"{describe_route(rec)}: {exc}")
        if len(failed) == len(pending):
            break
        pending = failed
    return errors if pending else []


def restore_rules(ipr: RtnlSocket, rules: list[Record]) -> list[str]:
    errors = []
    for rec in rules:
        try:
            rtnl.create(ipr, "rule", rec)
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            errors.append(f"rule {rec.get('attrs')}: {exc}")
    return errors


def describe_route(rec: Record) -> str:
    dst = attr(rec, "RTA_DST") or ("default" if rec["dst_len"] == 0 else "?")
    via = attr(rec, "RTA_GATEWAY")
    text = f"{dst}/{rec['dst_len']}" if dst != "default" else dst
    return text + (f" via {via}" if via else "") + f" table {attr(rec, 'RTA_TABLE', rec['table'])}"


def route_key(rec: Record) -> tuple[Any, ...]:
    """Identity used by CHECK: family, table, destination, gateway, metric (an IPv6 route added
    without one is reported with the kernel's 1024)."""
    v6_default = 1024 if rec["family"] == socket.AF_INET6 else 0
    return (
        rec["family"],
        attr(rec, "RTA_TABLE", rec["table"]),
        attr(rec, "RTA_DST"),
        rec["dst_len"],
        attr(rec, "RTA_GATEWAY"),
        attr(rec, "RTA_PRIORITY") or v6_default,
    )


def live_routes(ipr: RtnlSocket, index: int) -> list[Record]:
    out = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for msg in ipr.route_dump(family, _not_local_or_kernel):
            rec = rtnl.record("route", msg)
            if index in _oifs(rec):
                out.append(rec)
    return out


def pod_routes(
    bond_routes: list[Record], bond_index: int, pod_index: int, subnets: list[tuple[int, str, int, str]],
    table: int | None,
) -> list[Record]:
    """The routes the pod interface gets. ``subnets``: (family, network, prefixlen, src ip) per address.

    ``table`` None: main table, the bond's non-default main-table routes only (the pod's default
    route belongs to its primary network). A number: that table gets the subnets and every route of
    the bond, default included.
    """
    out: list[Record] = []
    if table is not None:
        for family, net, plen, src in subnets:
            out.append(_route(family, table, net, plen, RT_SCOPE_LINK, pod_index, prefsrc=src))
    for rec in bond_routes:
        if attr(rec, "RTA_MULTIPATH") or attr(rec, "RTA_OIF") != bond_index:
            continue
        rec_table = attr(rec, "RTA_TABLE", rec["table"])
        if table is None and (rec_table != RT_TABLE_MAIN or rec["dst_len"] == 0):
            continue
        copy = _reindex(rec, bond_index, pod_index)
        new_table = RT_TABLE_MAIN if table is None else table
        copy["table"] = new_table if new_table < 256 else 252  # RT_TABLE_COMPAT; RTA_TABLE carries it
        copy["attrs"] = [a for a in copy["attrs"] if a[0] != "RTA_TABLE"] + [["RTA_TABLE", new_table]]
        out.append(copy)
    return out


def _route(
    family: int, table: int, dst: str, dst_len: int, scope: int, oif: int, prefsrc: str = ""
) -> Record:
    attrs: list[list[Any]] = [["RTA_TABLE", table], ["RTA_DST", dst], ["RTA_OIF", oif]]
    if prefsrc and family == socket.AF_INET:
        attrs.append(["RTA_PREFSRC", prefsrc])
    return {
        "family": family, "dst_len": dst_len, "src_len": 0, "tos": 0,
        "table": table if table < 256 else 252, "proto": RTPROT_BOOT,
        "scope": scope, "type": RTN_UNICAST, "flags": 0, "attrs": attrs,
    }


def static_route(dst: str, gateway: str, oif: int) -> Record:
    """``dst [via gateway] dev oif`` in the main table, proto static (an IPAM result's route)."""
    net = ipaddress.ip_network(dst, strict=False)
    family = socket.AF_INET6 if net.version == 6 else socket.AF_INET
    attrs: list[list[Any]] = [["RTA_TABLE", RT_TABLE_MAIN], ["RTA_OIF", oif]]
    if net.prefixlen:
        attrs.append(["RTA_DST", str(net.network_address)])
    if gateway:
        attrs.append(["RTA_GATEWAY", gateway])
    return {
        "family": family, "dst_len": net.prefixlen, "src_len": 0, "tos": 0, "table": RT_TABLE_MAIN,
        "proto": RTPROT_STATIC, "scope": 0, "type": RTN_UNICAST, "flags": 0, "attrs": attrs,
    }


def source_rule(family: int, ip: str, table: int, priority: int) -> Record:
    """``from <ip> lookup <table>``: replies from a bond's address leave by that bond."""
    plen = 32 if family == socket.AF_INET else 128
    return {
        "family": family, "dst_len": 0, "src_len": plen, "tos": 0,
        "table": table if table < 256 else 252, "action": FR_ACT_TO_TBL, "flags": 0,
        "attrs": [["FRA_TABLE", table], ["FRA_PRIORITY", priority], ["FRA_SRC", ip]],
    }
