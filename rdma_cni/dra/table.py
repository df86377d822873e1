"""The DRA driver's devices: one table made from the device model's scan, which the slices, kubelet's
health stream and NodePrepareResources all read, so a device name means the same device everywhere.

Two forms, told by the config (:func:`table_for`):

- **no pools** (the default, and TKE's ``mode: shared``): one device per bond of ``masters``, with
  the bond's health, in the model's order (:func:`of_bonds`); ``mode: shared`` makes every one
  multi-allocatable with ``sharedCount`` shares. No ``pool`` attribute: there is one pool.
- **pools** (``pools:``, or Mellanox's ``config.json``, whose entries are shared pools): every member
  of every pool (:func:`rdma_cni.devices.members.pool_members`: an exclusive pool's bonds, a shared
  pool's HCAs, bond or not, RoCE or InfiniBand), pool by pool in the config's order
  (:func:`of_scan`). Each carries its pool's resource name; a shared pool's members are
  multi-allocatable with the pool's ``count`` (Mellanox's ``rdmaHcaMax``) as their shares. A shared
  pool of count 0 has no device, as the device plugin lists none for it.

Names are DNS labels, unique on the node (the driver's one DRA pool is the node):

- a bond: its netdev (``bond0``), the name the CNI side maps back to the bond
  (:mod:`rdma_cni.devices.dra_names`); the bonds are named first, in the model's order, so the
  suffix that tells two look-alike netdevs apart falls as it falls there;
- any other HCA: its RDMA device name (``mlx5_4`` -> ``mlx5-4``);
- a device that an earlier pool in the config already holds (an HCA two shared pools select; the
  device plugin counts it in both): that name, ``-`` and the pool's name (``mlx5-4-hca-shared-devices-b``);
- what still clashes: ``-2``, ``-3`` ... in the table's order.

A name changes only when the node does (a device appearing, or leaving a pool): a claim allocated
before then is refused at prepare, as the device plugin refuses an ID it no longer lists.

    table = table_for(cfg, scan)
    table.by_name["mlx5-4"].device.uverbs   # "uverbs4"
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rdma_cni.devices.config import DEFAULT_RESOURCE, PluginConfig
from rdma_cni.devices.inventory import NodeScan
from rdma_cni.devices.members import NEVER_CHECKED, PoolMember, pool_members
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot
from rdma_cni.devices.pools import EXCLUSIVE, SHARED, PoolSpec
from rdma_cni.dra import names


@dataclass(frozen=True)
class DraDevice:
    name: str  # the DRA device name (a DNS label, unique on the node)
    device: RdmaBond  # what the model hands out (an HCA outside the bonds in the same shape)
    health: DeviceHealth
    bond: bool  # one of the node's bonds: bond attributes (bond, gidIndex, ipv4Subnet) and naming
    pool: str | None = None  # its pool's resource name; None in the default form
    shares: int | None = None  # multi-allocatable with this many shares; None: one claim at a time
    link_layer: str | None = None  # as the HCA read says it (a bond's is read with its facts)
    # The extended resource a device plugin would count it under (its pool's, or the default form's
    # resourceName): a NAD's k8s.v1.cni.cncf.io/resourceName names it under DRA as under the plugin.
    resource_name: str = DEFAULT_RESOURCE


@dataclass(frozen=True)
class DeviceTable:
    devices: tuple[DraDevice, ...]

    @functools.cached_property
    def by_name(self) -> dict[str, DraDevice]:
        return {d.name: d for d in self.devices}

    def bonds(self) -> list[RdmaBond]:
        """The bonds among the devices, each once, in the table's order (whose facts are read)."""
        return list({d.device.id: d.device for d in self.devices if d.bond}.values())


def default_shares(cfg: PluginConfig) -> int | None:
    """The default form's shares: ``sharedCount`` in TKE's ``mode: shared``, else none."""
    return cfg.shared_count if cfg.mode == SHARED else None


def of_bonds(snap: Snapshot, shares: int | None, resource_name: str = DEFAULT_RESOURCE) -> DeviceTable:
    """The default form: one device per bond of ``snap`` (see the module doc), each counted under
    ``resource_name`` (the config's ``resourceName``)."""
    by_id = names.device_names([(b.id, b.netdev) for b in snap.bonds])
    health = {h.id: h for h in snap.health}
    return DeviceTable(tuple(
        DraDevice(by_id[b.id], b, health.get(b.id) or DeviceHealth(b.id, False, NEVER_CHECKED), True,
                  shares=shares, resource_name=resource_name)
        for b in snap.bonds))


def _pool_label(spec: PoolSpec) -> str:
    return spec.resource_name.rsplit("/", 1)[-1]


def member_names(members: Sequence[PoolMember], bonds: Sequence[RdmaBond]) -> list[str]:
    """The name of each of ``members`` (see the module doc); ``bonds``: the node's, in model order.
    Every bond of the node keeps its name reserved, in a pool or not, so a bond's name never depends
    on which pools hold it."""
    entries = [(f"bond:{b.id}", b.netdev) for b in bonds]
    node_bonds = {b.id for b in bonds}
    seen: set[str] = set()
    keys: list[str] = []
    for i, m in enumerate(members):
        key = f"bond:{m.device.id}"
        if not (m.bond and m.device.id in node_bonds and m.device.id not in seen):
            base = m.device.netdev if m.bond else m.device.id
            if m.device.id in seen:
                base = f"{base}-{_pool_label(m.pool)}"
            key = f"member:{i}"
            entries.append((key, base))
        seen.add(m.device.id)
        keys.append(key)
    named = names.device_names(entries)
    return [named[k] for k in keys]


def of_scan(specs: Sequence[PoolSpec], scan: NodeScan) -> DeviceTable:
    """The pools form: every member of every pool of ``specs`` (see the module doc)."""
    members = [m for m in pool_members(specs, scan) if not (m.pool.shared and m.pool.count == 0)]
    out = []
    for name, m in zip(member_names(members, scan.bonds.bonds), members, strict=True):
        out.append(DraDevice(name, m.device, m.health, m.bond, m.pool.resource_name,
                             m.pool.count if m.pool.shared else None, m.link_layer, m.pool.resource_name))
    return DeviceTable(tuple(out))


def scan_specs(cfg: PluginConfig) -> tuple[PoolSpec, ...]:
    """The pools a scan reads for ``cfg``: those listed, else one exclusive pool over the bonds of
    ``masters``, in TKE's ``mode: shared`` too (the devices are the bonds in both modes; shared mode
    only makes them multi-allocatable, :func:`default_shares`)."""
    if cfg.pools:
        return cfg.pool_specs()
    return (PoolSpec(cfg.resource_name, EXCLUSIVE, 0, None, "resourceName"),)


def table_for(cfg: PluginConfig, scan: NodeScan) -> DeviceTable:
    """The table of ``scan`` in the form ``cfg`` asks for (see the module doc)."""
    if cfg.pools:
        return of_scan(cfg.pool_specs(), scan)
    return of_bonds(scan.bonds, default_shares(cfg), cfg.resource_name)


def as_table(value: object, shares: int | None = None) -> DeviceTable | None:
    """What a board holds, as a table: a table as it is; a bond snapshot (the default form, as a
    device plugin board holds it) as :func:`of_bonds` makes it; anything else None."""
    if isinstance(value, DeviceTable):
        return value
    if isinstance(value, Snapshot):
        return of_bonds(value, shares)
    return None


class Source(Protocol):
    """Where the driver reads the node's current devices: a :class:`DeviceBoard`, or the device
    plugin's board of one bond snapshot."""

    def current(self) -> tuple[int, object]: ...
    def wait_newer(self, seen: int, timeout: float) -> tuple[int, object] | None: ...
    def poke(self) -> None: ...


class DeviceBoard:
    """The current table, written by the watch (:mod:`.watch`) and read by prepare, the publisher and
    every health stream; ``publish`` bumps the version only when the table differs."""

    def __init__(self, table: DeviceTable) -> None:
        self._cond = threading.Condition()
        self._table = table
        self._version = 0

    def current(self) -> tuple[int, DeviceTable]:
        with self._cond:
            return self._version, self._table

    def publish(self, table: DeviceTable) -> bool:
        """Make ``table`` current; True when it changed (and every waiting stream was woken)."""
        with self._cond:
            if table == self._table:
                return False
            self._table = table
            self._version += 1
            self._cond.notify_all()
            return True

    def wait_newer(self, seen: int, timeout: float) -> tuple[int, DeviceTable] | None:
        """The table after version ``seen``, or None when none came within ``timeout`` (or a poke)."""
        with self._cond:
            if self._version == seen:
                self._cond.wait(timeout)
            if self._version == seen:
                return None
            return self._version, self._table

    def poke(self) -> None:
        """Wake every waiting stream so it re-checks its client (a cancelled stream ends at once)."""
        with self._cond:
            self._cond.notify_all()
