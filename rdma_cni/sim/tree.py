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
    devices/virtual/infiniband/mlx5_bond_0/device -> ../../../pci0000:00/0000:00:01.0/0000:17:00.0
                                                            (numa_node)   SimBond(numa_node=N)
      .../0000:17:00.0/{vendor,device} (0x15b3, 0x101d), driver -> bus/pci/drivers/mlx5_core
      bus/pci/devices/0000:17:00.0 -> the function; 2 functions per PCIe root (pcie_root())
    class/misc/rdma_cm -> ../../devices/virtual/misc/rdma_cm  (dev)        build_tree(rdma_cm=True)
    class/infiniband/mlx5_4 -> ../../devices/pci0000:40/0000:40:01.0/0000:1b:00.0/infiniband/mlx5_4
                                                                          add_ib_hca()
      ports/1/link_layer InfiniBand, gids/0 the port GID (type "IB/RoCE v1", no ndev)
      .../0000:1b:00.0/net/ibs108 (type 32 = ARPHRD_INFINIBAND, dev_port 0) <- class/net/ibs108
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
    """The port's directory, wherever the device lives (``devices/virtual`` or under its PCI function)."""
    entry = os.path.join(root, "class", "infiniband", device)
    base = os.path.realpath(entry) if os.path.islink(entry) else ib_dir(root, device)
    return os.path.join(base, "ports", str(port))


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


FUNCTIONS_PER_ROOT = 2  # 8 NICs of a GPU node: 4 PCIe roots (2 per NUMA node), 2 NICs under each


def pcie_root(n: int) -> str:
    """The root complex PCI function ``n`` hangs under: ``pci0000:00``, ``pci0000:20`` ... for
    functions 0-1, 2-3 ... (a GPU stand-in puts its GPUs under the same roots). The functions keep
    their flat addresses (tests, configs and the demo name them), so the root buses do not bound
    the functions' bus numbers as on a real node: nothing reads those ranges."""
    return f"pci0000:{(0x20 * (n // FUNCTIONS_PER_ROOT)) % 0x100:02x}"


def root_port(n: int) -> str:
    """The root port between function ``n`` and its root complex: one per function."""
    return f"0000:{pcie_root(n)[-2:]}:{1 + n % FUNCTIONS_PER_ROOT:02x}.0"


MELLANOX = "0x15b3"
CX6_DX = "0x101d"  # ConnectX-6 Dx (RoCE)
CX6 = "0x101b"  # ConnectX-6 (InfiniBand HDR)


def pci_dir(root: str, n: int) -> str:
    return os.path.join(root, "devices", pcie_root(n), root_port(n), pci_address(n))


def write_pci_function(root: str, n: int, numa_node: int, device_id: str = CX6_DX,
                       vendor: str = MELLANOX, driver: str = "mlx5_core") -> str:
    """A PCI function as the kernel shows it: ``vendor``, ``device``, ``numa_node``, the ``driver``
    link into ``bus/pci/drivers`` and the ``bus/pci/devices`` link back. Returns its directory."""
    pci = pci_dir(root, n)
    put(os.path.join(pci, "numa_node"), f"{numa_node}\n")
    put(os.path.join(pci, "vendor"), vendor + "\n")
    put(os.path.join(pci, "device"), device_id + "\n")
    put(os.path.join(pci, "class"), "0x020000\n" if device_id != CX6 else "0x020700\n")
    drivers = os.path.join(root, "bus", "pci", "drivers", driver)
    os.makedirs(drivers, exist_ok=True)
    _link(os.path.relpath(drivers, pci), os.path.join(pci, "driver"))
    bus = os.path.join(root, "bus", "pci", "devices", pci_address(n))
    _link(os.path.relpath(pci, os.path.dirname(bus)), bus)
    return pci


def set_numa_node(root: str, device: str, numa_node: int | None, n: int = 0) -> None:
    """Give ``device`` a PCI parent (a ConnectX-6 Dx function) whose ``numa_node`` reads
    ``numa_node`` (None: no parent at all)."""
    link = os.path.join(ib_dir(root, device), "device")
    if numa_node is None:
        _unlink(link)
        return
    pci = write_pci_function(root, n, numa_node)
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


@dataclass(frozen=True)
class SimIbHca:
    """An InfiniBand HCA on a PCI function of its own, with its IPoIB netdev (``ipoib``, or None)."""

    device: str  # mlx5_4
    ipoib: str | None  # ibs108
    pci_index: int  # its PCI address is pci_address(pci_index)
    uverbs: int  # N of uverbsN, umadN, issmN
    numa_node: int = 0
    device_id: str = CX6
    ifindex: int = 0


def add_ib_hca(root: str, hca: SimIbHca) -> str:
    """Add ``hca`` to the tree as the kernel lays out an mlx5 InfiniBand port (see the module doc);
    its port is ACTIVE. Returns the device's directory."""
    pci = write_pci_function(root, hca.pci_index, hca.numa_node, hca.device_id)
    base = os.path.join(pci, "infiniband", hca.device)
    guid = f"b8ce:f603:00{hca.pci_index:02x}:{hca.uverbs:04x}"
    for name, text in (("node_guid", guid), ("sys_image_guid", guid), ("node_type", "1: CA"),
                       ("fw_ver", "20.31.1014"), ("hca_type", "MT4123")):
        put(os.path.join(base, name), text + "\n")
    port = os.path.join(base, "ports", "1")
    for name, text in (("link_layer", "InfiniBand"), ("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"),
                       ("rate", "200 Gb/sec (4X HDR)"), ("lid", f"0x{hca.uverbs + 1:x}"), ("sm_lid", "0x1"),
                       ("lid_mask_count", "0"), ("cap_mask", "0xa651e848")):
        put(os.path.join(port, name), text + "\n")
    put(os.path.join(port, "pkeys", "0"), "0xffff\n")
    put(os.path.join(port, "gids", "0"), f"fe80:0000:0000:0000:{guid}\n")
    put(os.path.join(port, "gid_attrs", "types", "0"), "IB/RoCE v1\n")  # an IB GID has no ndev
    _link(os.path.relpath(pci, base), os.path.join(base, "device"))
    _link(os.path.relpath(base, os.path.join(root, "class", "infiniband")),
          os.path.join(root, "class", "infiniband", hca.device))
    _write_uverbs(root, hca.device, hca.uverbs)
    _write_mad(root, hca.device, hca.uverbs)
    if hca.ipoib:
        net = os.path.join(pci, "net", hca.ipoib)
        hexguid = guid.replace(":", "")
        mac = "00:00:10:29:fe:80:00:00:00:00:00:00:" + ":".join(hexguid[i : i + 2] for i in range(0, 16, 2))
        for name, text in (("type", "32"), ("dev_port", "0"), ("address", mac), ("mtu", "2044"),
                           ("operstate", "up"), ("carrier", "1"), ("ifindex", str(hca.ifindex))):
            put(os.path.join(net, name), text + "\n")
        _link(os.path.relpath(pci, net), os.path.join(net, "device"))
        entry = os.path.join(root, "class", "net", hca.ipoib)
        _link(os.path.relpath(net, os.path.dirname(entry)), entry)
    return base
