"""Which netdevs are the device model's bonds, and the RDMA port each runs over: the first step of
discovery, shared by :func:`rdma_cni.devices.inventory.discover` (which then reads each bond's NUMA
node, PCI place and char devices) and by the CNI side that must name the same bonds the same way
(rdma-multus turning a pod's DRA devices into bonds, :mod:`rdma_cni.devices.dra_names`).

Kept apart from :mod:`~rdma_cni.devices.inventory` because a CNI call must not pay for it: the
inventory's imports (pools, health, netlink, records) cost ~80-110 ms of a cold interpreter
(``python -X importtime``), this module ~9 ms (the sysfs readers).

    bond_ports("/sys", None)        # [("bond0", RdmaPort(device="mlx5_bond_0", ...)), ...]
    bond_ports("/sys", ["bond1"])   # only the configured masters, as rdma-macvlan's ``masters``
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rdma_cni.devices.model import natural_key
from rdma_cni.rdma import sysfs

log = logging.getLogger("rdma_cni.devices")


def bond_ports(
    sysfs_root: str, masters: Sequence[str] | None, every: list[sysfs.RdmaPort] | None = None
) -> list[tuple[str, sysfs.RdmaPort]]:
    """``(bond netdev, its RDMA port)`` for each bond, one per RDMA device (a second port of the
    same device is not a second bond), in natural order of the RDMA device names.

    The bonds are ``masters`` when given (a plugin config's), else every netdev backing a RoCE port;
    a netdev with no RDMA device is left out. ``every``: :func:`rdma_cni.rdma.sysfs.list_ports`
    when the caller has just read it."""
    if every is None:
        every = sysfs.list_ports(sysfs_root)
    by_netdev = {p.netdev: p for p in reversed(every) if p.netdev}
    found: dict[str, tuple[str, sysfs.RdmaPort]] = {}
    for netdev in masters if masters is not None else sysfs.default_masters(sysfs_root, every):
        # One read of every port; port_for_netdev only for a bond found through its netdev's links.
        port = by_netdev.get(netdev) or sysfs.port_for_netdev(sysfs_root, netdev, every)
        if port is None:
            log.debug("%s has no RDMA device under %s", netdev, sysfs_root)
        elif port.device not in found:
            found[port.device] = (netdev, port)
    return [found[d] for d in sorted(found, key=natural_key)]
