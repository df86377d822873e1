"""Every RDMA device (HCA) of the node as a pool selector sees it: one read of sysfs.

A pool (:mod:`rdma_cni.devices.pools`) picks HCAs by what Mellanox's selectors name: the PCI
vendor and device IDs, the PCI driver, the PCI address, the port's link layer and the HCA's
netdevs. All of it is in sysfs, laid out as the kernel lays it out for a PCI function::

    class/infiniband/mlx5_2 -> ../../devices/pci0000:00/0000:1b:00.0/infiniband/mlx5_2
    class/infiniband/mlx5_2/device -> the PCI function: vendor (0x15b3), device (0x101b),
        numa_node, driver -> .../bus/pci/drivers/mlx5_core, net/<netdev>/{type,dev_port}
    class/infiniband/mlx5_2/ports/1/{link_layer,state}, gid_attrs/ndevs/0 (RoCE: the netdev)

The netdevs of an HCA are the one its RoCE GIDs are bound to (``gid_attrs/ndevs/0``: with RoCE
LAG that is the bond), the PCI function's own netdevs (``device/net/*``: the PFs, or the IPoIB
netdev of an InfiniBand port, ``type`` 32 = ARPHRD_INFINIBAND) and the bond each PF is a slave of.
A virtual device (Soft-RoCE) has no PCI parent: its PCI fields are None and only ``ifNames`` and
``linkTypes`` can select it.

    hcas = read_hcas("/sys")      # (Hca(id="mlx5_0", link_layer="InfiniBand", netdev="ibs108", ...), ...)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rdma_cni.devices.model import natural_key
from rdma_cni.devices.pci import address_of, pcie_root
from rdma_cni.rdma import sysfs

ARPHRD_INFINIBAND = 32
ETHERNET, INFINIBAND = "Ethernet", "InfiniBand"


@dataclass(frozen=True)
class Hca:
    """One RDMA device and what selectors and health read of it (its first port)."""

    id: str  # the RDMA device name: mlx5_0, mlx5_bond_3 (what NCCL_IB_HCA and UCX name)
    port: int
    link_layer: str  # "Ethernet" (RoCE), "InfiniBand", or "UNKNOWN"
    netdev: str | None  # RoCE: the netdev its GIDs are bound to (the bond); IB: the IPoIB netdev
    netdevs: tuple[str, ...]  # every netdev of the HCA (``ifNames`` matches any of them)
    pci: str | None  # "0000:1b:00.0"; None for a virtual device
    vendor: str | None  # "15b3" (lower-case, no 0x)
    device_id: str | None  # "101b"
    driver: str | None  # "mlx5_core"
    numa: int | None  # None when -1 or absent (TopologyInfo unset)
    uverbs: str | None  # "uverbs4"
    umad: tuple[str, ...] = ()
    issm: tuple[str, ...] = ()
    pcie_root: str | None = None  # "pci0000:00": the root complex above ``pci`` (:mod:`.pci`)

    @property
    def infiniband(self) -> bool:
        return self.link_layer == INFINIBAND


def read_text(path: str) -> str | None:
    """A sysfs attribute's text, stripped; None when it cannot be read (absent, or a device going away)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def pci_id(text: str | None) -> str | None:
    """``0x15B3`` / ``15b3`` -> ``15b3``: the form selectors compare."""
    if not text:
        return None
    text = text.strip().lower()
    return text[2:] if text.startswith("0x") else text


def _link_name(path: str) -> str | None:
    return os.path.basename(os.path.realpath(path)) if os.path.islink(path) else None


def _pci_netdevs(parent: str, port: int) -> list[tuple[str, int | None]]:
    """``(netdev, type)`` of the PCI function's netdevs for ``port`` (``dev_port`` = port - 1 when
    the function has several)."""
    base = os.path.join(parent, "net")
    try:
        names = sorted(os.listdir(base), key=natural_key)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for name in names:
        dev_port = read_text(os.path.join(base, name, "dev_port"))
        if len(names) > 1 and dev_port is not None and dev_port.isdigit() and int(dev_port) + 1 != port:
            continue
        kind = read_text(os.path.join(base, name, "type"))
        out.append((name, int(kind) if kind and kind.isdigit() else None))
    return out


def _master(sysfs_root: str, netdev: str) -> str | None:
    return _link_name(os.path.join(sysfs_root, "class", "net", netdev, "master"))


def _numa(parent: str) -> int | None:
    text = read_text(os.path.join(parent, "numa_node"))
    try:
        value = int(text) if text is not None else -1
    except ValueError:
        return None
    return value if value >= 0 else None


def mad_devices(sysfs_root: str) -> dict[tuple[str, int], tuple[tuple[str, ...], tuple[str, ...]]]:
    """``(device, port) -> (umad…, issm…)`` char device names from ``class/infiniband_mad`` (each
    entry has ``ibdev`` and ``port``, as the kernel's ib_umad lays them out); read once per scan."""
    base = os.path.join(sysfs_root, "class", "infiniband_mad")
    try:
        names = sorted(os.listdir(base), key=natural_key)
    except (FileNotFoundError, NotADirectoryError):
        return {}
    out: dict[tuple[str, int], tuple[list[str], list[str]]] = {}
    for name in names:
        kind = 0 if name.startswith("umad") else 1 if name.startswith("issm") else None
        ibdev = read_text(os.path.join(base, name, "ibdev")) if kind is not None else None
        port = read_text(os.path.join(base, name, "port"))
        if kind is None or not ibdev or not port or not port.isdigit():
            continue
        out.setdefault((ibdev, int(port)), ([], []))[kind].append(name)
    return {k: (tuple(u), tuple(i)) for k, (u, i) in out.items()}


def read_hca(
    sysfs_root: str,
    device: str,
    uverbs: dict[str, str],
    mads: dict[tuple[str, int], tuple[tuple[str, ...], tuple[str, ...]]],
) -> Hca | None:
    """One HCA (None when it has no port: a device half-registered or going away)."""
    ports = sysfs.port_numbers(sysfs_root, device)
    if not ports:
        return None
    port = ports[0]
    link_layer = read_text(os.path.join(sysfs.port_dir(sysfs_root, device, port), "link_layer")) or "UNKNOWN"
    parent = os.path.join(sysfs.device_dir(sysfs_root, device), "device")
    pci = address_of(sysfs_root, device)
    on_pci = pci is not None
    own = _pci_netdevs(parent, port) if os.path.isdir(parent) else []
    gid_ndev = read_text(os.path.join(sysfs.port_dir(sysfs_root, device, port), "gid_attrs", "ndevs", "0"))
    if link_layer == INFINIBAND:
        ipoib = [n for n, kind in own if kind == ARPHRD_INFINIBAND]
        netdev = ipoib[0] if ipoib else None
    else:
        netdev = gid_ndev or sysfs.port_netdev(sysfs_root, device, port)
    names: list[str] = [netdev] if netdev else []
    for name, _ in own:
        names.append(name)
        master = _master(sysfs_root, name)
        if master:
            names.append(master)
    umad, issm = mads.get((device, port), ((), ()))
    return Hca(
        id=device,
        port=port,
        link_layer=link_layer,
        netdev=netdev,
        netdevs=tuple(dict.fromkeys(names)),
        pci=pci,
        vendor=pci_id(read_text(os.path.join(parent, "vendor"))) if on_pci else None,
        device_id=pci_id(read_text(os.path.join(parent, "device"))) if on_pci else None,
        driver=_link_name(os.path.join(parent, "driver")) if on_pci else None,
        numa=_numa(parent) if os.path.isdir(parent) else None,
        uverbs=uverbs.get(device),
        umad=umad,
        issm=issm,
        pcie_root=pcie_root(sysfs_root, pci),
    )


def read_hcas(sysfs_root: str) -> tuple[Hca, ...]:
    """Every HCA under ``sysfs_root``, in natural order of the names."""
    uverbs = sysfs.uverbs_devices(sysfs_root)
    mads = mad_devices(sysfs_root)
    found = (read_hca(sysfs_root, d, uverbs, mads) for d in sysfs.list_devices(sysfs_root))
    return tuple(sorted((h for h in found if h is not None), key=lambda h: natural_key(h.id)))
