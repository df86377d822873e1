"""Pools: each one resource of its own, exclusive (one device per RDMA bond, today's model) or
shared (``count`` virtual devices that all stand for the same set of HCAs).

Pure decisions on what one scan read (:func:`rdma_cni.devices.inventory.scan_pools` reads
it): which HCAs and bonds each pool holds, and the snapshot each pool's ListAndWatch carries.

- A pool without selectors holds the bonds of ``masters`` (the CNI config's; without one, every
  netdev backing a RoCE port), as the one pool of today's plugin and TKE's ``mode: shared`` do.
- An exclusive pool with selectors holds those of the bonds whose HCA matches.
- An HCA of an exclusive pool in any other pool is a configuration error naming both
  (:func:`conflicts`): it would be handed out whole and shared at the same time.
- A member that vanishes from sysfs stays in its pool, Unhealthy, until it is back (the capacity
  kubelet counts does not shrink behind a running pod's back).

    specs = (PoolSpec("rdma/hca_shared_devices_a", SHARED, 200, Selectors(if_names=("ibs108",))),)
    shared = shared_members(specs[0], hcas, bonds, previous=None)   # the pool's HCAs
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rdma_cni.devices.hca import Hca
from rdma_cni.devices.model import DeviceHealth, Snapshot, natural_key
from rdma_cni.devices.selectors import Selectors

EXCLUSIVE, SHARED = "exclusive", "shared"
MODES = (EXCLUSIVE, SHARED)
DEFAULT_SHARED_COUNT = 1000


@dataclass(frozen=True)
class PoolSpec:
    """One pool as configured. ``origin`` says where (``pools[1]``, ``configList[0]``) for messages."""

    resource_name: str
    mode: str = EXCLUSIVE
    count: int = 0  # shared: how many virtual devices (pods) share it; exclusive: unused
    selectors: Selectors | None = None  # None: the bonds of masters
    origin: str = ""

    @property
    def shared(self) -> bool:
        return self.mode == SHARED

    def selection(self) -> str:
        return self.selectors.describe() if self.selectors is not None else "the RDMA bonds of masters"


@dataclass(frozen=True)
class SharedSnapshot:
    """A shared pool now: its HCAs (natural order) and each one's health, index for index."""

    count: int
    hcas: tuple[Hca, ...]
    health: tuple[DeviceHealth, ...]

    @property
    def healthy(self) -> bool:
        """Usable while any one of its HCAs is."""
        return any(h.healthy for h in self.health)

    def numa_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({h.numa for h in self.hcas if h.numa is not None}))

    def health_of(self, hca_id: str) -> DeviceHealth | None:
        return next((h for h in self.health if h.id == hca_id), None)


PoolSnapshot = Snapshot | SharedSnapshot


def virtual_ids(count: int) -> list[str]:
    """``"0"`` .. ``"count-1"``: the same on every start, and Mellanox's own IDs, so the allocations in
    kubelet's checkpoint stay valid when this plugin replaces k8s-rdma-shared-dev-plugin."""
    return [str(i) for i in range(count)]


def _selected(spec: PoolSpec, hca: Hca, bond_ids: set[str]) -> bool:
    return hca.id in bond_ids if spec.selectors is None else spec.selectors.matches(hca)


def shared_members(
    spec: PoolSpec, hcas: Sequence[Hca], bonds: Snapshot | None, previous: SharedSnapshot | None
) -> tuple[Hca, ...]:
    """The HCAs of shared pool ``spec``; a previous member gone from sysfs is kept (see module doc)."""
    bond_ids = {b.id for b in bonds.bonds} if bonds is not None else set()
    found = {h.id: h for h in hcas if _selected(spec, h, bond_ids)}
    present = {h.id for h in hcas}
    for old in previous.hcas if previous is not None else ():
        if old.id not in present:
            found[old.id] = old
    return tuple(sorted(found.values(), key=lambda h: natural_key(h.id)))


def exclusive_members(
    spec: PoolSpec, hcas: Sequence[Hca], bonds: Snapshot, previous: Snapshot | None
) -> Snapshot:
    """The part of today's bond snapshot that exclusive pool ``spec`` holds."""
    if spec.selectors is None:
        return bonds
    by_id = {h.id: h for h in hcas}
    before = {b.id for b in previous.bonds} if previous is not None else set()
    keep = {
        b.id
        for b in bonds.bonds
        if (b.id in by_id and spec.selectors.matches(by_id[b.id])) or (b.id not in by_id and b.id in before)
    }
    return Snapshot(
        bonds=tuple(b for b in bonds.bonds if b.id in keep),
        health=tuple(h for h in bonds.health if h.id in keep),
    )


def member_ids(snap: PoolSnapshot) -> tuple[str, ...]:
    return (
        tuple(h.id for h in snap.hcas)
        if isinstance(snap, SharedSnapshot)
        else tuple(b.id for b in snap.bonds)
    )


def conflicts(specs: Sequence[PoolSpec], members: dict[str, tuple[str, ...]]) -> list[tuple[str, str, str]]:
    """``(hca, exclusive pool, other pool)`` for every HCA of an exclusive pool that another pool
    holds too (``members``: resource -> its HCA IDs); each pair of pools named once per HCA."""
    seen: set[tuple[str, frozenset[str]]] = set()
    out = []
    for spec in (s for s in specs if not s.shared):
        mine = set(members.get(spec.resource_name, ()))
        for other in (o for o in specs if o is not spec):
            pair = frozenset((spec.resource_name, other.resource_name))
            for hca in sorted(mine & set(members.get(other.resource_name, ())), key=natural_key):
                if (hca, pair) not in seen:
                    seen.add((hca, pair))
                    out.append((hca, spec.resource_name, other.resource_name))
    return out
