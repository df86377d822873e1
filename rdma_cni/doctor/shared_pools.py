"""Shared mode as an operator sees it: per bond of the node's rdma-ipvlan network, its subnet, how
many addresses are free, which pod holds which (and whether that pod's netns still exists).

``cni-tool state`` prints it (:func:`render`, :func:`as_json`); ``cni-tool doctor`` judges it
(:func:`findings`: a subnet narrower than /28, nearly full or full, addresses of dead pods, a wide
subnet without per-node ``ranges``). The numbers come from the same functions the plugin chooses
with (:mod:`rdma_cni.plugins.ipvlan.allocation`, :mod:`rdma_cni.plugins.ipvlan.pool`), so they agree.

    pools = observe(conf_dir="/etc/cni/net.d", netns="")   # None: no rdma-ipvlan network here
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from rdma_cni.cni.errors import CniError
from rdma_cni.doctor.findings import FAIL, OK, WARN, Finding
from rdma_cni.net import addresses, links, routes
from rdma_cni.net.netns import netlink_in, netns_inode, open_netns
from rdma_cni.plugins.ipvlan.allocation import bond_subnets, held_addresses, node_wide
from rdma_cni.plugins.ipvlan.config import parse_del_config
from rdma_cni.plugins.ipvlan.pool import free_count, parse_span
from rdma_cni.rdma import sysfs
from rdma_cni.state import NodeState

if TYPE_CHECKING:
    from rdma_cni.doctor.node import NodeSnapshot

NARROWEST = 28  # TKE: the node's RDMA subnets must be /28 or wider
# kubelet's default maxPods: a pool without 'ranges' that holds more addresses than one node can run
# pods is a subnet meant for several nodes, and nodes without ranges of their own hand out the same
# addresses (each node's rdma-ipvlan sees only its own records)
MAX_PODS_PER_NODE = 110
NEARLY_FULL = 0.1  # free addresses below this share of the pool
CHECK = "shared-pool"


@dataclass
class Holder:
    address: str
    container_id: str
    ifname: str
    pod: str  # namespace/name as the runtime named it ("" when it did not)
    alive: bool  # its netns is still the recorded one


@dataclass
class BondPool:
    bond: str
    subnet: str  # "" when the bond holds no IPv4 address
    prefixlen: int
    free: int
    size: int  # what the pool holds in all: free + held within it
    ranges: list[str]
    held: list[Holder] = field(default_factory=list)
    problem: str = ""  # the bond is missing, or holds no IPv4


@dataclass
class SharedPools:
    config: str  # where the rdma-ipvlan network config was found
    data_dir: str
    bonds: list[BondPool]


def find_config(conf_dir: str) -> tuple[str, dict[str, Any]] | None:
    """(path, plugin config) of the first rdma-ipvlan network in ``conf_dir`` or a directory below
    it (rdma-multus reads its delegates from ``rdma-multus.d``)."""
    below = sorted(os.path.join(conf_dir, d) for d in _listdir(conf_dir))
    dirs = [conf_dir, *(d for d in below if os.path.isdir(d))]
    for d in dirs:
        for name in sorted(_listdir(d)):
            path = os.path.join(d, name)
            if not name.endswith((".conf", ".conflist", ".json")) or not os.path.isfile(path):
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    raw = json.load(f)
            except (OSError, ValueError):
                continue
            plugins = raw.get("plugins") if isinstance(raw, dict) else None
            for plugin in plugins if isinstance(plugins, list) else [raw]:
                if isinstance(plugin, dict) and plugin.get("type") == "rdma-ipvlan":
                    return path, plugin
    return None


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def observe(conf_dir: str, netns: str = "", sysfs_root: str = "", data_dir: str = "") -> SharedPools | None:
    """What the node's bonds and the plugin's records say now; None without an rdma-ipvlan network."""
    found = find_config(conf_dir)
    if found is None:
        return None
    path, raw = found
    try:
        cfg, _ = parse_del_config(raw)  # what can be read of it: a bad key falls back to its default
    except CniError:
        return None
    state = NodeState(data_dir or cfg.data_dir)
    held = held_addresses(state)
    records = {rec.key: rec for rec in state.attachments()}
    alive = {key: netns_inode(rec.netns) == rec.netns_inode for key, rec in records.items()}
    root = sysfs_root or cfg.sysfs_root
    masters = list(
        dict.fromkeys(
            cfg.masters
            or [p.netdev for p in sysfs.list_ports(root) if p.netdev and p.link_layer == "Ethernet"]
        )
    )
    ranges = {b: [parse_span(t) for t in ([v] if isinstance(v, str) else v)] for b, v in cfg.ranges.items()}
    exclude = [parse_span(t) for t in cfg.exclude]
    ns = open_netns(netns) if netns else None
    sock = netlink_in(ns)
    out = []
    try:
        for name in masters:
            link = links.get_link(sock, name)
            spans = ranges.get(name, [])
            pool = BondPool(
                bond=name, subnet="", prefixlen=0, free=0, size=0, ranges=[s.describe() for s in spans]
            )
            out.append(pool)
            mine = held.get(name, {})
            pool.held = [
                Holder(str(ip), att.container_id, att.ifname, _pod(records.get(att)), alive.get(att, False))
                for ip, att in sorted(mine.items(), key=lambda kv: (kv[0].version, int(kv[0])))
            ]
            if link is None:
                pool.problem = "no such netdev on this node"
                continue
            addrs = addresses.snapshot(sock, link.index)
            ips = {addresses.ip_of(a) for a in addrs}
            subnets = bond_subnets(name, addrs, routes.snapshot_routes_of(sock, [(link.index, ips)])[0])
            if not subnets:
                pool.problem = "holds no IPv4 address"
                continue
            subnet, plen = subnets[0]
            pool.subnet, pool.prefixlen = str(subnet.network), plen
            taken = node_wide(held)
            pool.free = free_count(subnet, spans, exclude, taken)
            pool.size = pool.free + sum(1 for ip in taken if ip in subnet.network)
    finally:
        sock.close()
        if ns is not None:
            ns.close()
    return SharedPools(config=path, data_dir=state.data_dir, bonds=out)


def _pod(rec: Any) -> str:
    if rec is None or not rec.pod_name:
        return ""
    return f"{rec.pod_namespace}/{rec.pod_name}"


def render(pools: SharedPools) -> str:
    lines = [f"shared mode (rdma-ipvlan, {pools.config}; allocation in {pools.data_dir}):"]
    for b in pools.bonds:
        if b.problem:
            lines.append(f"  {b.bond}: {b.problem}; {len(b.held)} address(es) held")
        else:
            within = f" within {', '.join(b.ranges)}" if b.ranges else ""
            lines.append(f"  {b.bond} {b.subnet}{within}: {b.free} free, {len(b.held)} held")
        for h in b.held:
            who = f"{h.container_id[:12]} ({h.ifname})" + (f" pod {h.pod}" if h.pod else "")
            lines.append(f"    {h.address:<16} {who}" + ("" if h.alive else "  netns gone: DEL/GC frees it"))
    return "\n".join(lines) + "\n"


def as_json(pools: SharedPools) -> dict[str, Any]:
    return asdict(pools)


def findings(pools: SharedPools | None) -> list[Finding]:
    """Pure: the doctor's lines about each bond's pool."""
    if pools is None:
        return []
    out = []
    for b in pools.bonds:
        out.extend(_bond_findings(b))
    return out


def _bond_findings(b: BondPool) -> list[Finding]:
    out = []
    if b.problem:
        return [
            Finding(
                CHECK,
                FAIL,
                f"{b.bond}: {b.problem}: no shared-mode pod can start",
                "give the bond its address, or fix 'masters' of the rdma-ipvlan network",
            )
        ]
    if b.prefixlen > NARROWEST:
        out.append(
            Finding(
                CHECK,
                WARN,
                f"{b.bond}'s subnet {b.subnet} is narrower than /{NARROWEST}: at most {b.size} pods",
                f"widen it to /{NARROWEST} or wider (TKE's shared mode wants that)",
            )
        )
    if b.free == 0:
        out.append(
            Finding(
                CHECK,
                FAIL,
                f"{b.bond}'s pool ({b.subnet}) is full: {len(b.held)} held, the next ADD fails with 11",
                "widen the subnet or its 'ranges', or delete pods",
            )
        )
    elif b.size and b.free < max(2, NEARLY_FULL * b.size):
        out.append(
            Finding(
                CHECK,
                WARN,
                f"{b.bond}'s pool ({b.subnet}) is nearly full: {b.free} of {b.size} free",
                "widen the subnet or its 'ranges' before pods start failing with 11",
            )
        )
    dead = [h for h in b.held if not h.alive]
    if dead:
        listed = ", ".join(f"{h.address} ({h.container_id[:12]})" for h in dead)
        out.append(
            Finding(
                CHECK,
                WARN,
                f"{b.bond}: {len(dead)} address(es) held by pods whose netns is gone: {listed}",
                "the runtime's DEL or GC frees them (cni-tool gc); an ADD that finds "
                "the pool full frees them too",
            )
        )
    if not b.ranges and b.size > MAX_PODS_PER_NODE:
        out.append(
            Finding(
                CHECK,
                WARN,
                f"{b.bond}'s subnet {b.subnet} has room for {b.size} pods, more than one node runs "
                f"(kubelet's maxPods: {MAX_PODS_PER_NODE}), and no 'ranges'",
                "if other nodes share this subnet, give each node its own 'ranges' "
                "(else two nodes hand out the same address)",
            )
        )
    if not out:
        out.append(Finding(CHECK, OK, f"{b.bond} {b.subnet}: {b.free} free, {len(b.held)} held"))
    return out


def check_shared_pools(snap: NodeSnapshot) -> list[Finding]:
    """Doctor: the node's rdma-ipvlan pools (nothing when the node runs no shared-mode network)."""
    paths = snap.paths
    return findings(observe(paths.conf_dir, paths.netns, paths.sysfs_root))


def summary(pools: Sequence[BondPool]) -> dict[str, tuple[int, int]]:
    """bond -> (held, free): the metrics' view."""
    return {b.bond: (len(b.held), b.free) for b in pools}
