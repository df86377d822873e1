"""Build and edit a sysfs tree laid out like a real RDMA node's, for kernels without RDMA.

Mirrors the capture in ``shared/fixtures/sysfs-rxe-6.1`` (Soft-RoCE devices named ``mlx5_bond_N`` on
``bondN``)::

    class/infiniband/mlx5_bond_0 -> ../../devices/virtual/infiniband/mlx5_bond_0
    devices/virtual/infiniband/mlx5_bond_0/{node_guid,node_type,sys_image_guid,fw_ver}
    devices/virtual/infiniband/mlx5_bond_0/ports/1/{state,phys_state,link_layer,...}
    devices/virtual/infiniband/mlx5_bond_0/ports/1/gids/0..N-1          zeros when empty
    devices/virtual/infiniband/mlx5_bond_0/ports/1/gid_attrs/{types,ndevs}/<i>   only when non-empty
    class/infiniband_verbs/uverbs0 -> ../../devices/virtual/infiniband_verbs/uverbs0  (ibdev, dev)
    class/infiniband_mad/{umad0,issm0} -> ...  (ibdev, port, dev)           SimBond(mad=True)
    devices/virtual/infiniband/mlx5_bond_0/device -> ../../../pci0000:00/0000:17:00.0  (numa_node)
                                                                          SimBond(numa_node=N)
    class/misc/rdma_cm -> ../../devices/virtual/misc/rdma_cm  (dev)        build_tree(rdma_cm=True)
    class/net/bond0 -> ../../devices/virtual/net/bond0 (address, ifindex, mtu, bonding/...)
    module/ib_core/parameters/netns_mode                                 Y (shared) / N (exclusive)

An empty slot's ``types``/``ndevs`` fail with EINVAL on the kernel; a file tree cannot fail a read,
so those files are absent (ENOENT), which readers treat the same way. Every write is a rename, so a
concurrent reader sees the old or the new value, never a torn one.

Char device numbers are the kernel's: ib_uverbs has major 231 minors 192+N, ib_umad major 231 minors
N (umadN) and 64+N (issmN); ``rdma_cm`` (rdma_ucm) is a misc device, major 10 with a *dynamic* minor
— 58 here, what mlx5 nodes commonly show (it depends on module load order). :mod:`rdma_cni.sim.devnodes`
makes the nodes under a dev root from these ``dev`` files, as udev does.

Usage::

    root = build_tree("/tmp/h3-sys", [SimBond("bond0", "mlx5_bond_0", mac="66:77:54:36:56:69")])
    write_slot(root, "mlx5_bond_0", 1, 1, gid_for_ip("198.51.100.2"), "bond0")
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

from rdma_cni.rdma.sysfs import ROCE_V2, ZERO_GID

RXE_GID_SLOTS = 1024
IB_MAJOR = 231  # ib_uverbs and ib_umad share it (include/rdma/ib_user_*.h, IB_UVERBS_BASE_MINOR 192)
UVERBS_BASE_MINOR = 192
ISSM_BASE_MINOR = 64
MISC_MAJOR = 10
RDMA_CM_MINOR = 58  # MISC_DYNAMIC_MINOR: assigned at load; 58 is a typical value on mlx5 nodes
ZERO_TEXT = ":".join(["0000"] * 8)


@dataclass(frozen=True)
class SimBond:
    """A bond netdev and the RDMA device that runs over it."""

    name: str
    device: str
    mac: str = ""  # "" -> derived from the name
    ifindex: int = 0
    mtu: int = 1500
    uverbs: int | None = None  # N of uverbsN; None -> the bond's position
    numa_node: int | None = None  # device/numa_node (-1: no NUMA info); None: no PCI parent (rxe-like)
    mad: bool = False  # umadN/issmN in class/infiniband_mad, N as for uverbs


def _mac_for(name: str) -> str:
    h = sum((i + 1) * ord(c) for i, c in enumerate(name)) & 0xFFFFFF
    return f"02:00:00:{h >> 16:02x}:{(h >> 8) & 0xFF:02x}:{h & 0xFF:02x}"


def eui64(mac: str) -> bytes:
    """The 8-byte interface ID a MAC gives (U/L bit flipped): rxe's node GUID and default GID."""
    b = bytes(int(x, 16) for x in mac.split(":"))
    return bytes([b[0] ^ 2, b[1], b[2], 0xFF, 0xFE, b[3], b[4], b[5]])


def default_gid(mac: str) -> bytes:
    return b"\xfe\x80" + b"\0" * 6 + eui64(mac)


def gid_sysfs_text(raw: bytes) -> str:
    h = raw.hex()
    return ":".join(h[i : i + 4] for i in range(0, 32, 4))


def put(path: str, text: str) -> None:
    """Replace a file's content by rename: readers never see a partial value."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".sim-", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o444)
    os.replace(tmp, path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _link(target: str, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _unlink(path)
    os.symlink(target, path)


def ib_dir(root: str, device: str) -> str:
    return os.path.join(root, "devices", "virtual", "infiniband", device)


def port_path(root: str, device: str, port: int) -> str:
    return os.path.join(ib_dir(root, device), "ports", str(port))


def _write_device(root: str, bond: SimBond, mac: str, slots: int) -> None:
    guid = eui64(mac).hex()
    guid_text = ":".join(guid[i : i + 4] for i in range(0, 16, 4))
    base = ib_dir(root, bond.device)
    for name, text in (
        ("node_guid", guid_text),
        ("sys_image_guid", guid_text),
        ("node_type", "1: CA"),
        ("fw_ver", ""),
    ):
        put(os.path.join(base, name), text + "\n")
    port = port_path(root, bond.device, 1)
    attrs = {
        "cap_mask": "0x00010000",
        "lid": "0x0",
        "lid_mask_count": "0",
        "link_layer": "Ethernet",
        "phys_state": "5: LinkUp",
        "rate": "10 Gb/sec (1X FDR10)",
        "sm_lid": "0x0",
        "sm_sl": "0",
        "state": "4: ACTIVE",
    }
    for name, text in attrs.items():
        put(os.path.join(port, name), text + "\n")
    put(os.path.join(port, "pkeys", "0"), "0xffff\n")
    for d in ("types", "ndevs"):
        os.makedirs(os.path.join(port, "gid_attrs", d), exist_ok=True)
    gids = os.path.join(port, "gids")
    os.makedirs(gids, exist_ok=True)
    for i in range(slots):
        with open(os.path.join(gids, str(i)), "w") as f:
            f.write(ZERO_TEXT + "\n")
    _link(
        f"../../devices/virtual/infiniband/{bond.device}",
        os.path.join(root, "class", "infiniband", bond.device),
    )


def _write_uverbs(root: str, device: str, n: int) -> None:
    base = os.path.join(root, "devices", "virtual", "infiniband_verbs", f"uverbs{n}")
    put(os.path.join(base, "ibdev"), device + "\n")
    put(os.path.join(base, "abi_version"), "1\n")
    put(os.path.join(base, "dev"), f"{IB_MAJOR}:{UVERBS_BASE_MINOR + n}\n")
    _link(
        f"../../devices/virtual/infiniband_verbs/uverbs{n}",
        os.path.join(root, "class", "infiniband_verbs", f"uverbs{n}"),
    )


def _write_mad(root: str, device: str, n: int, port: int = 1) -> None:
    for kind, minor in (("umad", n), ("issm", ISSM_BASE_MINOR + n)):
        base = os.path.join(root, "devices", "virtual", "infiniband_mad", f"{kind}{n}")
        put(os.path.join(base, "ibdev"), device + "\n")
        put(os.path.join(base, "port"), f"{port}\n")
        put(os.path.join(base, "dev"), f"{IB_MAJOR}:{minor}\n")
        _link(f"../../devices/virtual/infiniband_mad/{kind}{n}",
              os.path.join(root, "class", "infiniband_mad", f"{kind}{n}"))
    put(os.path.join(root, "class", "infiniband_mad", "abi_version"), "5\n")


def pci_address(n: int) -> str:
    return f"0000:{0x17 + n:02x}:00.0"


def set_numa_node(root: str, device: str, numa_node: int | None, n: int = 0) -> None:
    """Give ``device`` a PCI parent whose ``numa_node`` reads ``numa_node`` (None: no parent at all)."""
    link = os.path.join(ib_dir(root, device), "device")
    if numa_node is None:
        _unlink(link)
        return
    pci = os.path.join(root, "devices", "pci0000:00", pci_address(n))
    put(os.path.join(pci, "numa_node"), f"{numa_node}\n")
    put(os.path.join(pci, "vendor"), "0x15b3\n")  # Mellanox
    _link(os.path.relpath(pci, ib_dir(root, device)), link)


def set_rdma_cm(root: str, minor: int = RDMA_CM_MINOR) -> None:
    base = os.path.join(root, "devices", "virtual", "misc", "rdma_cm")
    put(os.path.join(base, "dev"), f"{MISC_MAJOR}:{minor}\n")
    _link("../../devices/virtual/misc/rdma_cm", os.path.join(root, "class", "misc", "rdma_cm"))


def write_netdev(root: str, bond: SimBond, mac: str, operstate: str = "up") -> None:
    base = os.path.join(root, "devices", "virtual", "net", bond.name)
    for name, text in (
        ("address", mac),
        ("ifindex", str(bond.ifindex)),
        ("mtu", str(bond.mtu)),
        ("operstate", operstate),
        ("type", "1"),
        ("addr_assign_type", "3"),
        ("carrier", "1"),
    ):
        put(os.path.join(base, name), text + "\n")
    for name, text in (("mode", "active-backup 1"), ("miimon", "100"), ("slaves", ""), ("active_slave", "")):
        put(os.path.join(base, "bonding", name), text + "\n")
    _link(f"../../devices/virtual/net/{bond.name}", os.path.join(root, "class", "net", bond.name))


def update_netdev(root: str, name: str, attrs: dict[str, str]) -> None:
    """Refresh live attributes of a simulated bond (``address``, ``operstate``, ``mtu``, ``ifalias``)."""
    base = os.path.join(root, "devices", "virtual", "net", name)
    for attr, text in attrs.items():
        path = os.path.join(base, attr)
        try:
            with open(path) as f:
                if f.read() == text + "\n":
                    continue
        except FileNotFoundError:
            pass
        put(path, text + "\n")


def set_netns_mode(root: str, mode: str) -> None:
    put(
        os.path.join(root, "module", "ib_core", "parameters", "netns_mode"),
        ("Y" if mode == "shared" else "N") + "\n",
    )


def build_tree(
    root: str,
    bonds: Sequence[SimBond],
    gid_slots: int = RXE_GID_SLOTS,
    netns_mode: str = "shared",
    rdma_cm: bool = False,
) -> str:
    """Create (or refresh) the tree for ``bonds``: slot 0 of each port holds the default GID."""
    os.makedirs(root, exist_ok=True)
    for pos, bond in enumerate(bonds):
        mac = bond.mac or _mac_for(bond.name)
        n = pos if bond.uverbs is None else bond.uverbs
        _write_device(root, bond, mac, gid_slots)
        _write_uverbs(root, bond.device, n)
        if bond.mad:
            _write_mad(root, bond.device, n)
        set_numa_node(root, bond.device, bond.numa_node, n)
        write_netdev(root, bond, mac)
        write_slot(root, bond.device, 1, 0, default_gid(mac), bond.name)
    if rdma_cm:
        set_rdma_cm(root)
    set_netns_mode(root, netns_mode)
    return root


def write_slot(
    root: str, device: str, port: int, index: int, gid: bytes, ndev: str, gid_type: str = ROCE_V2
) -> None:
    """Fill a slot: attrs first, GID last, so a reader that sees the GID also finds its attrs."""
    base = port_path(root, device, port)
    put(os.path.join(base, "gid_attrs", "types", str(index)), gid_type + "\n")
    put(os.path.join(base, "gid_attrs", "ndevs", str(index)), ndev + "\n")
    put(os.path.join(base, "gids", str(index)), gid_sysfs_text(gid) + "\n")


def clear_slot(root: str, device: str, port: int, index: int) -> None:
    """Empty a slot: GID zeroed first, then the attrs vanish (the kernel's EINVAL)."""
    base = port_path(root, device, port)
    put(os.path.join(base, "gids", str(index)), gid_sysfs_text(ZERO_GID) + "\n")
    _unlink(os.path.join(base, "gid_attrs", "types", str(index)))
    _unlink(os.path.join(base, "gid_attrs", "ndevs", str(index)))


def set_port_state(root: str, device: str, port: int, active: bool) -> None:
    base = port_path(root, device, port)
    put(os.path.join(base, "state"), ("4: ACTIVE" if active else "1: DOWN") + "\n")
    put(os.path.join(base, "phys_state"), ("5: LinkUp" if active else "2: Polling") + "\n")
