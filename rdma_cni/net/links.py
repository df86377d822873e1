"""Network links: find a bond, create the pod's macvlan inside the pod netns, configure, delete.

The macvlan is created *directly in the pod netns* (``net_ns_fd`` on RTM_NEWLINK, as the reference Go
plugin does) under a temporary name, then renamed there: no moment where a half-made interface sits
in the node netns under a name that could clash, and ~10x cheaper than add-then-move.

    host = netlink_in(None); pod = netlink_in(ns)   # RtnlSocket (rdma_cni.net.nlsock)
    create_macvlan(host, bond.index, ns.fd, "mvtmp1a2b", "bridge")
    link = configure_link(pod, "mvtmp1a2b", "bond0", mtu=1500, addrgen_off=True)
    set_up(pod, link.index)
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, replace

from rdma_cni.net.nlsock import IFF_LOOPBACK, IFF_UP, MACVLAN_MODE, LinkInfo, RtnlSocket
from rdma_cni.net.rtnl import error_code

ADDR_GEN_MODE_NONE = 1
MACVLAN_MODES = tuple(MACVLAN_MODE)


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    mac: str
    mtu: int
    up: bool
    kind: str
    parent_index: int
    loopback: bool = False

    def macvlan_parent_problem(self) -> str:
        """Why the kernel would refuse a macvlan on this link ("" when it would not): it needs an
        Ethernet device (a 6-byte MAC) that is not the loopback."""
        if self.loopback:
            return "it is the loopback device"
        if len(self.mac.split(":")) != 6:
            return "it is not an Ethernet device"
        return ""


def _link(info: LinkInfo) -> Link:
    return Link(
        index=info.index,
        name=info.name,
        mac=info.mac,
        mtu=info.mtu,
        up=bool(info.flags & IFF_UP),
        kind=info.kind,
        parent_index=info.parent_index,
        loopback=bool(info.flags & IFF_LOOPBACK),
    )


def get_link(ipr: RtnlSocket, name: str = "", index: int = 0) -> Link | None:
    """The link by name or index, or None when there is no such link."""
    info = ipr.link_get(name=name, index=index)
    return _link(info) if info is not None else None


def all_links(ipr: RtnlSocket) -> list[Link]:
    return [_link(m) for m in ipr.link_dump()]


def create_macvlan(
    host: RtnlSocket, parent_index: int, netns_fd: int, name: str, mode: str, mac: str = ""
) -> None:
    """Create a macvlan on ``parent_index`` (a node link) straight into the netns behind ``netns_fd``."""
    host.macvlan_add(name, parent_index, netns_fd, mode, mac)


def configure_link(pod: RtnlSocket, temp_name: str, name: str, mtu: int, addrgen_off: bool) -> Link:
    """Rename, set MTU and (optionally) stop IPv6 address generation, in one request; the link
    stays down. Returns the link as it is now (its MAC is final: nothing here changes it).

    ``addrgen_off`` (always, also when IPv6 moves): a kernel-made link-local would become a RoCE GID
    and could take the slot the pod's IPv4 GID must land in (lab/vm FINDINGS, V6 vs V7).
    """
    link = get_link(pod, temp_name)
    if link is None:
        raise OSError(errno.ENODEV, f"macvlan {temp_name} vanished from the pod netns")
    if addrgen_off:
        try:
            pod.link_set(link.index, name=name, mtu=mtu, addrgen_mode=ADDR_GEN_MODE_NONE)
            return replace(link, name=name, mtu=mtu)
        except OSError as exc:
            # IPv6 disabled in the pod's kernel: then there is no link-local to worry about.
            if error_code(exc) not in (errno.EAFNOSUPPORT, errno.EOPNOTSUPP):
                raise
    pod.link_set(link.index, name=name, mtu=mtu)
    return replace(link, name=name, mtu=mtu)


def set_up(ipr: RtnlSocket, index: int) -> None:
    ipr.link_set(index, up=True)


def delete_link(ipr: RtnlSocket, name: str) -> bool:
    """Delete by name; False when it was not there."""
    link = get_link(ipr, name)
    return link is not None and delete_index(ipr, link.index)


def delete_index(ipr: RtnlSocket, index: int) -> bool:
    """Delete by index; False when it was not there (any more)."""
    try:
        ipr.link_del(index)
    except OSError as exc:
        if error_code(exc) in (errno.ENODEV, errno.ENOENT):
            return False
        raise
    return True
