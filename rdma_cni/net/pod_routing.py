"""The bond's routes meeting the routes another plugin already put in the pod netns.

A pod netns is shared: the cluster network (``eth0``) has usually routed it before rdma-macvlan runs,
and its routes can name the same prefix as one of the bond's (a VPC prefix reachable both ways, a
default route). Two routes to one prefix in one table either collide (the kernel answers EEXIST when
table, prefix, TOS and metric are equal) or shadow each other by metric; either way one plugin's path
silently loses. So, before anything is installed, :func:`main_clashes` finds them, and the caller then
puts the bond's routes in a table of its own (:func:`free_tables`) selected by a ``from <bond
address>`` rule: traffic from the RDMA address keeps the bond's path, everything else keeps the other
plugin's, and neither route is replaced.

:func:`install` treats EEXIST as success only when the route already there is exactly the one asked
for (same gateway, device, table); anything else there is raised as :class:`RouteClash`, naming both.

    clashes = main_clashes(pod, wanted)          # [(ours, theirs), ...], nothing changed
    table, = free_tables(pod, 1)                 # a table no route or rule of the pod uses
    install(pod, "route", recs); install(pod, "rule", rules)
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from typing import Any

from rdma_cni.net import links, rtnl
from rdma_cni.net.nlsock import RtnlSocket
from rdma_cni.net.routes import (
    RT_SCOPE_LINK,
    RT_TABLE_LOCAL,
    RT_TABLE_MAIN,
    RTN_UNICAST,
    RTPROT_BOOT,
    RTPROT_KERNEL,
)
from rdma_cni.net.rtnl import Record, attr

log = logging.getLogger("rdma_cni.routes")

RT_TABLE_COMPAT = 252  # in a header: the real table (> 255) is in the RTA_TABLE / FRA_TABLE attribute
RT_TABLE_DEFAULT = 253
_NLMSGHDR_LEN = 16
_RESERVED_TABLES = frozenset({0, RT_TABLE_DEFAULT, RT_TABLE_MAIN, RT_TABLE_LOCAL})
_IP6_RT_PRIO_USER = 1024  # the metric the kernel gives an IPv6 route added without one


class RouteClash(Exception):
    """A route we want and a different route to the same prefix already in the same table."""

    def __init__(self, ours: str, theirs: str) -> None:
        super().__init__(f"route {ours} clashes with {theirs} already in the pod")
        self.ours = ours
        self.theirs = theirs


def table_of(rec: Record) -> int:
    return int(attr(rec, "RTA_TABLE", rec["table"]))


def prefix_of(rec: Record) -> tuple[Any, ...]:
    """What a lookup matches on: family, destination, prefix length, TOS."""
    return (rec["family"], attr(rec, "RTA_DST"), rec["dst_len"], rec.get("tos", 0))


def identity(rec: Record) -> tuple[Any, ...]:
    """What the kernel's EEXIST compares: the prefix, the table and the metric."""
    default = _IP6_RT_PRIO_USER if rec["family"] == socket.AF_INET6 else 0
    return (*prefix_of(rec), table_of(rec), attr(rec, "RTA_PRIORITY") or default)


def _path(rec: Record) -> tuple[Any, ...]:
    hops = attr(rec, "RTA_MULTIPATH") or []
    return (attr(rec, "RTA_GATEWAY"), attr(rec, "RTA_OIF"),
            tuple((h.get("oif"), h.get("gateway")) for h in hops))


def same_route(a: Record, b: Record) -> bool:
    """The same route as far as traffic is concerned: identity, gateway(s) and device(s)."""
    return identity(a) == identity(b) and _path(a) == _path(b)


def describe(rec: Record, names: dict[int, str] | None = None) -> str:
    """``203.0.113.0/24 via 203.0.113.1 dev eth0 table main``: what ``ip route`` would print."""
    dst = attr(rec, "RTA_DST")
    text = f"{dst}/{rec['dst_len']}" if dst else "default"
    if attr(rec, "RTA_GATEWAY"):
        text += f" via {attr(rec, 'RTA_GATEWAY')}"
    oif = attr(rec, "RTA_OIF")
    if oif:
        text += f" dev {(names or {}).get(oif, f'#{oif}')}"
    table = table_of(rec)
    text += " table " + ("main" if table == RT_TABLE_MAIN else str(table))
    metric = attr(rec, "RTA_PRIORITY")
    return text + (f" metric {metric}" if metric else "")


def link_names(ipr: RtnlSocket) -> dict[int, str]:
    return {link.index: link.name for link in links.all_links(ipr)}


def table_routes(ipr: RtnlSocket, family: int, table: int) -> list[Record]:
    header = table if table < 256 else RT_TABLE_COMPAT
    recs = [rtnl.record("route", m) for m in ipr.route_dump(family, lambda t, _p: t == header)]
    return [r for r in recs if table_of(r) == table]


def main_clashes(ipr: RtnlSocket, wanted: Iterable[Record]) -> list[tuple[Record, Record]]:
    """(ours, theirs) for each wanted route whose prefix the netns's main table already routes.

    Same prefix, any metric: with equal metrics the kernel refuses ours, with different ones the
    lower metric hides the other plugin's route or ours. Kernel-made routes count (another
    interface's subnet is as much someone's path as a static route).
    """
    wanted = list(wanted)
    existing: dict[int, list[Record]] = {}
    out = []
    for rec in wanted:
        fam = rec["family"]
        if fam not in existing:
            existing[fam] = table_routes(ipr, fam, RT_TABLE_MAIN)
        for theirs in existing[fam]:
            if prefix_of(theirs) == prefix_of(rec):
                out.append((rec, theirs))
                break
    return out


def free_tables(ipr: RtnlSocket, count: int, base: int) -> list[int]:
    """``count`` routing tables from ``base`` up that no route and no rule in the netns uses yet
    (another plugin's per-interface tables, e.g. the reference ``sbr`` plugin's, start at 100 too).

    The table is read from each message's header, undecoded; only a table above 255 (the header
    then says RT_TABLE_COMPAT) needs its attributes decoded.
    """
    used = set(_RESERVED_TABLES)

    def seen(table: int) -> bool:
        used.add(table)
        return table == RT_TABLE_COMPAT

    for family in (socket.AF_INET, socket.AF_INET6):
        used.update(table_of(rtnl.record("route", m)) for m in ipr.route_dump(family, lambda t, _p: seen(t)))
        for m in ipr.rule_dump(family, lambda raw: seen(raw[_NLMSGHDR_LEN + 4])):
            rec = rtnl.record("rule", m)
            used.add(int(attr(rec, "FRA_TABLE", rec["table"])))
    out: list[int] = []
    table = base
    while len(out) < count:
        if table not in used:
            out.append(table)
        table += 1
    return out


def subnet_route(family: int, table: int, net: str, plen: int, src: str) -> Record:
    """The route the kernel makes for an address (``proto kernel scope link``), as a record to
    compare with (``table`` main) or to install in a bond's table (``src`` = the address)."""
    attrs: list[list[Any]] = [["RTA_TABLE", table], ["RTA_DST", net]]
    if src and family == socket.AF_INET:
        attrs.append(["RTA_PREFSRC", src])
    return {
        "family": family, "dst_len": plen, "src_len": 0, "tos": 0, "table": table if table < 256 else 252,
        "proto": RTPROT_KERNEL if table == RT_TABLE_MAIN else RTPROT_BOOT, "scope": RT_SCOPE_LINK,
        "type": RTN_UNICAST, "flags": 0, "attrs": attrs,
    }


def distinct(recs: Iterable[Record]) -> list[Record]:
    """One route per kernel identity: a bond's route seen in two of its tables lands once in the
    pod's one table (the first wins; the kernel would refuse the second)."""
    seen: dict[tuple[Any, ...], Record] = {}
    for rec in recs:
        first = seen.setdefault(identity(rec), rec)
        if first is not rec and not same_route(first, rec):
            log.warning("the bond has two routes for %s; the pod's table gets only the first, %s",
                        describe(rec), describe(first))
    return list(seen.values())


def install(ipr: RtnlSocket, kind: str, recs: list[Record]) -> list[Record]:
    """Add routes or rules in the pod; returns those the kernel created (not already there).

    A route that needs another one first (its gateway is reached through it) is retried once the
    others are in. EEXIST for a route is accepted only when the route there is the same one
    (:func:`same_route`), else :class:`RouteClash`; for a rule the kernel already compared every
    field, so EEXIST means the identical rule. Any other refusal is raised (ADD rolls back).
    """
    pending = list(recs)
    created: list[Record] = []
    while pending:
        failed: list[Record] = []
        last: Exception | None = None
        for rec in pending:
            try:
                if rtnl.create(ipr, kind, rec):
                    created.append(rec)
                elif kind == "route":
                    _accept_existing(ipr, rec)
            except RouteClash:
                raise
            except Exception as exc:  # noqa: BLE001 - retried once the others are in, else raised
                failed.append(rec)
                last = exc
        if not failed:
            return created
        if len(failed) == len(pending):
            assert last is not None
            raise last
        pending = failed
    return created


def _accept_existing(ipr: RtnlSocket, rec: Record) -> None:
    for theirs in table_routes(ipr, rec["family"], table_of(rec)):
        if identity(theirs) == identity(rec):
            if _path(theirs) == _path(rec):
                return
            names = link_names(ipr)
            raise RouteClash(describe(rec, names), describe(theirs, names))
    # EEXIST without an equal route in the dump: the same prefix and metric exist in a form the
    # dump shows differently (e.g. a route type we did not ask for); never count that as ours.
    raise RouteClash(describe(rec, link_names(ipr)), "a route to the same prefix")


def remove_rules(ipr: RtnlSocket, rules: Iterable[Record]) -> None:
    """Delete the rules ADD created (gone already is fine: DEL may run twice)."""
    for rec in rules:
        rtnl.delete(ipr, "rule", rec)


def rule_key(rec: Record) -> tuple[Any, ...]:
    return (rec["family"], attr(rec, "FRA_SRC"), rec["src_len"], attr(rec, "FRA_TABLE", rec["table"]),
            attr(rec, "FRA_PRIORITY"))


def live_rule_keys(ipr: RtnlSocket, families: Iterable[int]) -> set[tuple[Any, ...]]:
    return {rule_key(rtnl.record("rule", m)) for fam in set(families) for m in ipr.rule_dump(fam)}
