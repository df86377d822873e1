"""The RDMA steps of rdma-macvlan's transaction (DESIGN.md "ADD, per bond", step 4).

Before write-ahead (:func:`plan`): find the RDMA device behind the bond, check the kernel's RDMA
netns mode once, and read the host's RoCE v2 GID index of the bond's IPv4 address (and of its first
global IPv6, whose GID is the address itself) — recorded so the
pod's index can be checked against it after the move, and so DEL knows which slot to wait for.
In the transaction (:func:`attach`), after the address moved and the link is up: move the device
into the pod in exclusive mode, wait for the pod's GID, check its index, write the GID record.
On teardown (:func:`detach`): give an exclusive-mode device back, wait until the pod's GID left its
slot (a deleted netns is torn down asynchronously; re-adding the IP before that puts the host's GID
at another index), and remove the GID record.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from rdma_cni.attachments import AttachmentRecord, BondRecord
from rdma_cni.cni.errors import RDMA_MODE_MISMATCH, CniError
from rdma_cni.net import addresses, links
from rdma_cni.net.netns import Netns, open_netns
from rdma_cni.rdma import gid, mode, nldev, records, sysfs

if TYPE_CHECKING:
    from rdma_cni.plugins.macvlan.model import MacvlanConfig

log = logging.getLogger("rdma_cni.macvlan")


def device_of(sysfs_root: str, netdev: str, ports: list[sysfs.RdmaPort] | None = None) -> str | None:
    port = sysfs.port_for_netdev(sysfs_root, netdev, ports)
    return port.device if port else None


def _first_ipv4(b: BondRecord) -> str | None:
    for a in b.addresses:
        if not addresses.is_ipv6(a):
            return addresses.ip_of(a)
    return None


def _first_ipv6(b: BondRecord) -> str | None:
    """The bond's first global IPv6 (in add order): the one whose GID index is recorded."""
    for a in b.addresses:
        if addresses.is_ipv6(a):
            return addresses.ip_of(a)
    return None


def _in_host_gid_order(sysfs_root: str, port: sysfs.RdmaPort, b: BondRecord) -> None:
    """Dual-stack: the addresses go into the pod (and back) in the order of their GID indexes on
    the host, so each lands on its host index whichever family appeared first at boot. Decided
    write-ahead (the record's order is the add order). One family: nothing to interleave."""
    if not any(addresses.is_ipv6(a) for a in b.addresses) or all(addresses.is_ipv6(a) for a in b.addresses):
        return
    index: dict[str, int] = {}
    for entry in sysfs.read_gids(sysfs_root, port.device, port.port):
        if entry.type == sysfs.ROCE_V2 and entry.ndev == b.bond:
            index.setdefault(entry.gid, entry.index)  # the lowest slot, as roce_v2_index finds it
    b.addresses = addresses.in_gid_order(
        b.addresses, lambda a: index.get(sysfs.gid_text(sysfs.gid_for_ip(addresses.ip_of(a)))))


def plan(cfg: MacvlanConfig, bonds: list[BondRecord], ports: list[sysfs.RdmaPort]) -> None:
    """Fill ``b.rdma`` for every bond that has an RDMA device (or fail when one is required).
    ``ports``: :func:`sysfs.list_ports` as the caller just read it (once per ADD)."""
    found = mode.bond_ports(cfg.sysfs_root, [b.bond for b in bonds], ports, cfg.rdma.required,
                            cfg.rdma.netns_mode)
    for b in bonds:
        port = found.get(b.bond)
        if port is None:
            b.rdma = None
            continue
        _in_host_gid_order(cfg.sysfs_root, port, b)
        ip, ip6 = _first_ipv4(b), _first_ipv6(b)
        host_index = sysfs.roce_v2_index(cfg.sysfs_root, port.device, port.port, ip, b.bond) if ip else None
        b.rdma = {
            "device": port.device,
            "port": port.port,
            "uverbs": port.uverbs,
            "ip": ip,
            "hostGidIndex": host_index,
            "netnsMode": cfg.rdma.netns_mode,
            "moved": False,
        }
        if ip6:
            b.rdma["ipv6"] = ip6
            b.rdma["hostGidIndexIPv6"] = sysfs.roce_v2_index(cfg.sysfs_root, port.device, port.port, ip6,
                                                             b.bond)


def attach(cfg: MacvlanConfig, rec: AttachmentRecord, b: BondRecord, ns: Netns, ip: str | None,
           save: Any) -> None:
    """In the transaction, after the pod interface holds the IP and is up."""
    info = b.rdma
    if info is None:
        return
    ip = ip or info["ip"]
    entry = entry6 = None
    if ip:
        # Read while the device is still in the node netns: the index is fixed when the address lands.
        entry = gid.wait_for_gid(cfg.sysfs_root, info["device"], info["port"], ip, cfg.rdma.gid_timeout_ms,
                                 ndev=b.pod_ifname)
        expected = cfg.rdma.gid_index if isinstance(cfg.rdma.gid_index, int) else info["hostGidIndex"]
        if expected is not None:
            source = "configured" if isinstance(cfg.rdma.gid_index, int) else "host"
            gid.check_gid_index(entry, expected, source, cfg.sysfs_root)
        info["podGidIndex"] = entry.index
    if info.get("ipv6"):
        # RoCE v2 GID of an IPv6 address = the address itself; it keeps the host's index like IPv4.
        entry6 = gid.wait_for_gid(cfg.sysfs_root, info["device"], info["port"], info["ipv6"],
                                  cfg.rdma.gid_timeout_ms, ndev=b.pod_ifname)
        if info.get("hostGidIndexIPv6") is not None:
            gid.check_gid_index(entry6, info["hostGidIndexIPv6"], "host", cfg.sysfs_root)
        info["podGidIndexIPv6"] = entry6.index
    if entry or entry6:
        records.write_pod_record(cfg.run_dir, rec.container_id, b.pod_ifname, entry, info["uverbs"], entry6)
    else:
        log.info("%s: no address on the pod interface, no RoCE v2 GID to check", b.pod_ifname)
    if cfg.rdma.netns_mode == mode.EXCLUSIVE and not info["moved"]:
        info["moved"] = True  # recorded first: a crash right after the move must give it back
        save()
        _move_device(info["device"], ns.fd)


def _move_device(device: str, netns_fd: int) -> None:
    """Exclusive mode: the device must follow the pod; drivers that cannot (Soft-RoCE answers
    EOPNOTSUPP, seen on the real kernel) make exclusive mode impossible on this node."""
    try:
        nldev.set_device_netns(device, netns_fd)
    except OSError as exc:
        raise CniError(
            RDMA_MODE_MISMATCH,
            f"cannot move RDMA device {device} into the pod netns ({exc.strerror or exc}): its driver "
            "does not support exclusive mode; use rdma.netnsMode \"shared\" and "
            "`rdma system set netns shared` (needs no other netns to exist)",
        ) from exc


def detach(cfg: MacvlanConfig, rec: AttachmentRecord, b: BondRecord, pod_ns: Netns | None) -> None:
    """Before the bond gets its addresses back."""
    info = b.rdma
    if info is None:
        return
    if info.get("moved") and pod_ns is not None:
        try:
            with open_netns("/proc/thread-self/ns/net") as home:
                nldev.set_device_netns(info["device"], home.fd, from_netns_fd=pod_ns.fd)
        except OSError as exc:  # the kernel returns it to the host when the netns dies anyway
            log.warning("could not give %s back from %s: %s", info["device"], rec.netns, exc)
    for ip in (info.get("ip"), info.get("ipv6")):
        if ip and not gid.wait_for_gid_gone(cfg.sysfs_root, info["device"], info["port"], ip,
                                            cfg.rdma.gid_timeout_ms):
            log.warning("the pod's GID of %s is still in %s's table; the host's may land elsewhere",
                        ip, info["device"])
    records.remove_pod_records(cfg.run_dir, rec.container_id, b.pod_ifname)


def refresh_host_record(cfg: MacvlanConfig, host: Any) -> None:
    """Keep ``runDir/gid/host.json`` current; never fails a verb (it is advisory for readers)."""
    try:
        if not os.path.isdir(os.path.join(cfg.sysfs_root, "class", "infiniband")):
            return
        host_ipv4: dict[str, list[str]] = {}
        host_ipv6: dict[str, list[str]] = {}
        for port in sysfs.list_ports(cfg.sysfs_root):
            link = links.get_link(host, port.netdev) if port.netdev else None
            if link is not None:
                held = addresses.snapshot(host, link.index)
                host_ipv4[link.name] = [addresses.ip_of(a) for a in held if not addresses.is_ipv6(a)]
                host_ipv6[link.name] = [addresses.ip_of(a) for a in held if addresses.is_ipv6(a)]
        records.update_host_record(cfg.run_dir, cfg.sysfs_root, host_ipv4, host_ipv6)
    except (OSError, ValueError) as exc:
        log.warning("could not update %s/gid/host.json: %s", cfg.run_dir, exc)
