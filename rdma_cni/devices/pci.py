"""Where an RDMA device sits on PCI: its function's address and the PCIe root complex above it.

A DRA driver publishes both (``resource.kubernetes.io/pciBusID`` and ``pcieRoot``) so a claim can
ask for a NIC under the same root as its GPUs; the kernel shows both in sysfs::

    class/infiniband/mlx5_bond_0/device -> ../../../0000:17:00.0     the PCI function: its address
    bus/pci/devices/0000:17:00.0 -> ../../../devices/pci0000:00/0000:00:01.0/0000:17:00.0
                                                     ^ the root complex: pci<domain>:<bus>

A virtual device (Soft-RoCE) has no PCI function: both are None.

    address = address_of("/sys", "mlx5_bond_0")    # "0000:17:00.0"
    pcie_root("/sys", address)                     # "pci0000:00"
"""

from __future__ import annotations

import os
import re

from rdma_cni.rdma import sysfs

ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
ROOT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def address_of(sysfs_root: str, device: str) -> str | None:
    """The PCI function behind RDMA device ``device`` (``class/infiniband/<dev>/device``), if it is
    one; None for a virtual device or a name that is not a plain device name."""
    if not device or "/" in device or device in (".", ".."):
        return None
    name = sysfs.bus_device(sysfs.device_dir(sysfs_root, device))
    return name if name is not None and ADDRESS.fullmatch(name) else None


def pcie_root(sysfs_root: str, address: str | None) -> str | None:
    """``pci<domain>:<bus>`` of the root complex the function ``address`` hangs under: the first
    directory below ``devices/`` on the resolved path of ``bus/pci/devices/<address>`` (whatever
    root ports and switches lie between). None when the function or its root is not found."""
    if address is None or not ADDRESS.fullmatch(address):
        return None
    link = os.path.join(sysfs_root, "bus", "pci", "devices", address)
    if not os.path.exists(link):
        return None
    devices = os.path.realpath(os.path.join(sysfs_root, "devices"))
    below = os.path.relpath(os.path.realpath(link), devices).split(os.sep)
    return below[0] if len(below) > 1 and ROOT.fullmatch(below[0]) else None
