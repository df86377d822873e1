"""Every device each pool holds, one by one: what a front end that lists real devices (the DRA
driver) serves, from the same scan the device plugin serves its pools from.

The device plugin lists a pool as a whole (an exclusive pool's bonds; a shared pool's ``count``
virtual devices, all standing for its HCAs). A DRA ResourceSlice lists the devices themselves, each
saying which pool it is of. So one scan (:func:`rdma_cni.devices.inventory.scan_pools`, which has
already left an HCA of an exclusive pool out of every other pool, as the device plugin does) becomes,
pool by pool in the config's order:

- an exclusive pool: its bonds, each with the bond's own health (its address included);
- a shared pool: its HCAs, each with the HCA's health (no address asked for, as for the pool). An HCA
  that is the RDMA device of one of the node's bonds (``masters``) is that bond; any other one (an
  InfiniBand port, a RoCE port outside ``masters``) is carried in the same shape
  (:func:`hca_device`): the allocation answer reads only its name, port and char devices.

An HCA that two shared pools select is a member of both, once each, as the device plugin counts it
in both pools.

    for m in pool_members(cfg.pool_specs(), scan):
        print(m.pool.resource_name, m.device.id, m.bond, m.health.healthy)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rdma_cni.devices.hca import Hca
from rdma_cni.devices.inventory import NodeScan
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot
from rdma_cni.devices.pools import PoolSpec, SharedSnapshot

NEVER_CHECKED = "health never checked"  # the taint value the slices have always said


@dataclass(frozen=True)
class PoolMember:
    pool: PoolSpec
    device: RdmaBond  # a bond as discovered, or an HCA outside the bonds in the same shape
    health: DeviceHealth
    bond: bool  # one of the node's bonds: its netdev is the bond the CNI plugins move
    link_layer: str | None = None  # as the HCA read says it; None for an exclusive pool's bond


def hca_device(hca: Hca) -> RdmaBond:
    """``hca`` in the shape the allocation answer and the CDI spec take (its netdev: the IPoIB one,
    the netdev its RoCE GIDs are bound to, or "" without one)."""
    return RdmaBond(id=hca.id, netdev=hca.netdev or "", port=hca.port, numa=hca.numa, uverbs=hca.uverbs,
                    umad=hca.umad, issm=hca.issm, pci=hca.pci, pcie_root=hca.pcie_root)


def _health(health: DeviceHealth | None, device_id: str) -> DeviceHealth:
    return health if health is not None else DeviceHealth(device_id, False, NEVER_CHECKED)


def _exclusive(spec: PoolSpec, snap: Snapshot) -> list[PoolMember]:
    return [PoolMember(spec, b, _health(snap.health_of(b.id), b.id), True) for b in snap.bonds]


def _shared(spec: PoolSpec, snap: SharedSnapshot, bonds: Snapshot) -> list[PoolMember]:
    out = []
    for hca in snap.hcas:
        bond = bonds.bond(hca.id)
        device = bond if bond is not None else hca_device(hca)
        out.append(PoolMember(spec, device, _health(snap.health_of(hca.id), hca.id), bond is not None,
                              hca.link_layer))
    return out


def pool_members(specs: Sequence[PoolSpec], scan: NodeScan) -> tuple[PoolMember, ...]:
    """The members of every pool of ``specs`` in ``scan``, pool by pool (see the module doc)."""
    out: list[PoolMember] = []
    for spec in specs:
        snap = scan.pools.get(spec.resource_name)
        if isinstance(snap, SharedSnapshot):
            out += _shared(spec, snap, scan.bonds)
        elif isinstance(snap, Snapshot):
            out += _exclusive(spec, snap)
    return tuple(out)
