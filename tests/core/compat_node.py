"""The node of the record-compatibility tests: the topology the N-1 fixtures were recorded on.

:func:`build` makes it in a test node (two veth "bonds", IPv4 and IPv6 addresses, a route via
each bond's peer, a per-bond table and a source rule); :func:`strip` leaves it as an ADD of
rdma-macvlan leaves the host (the bonds' addresses moved to the pod, so their routes went with
them, and the rules the ADD took). A record written on it can then be given back by DEL, and the
node must come out exactly as :func:`build` made it.
"""

from __future__ import annotations

from typing import Any

from netns import Node

BONDS = ("bond0", "bond1")


def build(n: Node) -> dict[str, Any]:
    """The topology; returns the plugin config the fixtures' ADD used."""
    for i, bond in enumerate(BONDS):
        base = 16 * i
        cidrs = [f"198.51.100.{base + 2}/28 brd +", f"198.51.100.{base + 3}/28"]
        if i == 0:
            cidrs.append("2001:db8:100::2/64 nodad")
        n.bond(bond, *cidrs, peer=f"198.51.100.{base + 1}/28")
        n.ip("route", "add", f"203.0.113.{16 * i}/28", "via", f"198.51.100.{base + 1}")
        n.ip("route", "add", "default", "via", f"198.51.100.{base + 1}", "table", str(10 + i))
        n.ip("rule", "add", "from", f"198.51.100.{base + 2}", "lookup", str(10 + i), "pref", str(500 + i))
    return n.config(masters=list(BONDS), count=2, cniVersion="1.1.0")


def strip(n: Node) -> None:
    """The host as the ADD left it: no address on the bonds (their routes went with them), no rules."""
    for i, bond in enumerate(BONDS):
        n.ip("rule", "del", "pref", str(500 + i))
        n.ip("-4", "addr", "flush", "dev", bond)
        n.ip("-6", "addr", "flush", "dev", bond, "scope", "global")
