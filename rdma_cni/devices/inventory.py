"""Which RDMA bonds this node has, where each sits (NUMA node, PCI address, PCIe root) and how each
is doing: one read of sysfs, the dev root, netlink of the current netns and rdma-macvlan's
attachment records.

Discovery follows rdma-macvlan exactly: the bonds are the ``masters`` of its config, or, without
it, every netdev backing a RoCE port (:func:`rdma_cni.rdma.sysfs.default_masters`); each
one's RDMA device comes from the same sysfs readers the CNI plugin uses. So a device kubelet hands
out is always a bond the CNI plugin can move into the pod.

A device stays listed when its bond or RDMA device vanishes, if the caller passes the previous
snapshot: it turns Unhealthy (kubelet keeps counting it and stops giving it out) instead of
silently shrinking the capacity, and becomes Healthy again when it is back.

    snap = scan(cfg)                      # Snapshot(bonds=(RdmaBond(...), ...), health=(...))
    snap = scan(cfg, previous=snap)       # each rescan
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rdma_cni.devices import hca as hca_inventory
from rdma_cni.devices import pools as pools_model
from rdma_cni.devices.bonds import bond_ports
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.errors import ConfigError
from rdma_cni.devices.hca import Hca, mad_devices, read_text
from rdma_cni.devices.health import (
    HcaObservation,
    Holder,
    Observation,
    address_lost,
    evaluate,
    evaluate_hca,
)
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot, natural_key
from rdma_cni.devices.pci import address_of, pcie_root
from rdma_cni.devices.pools import (
    PoolSnapshot,
    PoolSpec,
    SharedSnapshot,
    exclusive_members,
    member_ids,
    shared_members,
)
from rdma_cni.net.netns import netns_inode
from rdma_cni.net.nlsock import RtnlSocket, attributes
from rdma_cni.rdma import sysfs
from rdma_cni.state import ATTACHMENTS_DIR, NodeState

if TYPE_CHECKING:
    from rdma_cni.attachments import AttachmentRecord

__all__ = ["DeviceHealth", "RdmaBond", "Snapshot", "discover", "mad_devices", "observe", "scan"]

log = logging.getLogger("rdma_cni.deviceplugin")

IFF_UP = 0x1
RTM_GETADDR = 22
IFA_ADDRESS, IFA_LOCAL = 1, 2
IFA_F_DADFAILED = 0x08
RT_SCOPE_UNIVERSE = 0
_NLMSGHDR_SIZE = 16
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
IFF_LOWER_UP = 0x10000  # carrier: for a bond, at least one slave is up
GONE = "GONE"
ORPHAN_LOOKS = 3  # looks at a bond without an address or a holder before it is judged (observe)
SETTLED_S = 1.0  # a records directory unchanged this long is not being written (see _attachments)


# --- sysfs: the devices ------------------------------------------------------------------------------


def numa_of(sysfs_root: str, device: str) -> int | None:
    """``class/infiniband/<dev>/device/numa_node``: a node >= 0, else None (-1 on machines without
    NUMA information, absent for virtual devices such as Soft-RoCE)."""
    path = os.path.join(sysfs.device_dir(sysfs_root, device), "device", "numa_node")
    try:
        with open(path) as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def discover(cfg: PluginConfig, previous: Snapshot | None = None) -> tuple[RdmaBond, ...]:
    """The devices to advertise, in natural order of their IDs (see the module doc for ``previous``)."""
    found: dict[str, RdmaBond] = {}
    mads = mad_devices(cfg.sysfs_root)
    for netdev, port in bond_ports(cfg.sysfs_root, cfg.masters):
        umad, issm = mads.get((port.device, port.port), ((), ()))
        found[port.device] = RdmaBond(
            id=port.device,
            netdev=netdev,
            port=port.port,
            numa=numa_of(cfg.sysfs_root, port.device),
            uverbs=port.uverbs,
            umad=umad,
            issm=issm,
            pci=(address := address_of(cfg.sysfs_root, port.device)),
            pcie_root=pcie_root(cfg.sysfs_root, address),
        )
    claimed = {b.netdev for b in found.values()}
    for old in previous.bonds if previous is not None else ():
        if old.id not in found and old.netdev not in claimed and _still_wanted(cfg, old):
            found[old.id] = old  # vanished: kept, and Unhealthy until it is back
    return tuple(sorted(found.values(), key=lambda b: natural_key(b.id)))


def _still_wanted(cfg: PluginConfig, bond: RdmaBond) -> bool:
    return cfg.masters is None or bond.netdev in cfg.masters


# --- the live side: netlink, dev root, records ---------------------------------------------------------


Addresses = dict[int, list[str]]  # ifindex -> addresses


def _links_and_addresses(netdevs: Iterable[str]) -> tuple[dict[str, tuple[int, int]], Addresses, Addresses]:
    """``{name: (index, flags)}`` of those of ``netdevs`` that exist, then ``{index: [IPv4]}`` and
    ``{index: [global IPv6]}`` of every link, in the current netns.

    One GETLINK per bond rather than a dump: a node netns may hold hundreds of pod veths, and each
    link message is ~40 attributes to walk. Addresses are read from the raw dump (the header and
    two attributes): decoding each message with pyroute2 cost more than the rest of a scan."""
    links: dict[str, tuple[int, int]] = {}
    with RtnlSocket() as ipr:
        for name in dict.fromkeys(netdevs):
            info = ipr.link_get(name=name)
            if info is not None:
                links[name] = (info.index, info.flags)
        raw = ipr.dump(RTM_GETADDR, _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0))
    ipv4: Addresses = {}
    ipv6: Addresses = {}
    for msg in raw:
        found = _address_of(msg)
        if found is not None:
            family, index, ip = found
            (ipv4 if family == socket.AF_INET else ipv6).setdefault(index, []).append(ip)
    return links, ipv4, ipv6


def _address_of(msg: bytes) -> tuple[int, int, str] | None:
    """(family, ifindex, address) of an RTM_NEWADDR message: IPv4 (IFA_LOCAL is the address on a
    peer link), or IPv6 of global scope (a link-local belongs to the bond's MAC, not its network)."""
    family, _, flags, scope, index = _IFADDRMSG.unpack_from(msg, _NLMSGHDR_SIZE)
    size = {socket.AF_INET: 4, socket.AF_INET6: 16}.get(family)
    if size is None:
        return None
    if family == socket.AF_INET6 and (scope != RT_SCOPE_UNIVERSE or flags & IFA_F_DADFAILED):
        return None
    found: dict[int, bytes] = {}
    end = struct.unpack_from("=I", msg)[0]
    for kind, value in attributes(msg, _NLMSGHDR_SIZE + _IFADDRMSG.size, end):
        if kind in (IFA_ADDRESS, IFA_LOCAL) and len(value) == size:
            found[kind] = bytes(value)
    packed = found.get(IFA_LOCAL) or found.get(IFA_ADDRESS)
    return (family, index, socket.inet_ntop(family, packed)) if packed else None


def host_ipv4(netdevs: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """IPv4 addresses each of ``netdevs`` holds now in the current netns (absent link: left out)."""
    wanted = list(netdevs)
    links, ipv4, _ = _links_and_addresses(wanted)
    return {n: tuple(ipv4.get(links[n][0], ())) for n in wanted if n in links}


def is_char_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def dev_path(cfg: PluginConfig, name: str) -> str:
    """Host path of ``/dev/infiniband/<name>`` under the configured dev root."""
    return os.path.join(cfg.dev_root, "infiniband", name)


def _netns_alive(netns: str, inode: int) -> bool:
    if not netns:
        return False
    now = netns_inode(netns)
    return now is not None and (not inode or now == inode)


_records: dict[str, tuple[tuple[int, int], list[AttachmentRecord]]] = {}


def _attachments(data_dir: str) -> list[AttachmentRecord]:
    """rdma-macvlan's records, read again only when ``attachments/`` changed: every write there is
    a rename or an unlink, which moves the directory's mtime. A rescan runs twice a second, and a
    torn record would otherwise be parsed (and logged as unreadable) on every one of them. The
    kernel stamps mtimes from a coarse clock (a few ms), so two writes can share one: a directory
    changed within the last second is always read again."""
    try:
        st = os.stat(os.path.join(data_dir, ATTACHMENTS_DIR))
    except OSError:
        _records.pop(data_dir, None)
        return []
    stamp = (st.st_ino, st.st_mtime_ns)
    cached = _records.get(data_dir)
    if cached is not None and cached[0] == stamp and time.time() - st.st_mtime > SETTLED_S:
        return cached[1]
    recs = NodeState(data_dir).attachments()
    _records[data_dir] = (stamp, recs)
    return recs


def holders(data_dir: str) -> dict[str, tuple[Holder, ...]]:
    """bond netdev -> the attachments (rdma-macvlan's records) that hold its addresses; whether
    each one's netns is alive is checked every time (a pod can die without a record changing)."""
    out: dict[str, list[Holder]] = {}
    for rec in _attachments(data_dir):
        alive = _netns_alive(rec.netns, rec.netns_inode)
        for b in rec.bonds:
            out.setdefault(b.bond, []).append(Holder(rec.container_id, rec.netns, alive))
    return {k: tuple(v) for k, v in out.items()}


def observe(cfg: PluginConfig, bonds: Iterable[RdmaBond]) -> dict[str, Observation]:
    """One Observation per device, from one netlink dump and one read of the records after it;
    looked at again, up to ORPHAN_LOOKS in all, while a bond seems to have lost its address.

    The dump comes first and the records second, so an ADD (record written, then the addresses
    taken) is never missed. A DEL runs the other way (addresses given back, then the record
    removed): one that ends between the two reads leaves a bond with neither an address nor a
    holder in that look. It was reported Unhealthy for a scan (seen: kubelet counted 7 healthy of 8
    for 200 ms, and a pod asking for 4 of the 4 free was rejected at admission). A bond that really
    lost its address has lost it in every look; one a DEL gave back has it in the next."""
    bonds = list(bonds)
    present = set(sysfs.list_devices(cfg.sysfs_root))
    seen = _look(cfg, bonds, present)
    for _ in range(ORPHAN_LOOKS - 1):
        if not any(address_lost(o) for o in seen.values()):
            break
        seen = _look(cfg, bonds, present)
    return seen


def _look(cfg: PluginConfig, bonds: Sequence[RdmaBond], present: set[str]) -> dict[str, Observation]:
    links, ipv4, ipv6 = _links_and_addresses(b.netdev for b in bonds)
    held = holders(cfg.data_dir)
    out: dict[str, Observation] = {}
    for bond in bonds:
        link = links.get(bond.netdev)
        index, flags = link if link is not None else (0, 0)
        state = port_state(cfg.sysfs_root, bond.id, bond.port) if bond.id in present else GONE
        uverbs = dev_path(cfg, bond.uverbs) if bond.uverbs else ""
        out[bond.id] = Observation(
            port_state=state,
            link_present=link is not None,
            link_up=bool(flags & IFF_UP),
            carrier=bool(flags & IFF_LOWER_UP),
            ipv4=tuple(ipv4.get(index, ())) if link is not None else (),
            ipv6=tuple(ipv6.get(index, ())) if link is not None else (),
            uverbs_node=uverbs,
            uverbs_ok=bool(uverbs) and is_char_device(uverbs),
            holders=held.get(bond.netdev, ()),
        )
    return out


def port_state(sysfs_root: str, device: str, port: int) -> str:
    """``ports/<port>/state`` of ``device`` without its number ("4: ACTIVE" -> "ACTIVE"); "UNKNOWN"
    when it cannot be read."""
    text = read_text(os.path.join(sysfs.port_dir(sysfs_root, device, port), "state"))
    return text.split(":", 1)[-1].strip() if text else "UNKNOWN"


def scan(cfg: PluginConfig, previous: Snapshot | None = None) -> Snapshot:
    """The node now: devices (:func:`discover`) and the health of each."""
    bonds = discover(cfg, previous)
    seen = observe(cfg, bonds)
    return Snapshot(bonds=bonds, health=tuple(evaluate(b, seen[b.id]) for b in bonds))


def health_changes(before: Snapshot | None, after: Snapshot) -> Mapping[str, DeviceHealth]:
    """Devices whose health (or reason) differs from ``before``, for one log line per change."""
    old = {h.id: h for h in before.health} if before is not None else {}
    return {h.id: h for h in after.health if old.get(h.id) != h}


# --- pools -------------------------------------------------------------------------------------------


def observe_hcas(cfg: PluginConfig, hcas: Iterable[Hca]) -> dict[str, HcaObservation]:
    """One HcaObservation per HCA, from one netlink look at their netdevs."""
    hcas = list(hcas)
    links, _, _ = _links_and_addresses(h.netdev for h in hcas if h.netdev)
    present = set(sysfs.list_devices(cfg.sysfs_root))
    out: dict[str, HcaObservation] = {}
    for h in hcas:
        link = links.get(h.netdev) if h.netdev else None
        flags = link[1] if link is not None else 0
        uverbs = dev_path(cfg, h.uverbs) if h.uverbs else ""
        state = port_state(cfg.sysfs_root, h.id, h.port) if h.id in present else GONE
        out[h.id] = HcaObservation(
            port_state=state,
            netdev_present=link is not None,
            netdev_up=bool(flags & IFF_UP),
            carrier=bool(flags & IFF_LOWER_UP),
            uverbs_node=uverbs,
            uverbs_ok=bool(uverbs) and is_char_device(uverbs),
        )
    return out


@dataclass(frozen=True)
class NodeScan:
    """One scan for every pool: the node's bonds (today's snapshot), each pool's own snapshot, and
    every ``(hca, exclusive pool, other pool)`` that both select (:func:`pools.conflicts`)."""

    bonds: Snapshot
    pools: Mapping[str, PoolSnapshot]
    conflicts: tuple[tuple[str, str, str], ...] = ()


def scan_pools(cfg: PluginConfig, specs: Sequence[PoolSpec], previous: NodeScan | None = None) -> NodeScan:
    """The node now, per pool (:mod:`rdma_cni.devices.pools` decides who holds what). An HCA of
    an exclusive pool that another pool selects too is left out of the other one: the start refuses
    such a config (the daemon raises on ``conflicts``), a rescan logs each new one."""
    bonds = scan(cfg, previous.bonds if previous is not None else None)
    wanted = any(s.selectors is not None or s.shared for s in specs)
    hcas = hca_inventory.read_hcas(cfg.sysfs_root) if wanted else ()
    before = previous.pools if previous is not None else {}
    out: dict[str, PoolSnapshot] = {}
    for spec in specs:
        old = before.get(spec.resource_name)
        if spec.shared:
            kept = old if isinstance(old, SharedSnapshot) else None
            out[spec.resource_name] = SharedSnapshot(spec.count, shared_members(spec, hcas, bonds, kept), ())
        else:
            mine = old if isinstance(old, Snapshot) else None
            out[spec.resource_name] = exclusive_members(spec, hcas, bonds, mine)
    clashes = tuple(pools_model.conflicts(specs, {name: member_ids(snap) for name, snap in out.items()}))
    for clash in clashes:
        if previous is not None and clash not in previous.conflicts:
            log.error("%s matches exclusive pool %s and pool %s too: left out of %s", *clash, clash[2])
    taken = {h for s in specs if not s.shared for h in member_ids(out[s.resource_name])}
    shared = {h.id: h for snap in out.values() if isinstance(snap, SharedSnapshot) for h in snap.hcas}
    seen = observe_hcas(cfg, shared.values()) if shared else {}
    for spec in specs:
        snap = out[spec.resource_name]
        if isinstance(snap, SharedSnapshot):
            members = tuple(h for h in snap.hcas if h.id not in taken)
            health = tuple(evaluate_hca(h, seen[h.id]) for h in members)
            out[spec.resource_name] = SharedSnapshot(snap.count, members, health)
    return NodeScan(bonds=bonds, pools=out, conflicts=clashes)


def first_scan(cfg: PluginConfig) -> NodeScan:
    """The first scan of a front end (the device plugin, the DRA driver): both refuse the same configs
    at start, so a ConfigError when an HCA of an exclusive pool is in another pool too; each pool
    logged once, so the node's view is in the log whichever front end runs."""
    specs = cfg.pool_specs()
    scan = scan_pools(cfg, specs)
    if scan.conflicts:
        hca, mine, other = scan.conflicts[0]
        origin = {s.resource_name: s.origin for s in specs}
        raise ConfigError(
            f"{origin[other]}.selectors",
            hca,
            f"{hca} is in exclusive pool {mine} and in pool "
            f"{other}: an HCA of an exclusive pool must be in no other pool; narrow the selectors",
        )
    for spec in specs:
        _log_pool(spec, scan.pools[spec.resource_name])
    return scan


def _log_pool(spec: PoolSpec, snap: PoolSnapshot) -> None:
    if isinstance(snap, SharedSnapshot):
        healthy = sum(h.healthy for h in snap.health)
        line = ", ".join(
            f"{h.id}={'/'.join(h.netdevs) or '-'}/{h.link_layer}/numa{h.numa}" for h in snap.hcas
        )
        log.info(
            "%s: shared, %d devices over %d HCAs (%d healthy): %s",
            spec.resource_name,
            snap.count,
            len(snap.hcas),
            healthy,
            line or "none",
        )
        for h in snap.health:
            if not h.healthy:
                log.warning("%s: HCA %s Unhealthy (%s)", spec.resource_name, h.id, h.reason)
        if not snap.hcas:
            log.warning(
                "pool %s (%s) selects no HCA (%s): registered with 0 devices",
                spec.resource_name,
                spec.origin,
                spec.selection(),
            )
        return
    healthy = sum(1 for h in snap.health if h.healthy)
    log.info(
        "%s: %d devices (%d healthy): %s",
        spec.resource_name,
        len(snap.bonds),
        healthy,
        ", ".join(f"{b.id}={b.netdev}/numa{b.numa}" for b in snap.bonds) or "none",
    )
    if not snap.bonds and spec.selectors is not None:
        log.warning(
            "pool %s (%s) selects no RDMA bond (%s): registered with 0 devices",
            spec.resource_name,
            spec.origin,
            spec.selection(),
        )
