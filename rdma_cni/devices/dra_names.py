"""The name each bond has as a DRA device, and the way back from that name to the bond.

The DRA driver (:mod:`rdma_cni.dra`) publishes one device per bond named after the bond netdev
(``bond0``; ``Bond_A`` -> ``bond-a``: a device name must be a DNS label); kubelet's PodResources
API and its DRA checkpoint later report a pod's devices by that name only. rdma-multus must turn
those names back into the bonds it hands to rdma-macvlan, without importing the DRA driver (policy
never imports policy sideways), so the naming lives here, in the device model both stand on.

    device_names([("mlx5_bond_0", "bond0"), ("mlx5_bond_1", "Bond_A")])
    # {"mlx5_bond_0": "bond0", "mlx5_bond_1": "bond-a"}
    node_bonds("/sys", None)["bond-a"]   # NamedBond(name="bond-a", device="mlx5_bond_1", netdev="Bond_A")
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

DRIVER = "rdma.tke.cloud.tencent.com"  # the DRA driver's name: what a claim's devices are reported under

_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


class NamedBond(NamedTuple):
    """One bond as a DRA device: its device ``name``, RDMA ``device`` (the device plugin's ID) and
    bond ``netdev``. A NamedTuple, not a frozen dataclass: this module is imported by every
    rdma-multus call, and making the class costs ~0.2 ms against ~1.4 ms (measured after multus's
    own imports)."""

    name: str
    device: str
    netdev: str


def device_name(bond_netdev: str) -> str:
    """The DRA device name of a bond: its netdev name as a DNS label (``bond0``; ``Bond_A`` ->
    ``bond-a``), at most 63 characters."""
    label = _NOT_LABEL.sub("-", bond_netdev.lower()).strip("-")[:63].strip("-")
    return label or "bond"


def device_names(netdevs: Sequence[tuple[str, str]]) -> dict[str, str]:
    """device ID -> DRA device name for ``(device ID, bond netdev)`` pairs in the model's order; two
    netdevs that give the same label (``bond_a``, ``bond-a``) are told apart by a suffix, the later
    one in the model's order taking it, so the mapping is the same on every scan of the same node."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for device_id, netdev in netdevs:
        name = base = device_name(netdev)
        n = 1
        while name in taken:
            n += 1
            name = f"{base[: 63 - len(str(n)) - 1]}-{n}"
        taken.add(name)
        out[device_id] = name
    return out


def node_bonds(sysfs_root: str, masters: Sequence[str] | None) -> dict[str, NamedBond]:
    """DRA device name -> bond, for the bonds of this node as the device model finds them
    (``masters`` as a plugin config gives them, else every RoCE bond), named as the driver names
    them. A bond that has vanished from sysfs is not here, though the driver keeps it (tainted) on
    its slice: a pod holding it cannot be given it."""
    # Here, not at the top: the sysfs readers cost ~9 ms of a cold interpreter (python -X
    # importtime), and rdma-multus imports this module on every call for DRIVER and the names.
    from rdma_cni.devices.bonds import bond_ports

    pairs = [(port.device, netdev) for netdev, port in bond_ports(sysfs_root, masters)]
    names = device_names(pairs)
    return {names[device]: NamedBond(names[device], device, netdev) for device, netdev in pairs}
