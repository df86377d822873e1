"""What each bond offers shared-mode pods (its subnets and what on them is reserved) and what the
attachments' records hold: read by the plugin under the node lock, and by ``cni-tool state`` and
doctor to show per bond the subnet, the free and the held addresses and who holds them.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict

from rdma_cni.cni.errors import TRY_AGAIN_LATER, CniError
from rdma_cni.cni.request import Attachment
from rdma_cni.net import addresses
from rdma_cni.net.rtnl import Record, attr
from rdma_cni.plugins.ipvlan.pool import IPAddress, Subnet
from rdma_cni.state import NodeState


def bond_subnets(bond: str, held: list[Record], bond_routes: list[Record]) -> list[tuple[Subnet, int]]:
    """The bond's IPv4 subnet (its first address's connected prefix) and, when it holds a global
    IPv6, that subnet too; each with what on it is never a pod's: the bond's own addresses and its
    routes' gateways."""
    own: set[IPAddress] = {ipaddress.ip_address(addresses.ip_of(a)) for a in held}
    gateways = {
        ipaddress.ip_address(str(attr(r, "RTA_GATEWAY"))) for r in bond_routes if attr(r, "RTA_GATEWAY")
    }
    out: list[tuple[Subnet, int]] = []
    for ipv6 in (False, True):
        first = next((a for a in held if addresses.is_ipv6(a) == ipv6), None)
        if first is None:
            continue
        net = ipaddress.ip_network(addresses.network_of(first))
        if ipv6 and (net.is_link_local or net.prefixlen >= 127):
            continue
        out.append((Subnet(bond, net, frozenset(own | gateways)), first["prefixlen"]))
    return out if out and out[0][0].network.version == 4 else []


def no_ipv4(bond: str) -> CniError:
    return CniError(
        TRY_AGAIN_LATER,
        f"{bond} holds no IPv4 address: its subnet is what shared-mode pods get their addresses from",
        "give the bond its address (the node's network config), or remove it from 'masters'",
    )


def held_addresses(state: NodeState) -> dict[str, dict[IPAddress, Attachment]]:
    """bond -> every address a recorded attachment holds on it -> that attachment."""
    out: dict[str, dict[IPAddress, Attachment]] = defaultdict(dict)
    for rec in state.attachments():
        for b in rec.bonds:
            for a in b.addresses:
                out[b.bond][ipaddress.ip_address(addresses.ip_of(a))] = rec.key
    return out


def node_wide(held: dict[str, dict[IPAddress, Attachment]]) -> dict[IPAddress, Attachment]:
    """Every address any bond's pods hold: an address is the node's once, whichever bond it is on
    (two bonds on one subnet share one segment; a choice checks against all of them)."""
    return {ip: att for per_bond in held.values() for ip, att in per_bond.items()}
