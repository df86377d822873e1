"""RDMA devices, their ports and RoCE GID tables, read from sysfs.

The kernel lays it out as (``rxe`` and ``mlx5`` alike)::

    class/infiniband/<dev> -> ../../devices/.../infiniband/<dev>
    <dev>/ports/<N>/{state,link_layer}
    <dev>/ports/<N>/gids/<i>                 "fe80:0000:...:5669"; empty slot: all zeros
    <dev>/ports/<N>/gid_attrs/types/<i>      "RoCE v2" | "IB/RoCE v1"; empty slot: EINVAL
    <dev>/ports/<N>/gid_attrs/ndevs/<i>      netdev name *inside the netns that owns it*
    class/infiniband_verbs/uverbs<K>/ibdev   <dev>

A table has up to 1024 slots (rxe) and the kernel VM under TCG is slow, so a table is read in this
one process with plain ``open`` calls, reading ``types``/``ndevs`` only for non-empty slots.

Usage::

    port = port_for_netdev("/sys", "bond0")          # RdmaPort(device="mlx5_bond_0", port=1, ...)
    idx = roce_v2_index("/sys", port.device, port.port, "198.51.100.2")   # 1 on rxe, 3 on mlx5
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

ZERO_GID = bytes(16)
ROCE_V2 = "RoCE v2"
ROCE_V1 = "RoCE v1"
IB = "IB"
# Slot 0 holds the port's default GID (its netdev's MAC as EUI-64); its ndev is the port's netdev.
DEFAULT_GID_INDEX = 0


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device and the netdev it runs over (``None`` for a port without one)."""

    device: str
    port: int
    netdev: str | None
    uverbs: str | None  # "uverbs0": /dev/infiniband/<uverbs> is what a pod opens
    link_layer: str  # "Ethernet" (RoCE) or "InfiniBand"
    state: str  # "ACTIVE", "DOWN", ...

    @property
    def uverbs_path(self) -> str | None:
        return f"/dev/infiniband/{self.uverbs}" if self.uverbs else None


@dataclass(frozen=True)
class GidEntry:
    """A non-empty slot of a GID table."""

    device: str
    port: int
    index: int
    gid: str  # canonical IPv6 text (RFC 5952): "::ffff:198.51.100.2", "fe80::6477:54ff:fe36:5669"
    type: str  # ROCE_V2, ROCE_V1 or IB
    ndev: str  # "" when the slot has no netdev (IB, or a netns being torn down)
    ipv4: str | None  # the IPv4 address of an IPv4-mapped GID

    @property
    def raw(self) -> str:
        """The GID as sysfs and ``show_gids`` print it: eight groups of four hex digits."""
        packed = socket.inet_pton(socket.AF_INET6, self.gid).hex()
        return ":".join(packed[i : i + 4] for i in range(0, 32, 4))


def _read(path: str) -> str | None:
    """Attribute text, or None when the kernel (EINVAL/ENODATA) or the tree (ENOENT) has no value."""
    try:
        with open(path, "rb", buffering=0) as f:
            return f.read().decode("ascii", "replace").strip()
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENODATA, errno.ENOENT, errno.ENOTDIR):
            return None
        raise


def gid_bytes(text: str) -> bytes:
    """sysfs GID text ("fe80:0000:...") or any IPv6 text -> 16 bytes."""
    return socket.inet_pton(socket.AF_INET6, text)


def gid_for_ip(ip: str) -> bytes:
    """The GID the kernel derives from an address: IPv4 -> ``::ffff:a.b.c.d``, IPv6 -> itself."""
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv4Address):
        return b"\0" * 10 + b"\xff\xff" + addr.packed
    return addr.packed


def gid_text(raw: bytes) -> str:
    return socket.inet_ntop(socket.AF_INET6, raw)


def _ipv4_of(raw: bytes) -> str | None:
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, raw[12:])
    return None


def _gid_type(text: str | None, link_layer: str) -> str | None:
    if text is None:
        return None
    if text == ROCE_V2:
        return ROCE_V2
    if "v1" in text:  # the kernel prints "IB/RoCE v1" for both
        return IB if link_layer == "InfiniBand" else ROCE_V1
    return text


def device_dir(sysfs_root: str, device: str) -> str:
    return os.path.join(sysfs_root, "class", "infiniband", device)


def bus_device(class_entry: str) -> str | None:
    """The bus device behind a sysfs class entry (``class/net/bond0``, ``class/infiniband/mlx5_0``):
    the name its ``device`` link points at — a PCI address on real nodes — or None without one."""
    link = os.path.join(class_entry, "device")
    if not os.path.exists(link):
        return None
    return os.path.basename(os.path.realpath(link)) or None


def port_dir(sysfs_root: str, device: str, port: int) -> str:
    return os.path.join(device_dir(sysfs_root, device), "ports", str(port))


def list_devices(sysfs_root: str) -> list[str]:
    """Names of the RDMA devices visible under ``sysfs_root`` (empty when there is no RDMA)."""
    try:
        names = os.listdir(os.path.join(sysfs_root, "class", "infiniband"))
    except FileNotFoundError:
        return []
    return sorted(n for n in names if os.path.isdir(device_dir(sysfs_root, n)))


def _port_numbers(sysfs_root: str, device: str) -> list[int]:
    try:
        names = os.listdir(os.path.join(device_dir(sysfs_root, device), "ports"))
    except FileNotFoundError:
        return []
    return sorted(int(n) for n in names if n.isdigit())


def port_numbers(sysfs_root: str, device: str) -> list[int]:
    """The port numbers of ``device`` (empty while it has none)."""
    return _port_numbers(sysfs_root, device)


def _state(text: str | None) -> str:
    # "4: ACTIVE" -> "ACTIVE"
    if not text:
        return "UNKNOWN"
    return text.split(":", 1)[-1].strip()


def uverbs_of(sysfs_root: str, device: str) -> str | None:
    """The ``uverbsN`` char device of ``device``, from ``class/infiniband_verbs/*/ibdev``."""
    return uverbs_devices(sysfs_root).get(device)


def uverbs_devices(sysfs_root: str) -> dict[str, str]:
    """RDMA device -> its ``uverbsN`` (the lowest when several name it), one read of the class."""
    base = os.path.join(sysfs_root, "class", "infiniband_verbs")
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return {}
    out: dict[str, str] = {}
    for name in names:
        if name.startswith("uverbs"):
            ibdev = _read(os.path.join(base, name, "ibdev"))
            if ibdev:
                out.setdefault(ibdev, name)
    return out


def _host_netdevs(sysfs_root: str) -> set[str] | None:
    try:
        return set(os.listdir(os.path.join(sysfs_root, "class", "net")))
    except FileNotFoundError:
        return None


def _master_of(sysfs_root: str, netdev: str) -> str:
    """A bond slave's master (mlx5 LAG: ``device/net`` lists the PF, the RoCE netdev is its bond)."""
    link = os.path.join(sysfs_root, "class", "net", netdev, "master")
    if os.path.islink(link):
        return os.path.basename(os.readlink(link))
    return netdev


def _netdev_candidates(sysfs_root: str, device: str, port: int) -> list[str]:
    """Where a port's netdev can be read, most reliable first."""
    out: list[str] = []
    ndev0 = _read(
        os.path.join(port_dir(sysfs_root, device, port), "gid_attrs", "ndevs", str(DEFAULT_GID_INDEX))
    )
    if ndev0:
        out.append(ndev0)
    net_dir = os.path.join(device_dir(sysfs_root, device), "device", "net")
    try:
        pfs = sorted(os.listdir(net_dir))
    except (FileNotFoundError, NotADirectoryError):
        pfs = []
    for pf in pfs:
        dev_port = _read(os.path.join(net_dir, pf, "dev_port"))
        if len(pfs) > 1 and dev_port is not None and dev_port.isdigit() and int(dev_port) + 1 != port:
            continue
        out.append(_master_of(sysfs_root, pf))
    return out


def port_netdev(sysfs_root: str, device: str, port: int) -> str | None:
    """The netdev a RoCE port runs over: the default GID's ndev, else ``device/net/`` (or its bond)."""
    candidates = _netdev_candidates(sysfs_root, device, port)
    present = _host_netdevs(sysfs_root)
    for name in candidates:
        if present is None or name in present:
            return name
    return candidates[0] if candidates else None


def read_port(sysfs_root: str, device: str, port: int, uverbs: dict[str, str] | None = None) -> RdmaPort:
    """One port; ``uverbs`` (from :func:`uverbs_devices`) spares a read of the class per port."""
    pdir = port_dir(sysfs_root, device, port)
    return RdmaPort(
        device=device,
        port=port,
        netdev=port_netdev(sysfs_root, device, port),
        uverbs=(uverbs if uverbs is not None else uverbs_devices(sysfs_root)).get(device),
        link_layer=_read(os.path.join(pdir, "link_layer")) or "UNKNOWN",
        state=_state(_read(os.path.join(pdir, "state"))),
    )


def list_ports(sysfs_root: str) -> list[RdmaPort]:
    """Every port of every RDMA device, with its netdev, uverbs device, link layer and state."""
    uverbs = uverbs_devices(sysfs_root)
    return [
        read_port(sysfs_root, d, p, uverbs)
        for d in list_devices(sysfs_root)
        for p in _port_numbers(sysfs_root, d)
    ]


def default_masters(sysfs_root: str, ports: list[RdmaPort] | None = None) -> list[str]:
    """Every netdev that backs a RoCE port, in device order (of ``ports`` when already read): the
    bonds a plugin's config means when it names none, and the ones the device plugin advertises."""
    out = []
    for port in ports if ports is not None else list_ports(sysfs_root):
        if port.netdev and port.link_layer == "Ethernet" and port.netdev not in out:
            out.append(port.netdev)
    return out


def _device_via_netdev_links(sysfs_root: str, netdev: str) -> str | None:
    """``class/net/<netdev>/device/infiniband/<dev>``, or the same through a bond's ``lower_*`` links."""
    base = os.path.join(sysfs_root, "class", "net", netdev)
    dirs = [os.path.join(base, "device", "infiniband")]
    try:
        lowers = sorted(n for n in os.listdir(base) if n.startswith("lower_"))
    except (FileNotFoundError, NotADirectoryError):
        lowers = []
    dirs += [os.path.join(base, n, "device", "infiniband") for n in lowers]
    for d in dirs:
        try:
            devs = sorted(os.listdir(d))
        except (FileNotFoundError, NotADirectoryError):
            continue
        if devs:
            return devs[0]
    return None


def port_for_netdev(sysfs_root: str, netdev: str, ports: list[RdmaPort] | None = None) -> RdmaPort | None:
    """The RDMA port that runs over ``netdev`` (a bond), or None when the netdev has no RDMA device.
    ``ports``: :func:`list_ports` as just read, for a caller asking about several netdevs (it reads
    every device's ports: 8 bonds asked one by one read them 8 times)."""
    if ports is None:
        ports = list_ports(sysfs_root)
    for p in ports:
        if p.netdev == netdev:
            return p
    device = _device_via_netdev_links(sysfs_root, netdev)
    for p in ports:
        if p.device == device:
            return RdmaPort(p.device, p.port, netdev, p.uverbs, p.link_layer, p.state)
    return None


ZERO_TEXT = b"0000:0000:0000:0000:0000:0000:0000:0000"


def sysfs_text(raw: bytes) -> bytes:
    """16 bytes -> the form sysfs prints (``fe80:0000:...``), to compare without parsing every slot."""
    h = raw.hex().encode()
    return b":".join(h[i : i + 4] for i in range(0, 32, 4))


def _scan_gids(gids_dir: str) -> Iterator[tuple[int, bytes]]:
    """(index, raw sysfs text) of every slot that is not all zeros, in index order. One directory fd
    and one ``os.open``/``read`` per slot: half the cost of ``open()`` (this runs 1024 times per
    port). The kernel makes one attribute per slot, ``0..gid_tbl_len-1`` without holes, so slots are
    opened in order until the first missing one: no listing and sorting of up to 1024 names, and a
    caller that stops at the first match (``find_gid``) reads only the slots before it."""
    try:
        dfd = os.open(gids_dir, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        index = 0
        while True:
            try:
                fd = os.open(str(index), os.O_RDONLY, dir_fd=dfd)
            except FileNotFoundError:
                return
            try:
                text = os.read(fd, 128).strip()
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENODATA):
                    raise
                text = b""
            finally:
                os.close(fd)
            if text and text != ZERO_TEXT:
                yield index, text
            index += 1
    finally:
        os.close(dfd)


def _parse_gid(text: bytes) -> bytes | None:
    try:
        raw = gid_bytes(text.decode("ascii"))
    except (OSError, UnicodeDecodeError):
        return None
    return None if raw == ZERO_GID else raw


def _entry(
    sysfs_root: str, device: str, port: int, index: int, raw: bytes, link_layer: str
) -> GidEntry | None:
    attrs = os.path.join(port_dir(sysfs_root, device, port), "gid_attrs")
    gtype = _gid_type(_read(os.path.join(attrs, "types", str(index))), link_layer)
    if gtype is None:  # the slot emptied between the two reads
        return None
    ndev = _read(os.path.join(attrs, "ndevs", str(index))) or ""
    return GidEntry(device, port, index, gid_text(raw), gtype, ndev, _ipv4_of(raw))


def read_gids(sysfs_root: str, device: str, port: int) -> list[GidEntry]:
    """The non-empty slots of a port's GID table, in index order."""
    pdir = port_dir(sysfs_root, device, port)
    link_layer = _read(os.path.join(pdir, "link_layer")) or ""
    out: list[GidEntry] = []
    for index, text in _scan_gids(os.path.join(pdir, "gids")):
        raw = _parse_gid(text)
        entry = _entry(sysfs_root, device, port, index, raw, link_layer) if raw else None
        if entry is not None:
            out.append(entry)
    return out


def gid_at(sysfs_root: str, device: str, port: int, index: int) -> GidEntry | None:
    """The entry in one slot (None when it is empty or absent): four small reads, for a caller
    that knows where a GID was and only needs to know it is still there, instead of a scan."""
    pdir = port_dir(sysfs_root, device, port)
    text = _read(os.path.join(pdir, "gids", str(index)))
    raw = _parse_gid(text.encode()) if text else None
    if raw is None:
        return None
    return _entry(sysfs_root, device, port, index, raw, _read(os.path.join(pdir, "link_layer")) or "")


def find_gid(
    sysfs_root: str, device: str, port: int, ip: str, gid_type: str = ROCE_V2, ndev: str | None = None
) -> GidEntry | None:
    """The lowest slot holding the GID of ``ip`` with ``gid_type`` (and ``ndev``, when given).

    While an address is briefly on two netdevs (host and pod) the kernel holds two entries with the
    same GID; ``ndev`` picks the one that belongs to the wanted side.
    """
    want = gid_for_ip(ip)
    want_text = sysfs_text(want)
    pdir = port_dir(sysfs_root, device, port)
    link_layer = _read(os.path.join(pdir, "link_layer")) or ""
    for index, text in _scan_gids(os.path.join(pdir, "gids")):
        if text.lower() != want_text:
            continue
        entry = _entry(sysfs_root, device, port, index, want, link_layer)
        if entry is not None and entry.type == gid_type and (ndev is None or entry.ndev == ndev):
            return entry
    return None


def roce_v2_index(sysfs_root: str, device: str, port: int, ip: str, ndev: str | None = None) -> int | None:
    """Index of the RoCE v2 GID of ``ip``, found by value (1 on rxe, 3 on mlx5 — never assumed)."""
    entry = find_gid(sysfs_root, device, port, ip, ROCE_V2, ndev)
    return entry.index if entry else None
