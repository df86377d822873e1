"""The device model's values: one RDMA bond, its health, and one scan of the node.

Kept apart from :mod:`rdma_cni.devices.inventory` (which reads the node) so the pure
decisions (:mod:`~rdma_cni.devices.health`, :mod:`~rdma_cni.devices.allocation`) and
the gRPC layer share them without importing the readers. ``inventory`` re-exports them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class RdmaBond:
    """One advertised device: an RDMA device over a bond netdev. ``id`` is the RDMA device name
    (``mlx5_bond_3``): stable, readable in PodResources, and what NCCL and UCX are told."""

    id: str
    netdev: str
    port: int
    numa: int | None  # device/numa_node when >= 0; None when -1 or absent (TopologyInfo unset)
    uverbs: str | None  # "uverbs3": the char device a pod opens (/dev/infiniband/uverbs3)
    umad: tuple[str, ...] = ()
    issm: tuple[str, ...] = ()
    pci: str | None = None  # "0000:17:00.0": the RDMA device's PCI function; None when virtual
    pcie_root: str | None = None  # "pci0000:00": the root complex above it (what DRA's pcieRoot names)


@dataclass(frozen=True)
class DeviceHealth:
    id: str
    healthy: bool
    reason: str  # "" when healthy; else every cause, "; "-separated


@dataclass(frozen=True)
class Snapshot:
    """One scan: the devices in natural order and their health, index for index."""

    bonds: tuple[RdmaBond, ...]
    health: tuple[DeviceHealth, ...]

    def bond(self, device_id: str) -> RdmaBond | None:
        return next((b for b in self.bonds if b.id == device_id), None)

    def health_of(self, device_id: str) -> DeviceHealth | None:
        return next((h for h in self.health if h.id == device_id), None)


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """``mlx5_bond_2`` before ``mlx5_bond_10`` (plain string order puts 10 first)."""
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in _DIGITS.split(name) if p)
