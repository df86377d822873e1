"""What a DRA claim may select a bond by, beyond where it sits: its port's link layer, the host's
RoCE v2 IPv4 GID index and the bond's IPv4 subnet, read now.

The DRA driver publishes them as device attributes (:mod:`rdma_cni.dra.slices`); the device plugin
has no place for them in kubelet's API. They change when the node is re-addressed, so the driver
reads them on every rescan that changed something (a bond that lent its address to a pod keeps the
GID index rdma-macvlan recorded, :func:`~rdma_cni.devices.allocation.host_gid_indexes`, and its
subnet is then unknown: the pod holds the address).

    facts = read_facts(cfg, snap.bonds)    # {"mlx5_bond_0": BondFacts("Ethernet", 3, "198.51.100.0/28")}
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rdma_cni.devices.allocation import host_gid_indexes
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.hca import read_text
from rdma_cni.devices.model import RdmaBond
from rdma_cni.net.nlsock import RtnlSocket
from rdma_cni.rdma import sysfs


@dataclass(frozen=True)
class BondFacts:
    link_layer: str  # "Ethernet" (RoCE), "InfiniBand", "" when sysfs does not say
    gid_index: int | None  # the host's RoCE v2 IPv4 GID index (see allocation.host_gid_indexes)
    ipv4_subnet: str | None  # "198.51.100.0/28": the network of the bond's first IPv4 address


def link_layer(sysfs_root: str, bond: RdmaBond) -> str:
    return read_text(os.path.join(sysfs.port_dir(sysfs_root, bond.id, bond.port), "link_layer")) or ""


def ipv4_subnets(netdevs: Iterable[str]) -> dict[str, str]:
    """netdev -> the network of its first IPv4 address (``ip -4 addr`` order), in the current netns."""
    out: dict[str, str] = {}
    with RtnlSocket() as ipr:
        for name in dict.fromkeys(netdevs):
            link = ipr.link_get(name=name)
            if link is None:
                continue
            for rec in ipr.addr_dump(socket.AF_INET, link.index):
                attrs = dict((a[0], a[1]) for a in rec["attrs"])
                ip = attrs.get("IFA_LOCAL") or attrs.get("IFA_ADDRESS")
                if isinstance(ip, str):
                    out[name] = str(ipaddress.ip_interface(f"{ip}/{rec['prefixlen']}").network)
                    break
    return out


def read_facts(cfg: PluginConfig, bonds: Sequence[RdmaBond]) -> dict[str, BondFacts]:
    """device ID -> its facts now (one netlink look for the subnets, the GID tables for the index)."""
    present = [b for b in bonds if os.path.isdir(sysfs.device_dir(cfg.sysfs_root, b.id))]
    subnets = ipv4_subnets(b.netdev for b in bonds)
    indexes = host_gid_indexes(cfg, present) if present else {}
    return {
        b.id: BondFacts(link_layer(cfg.sysfs_root, b), indexes.get(b.id), subnets.get(b.netdev))
        for b in bonds
    }
