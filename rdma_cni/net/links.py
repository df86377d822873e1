"""Network links: find a bond, create the pod's macvlan inside the pod netns, configure, delete.

The macvlan is created *directly in the pod netns* (``net_ns_fd`` on RTM_NEWLINK, as the reference Go
plugin does) under a temporary name, then renamed there: no moment where a half-made interface sits
in the node netns under a name that could clash, and ~10x cheaper than add-then-move.

    host = netlink_in(None); pod = netlink_in(ns)
    create_macvlan(host, bond.index, ns.fd, "mvtmp1a2b", "bridge")
    link = configure_link(pod, "mvtmp1a2b", "bond0", mtu=1500, addrgen_off=True)
    set_up(pod, link.index)
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, replace
from typing import Any

from rdma_cni.net.rtnl import error_code

IFF_UP = 0x1
ADDR_GEN_MODE_NONE = 1
MACVLAN_MODES = ("bridge", "private", "vepa", "passthru")


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    mac: str
    mtu: int
    up: bool
    kind: str
    parent_index: int


def _link(msg: Any) -> Link:
    info = msg.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else ""
    return Link(
        index=msg["index"],
        name=msg.get_attr("IFLA_IFNAME"),
        mac=msg.get_attr("IFLA_ADDRESS") or "",
        mtu=msg.get_attr("IFLA_MTU") or 0,
        up=bool(msg["flags"] & IFF_UP),
        kind=kind or "",
        parent_index=msg.get_attr("IFLA_LINK") or 0,
    )


def get_link(ipr: Any, name: str = "", index: int = 0) -> Link | None:
    """The link by name or index, or None when there is no such link."""
    try:
        msgs = ipr.link("get", ifname=name) if name else ipr.link("get", index=index)
    except Exception as exc:
        if error_code(exc) in (errno.ENODEV, errno.ENOENT, errno.EINVAL):
            return None
        raise
    return _link(msgs[0]) if msgs else None


def all_links(ipr: Any) -> list[Link]:
    return [_link(m) for m in ipr.link("dump")]


def create_macvlan(host: Any, parent_index: int, netns_fd: int, name: str, mode: str, mac: str = "") -> None:
    """Create a macvlan on ``parent_index`` (a node link) straight into the netns behind ``netns_fd``."""
    kwargs: dict[str, Any] = {
        "ifname": name,
        "kind": "macvlan",
        "link": parent_index,
        "macvlan_mode": mode,
        "net_ns_fd": netns_fd,
    }
    if mac:
        kwargs["address"] = mac
    host.link("add", **kwargs)


def configure_link(pod: Any, temp_name: str, name: str, mtu: int, addrgen_off: bool) -> Link:
    """Rename, set MTU and (optionally) stop IPv6 address generation, in one request; the link
    stays down. Returns the link as it is now (its MAC is final: nothing here changes it).

    ``addrgen_off``: with no IPv6 address moving, a kernel-made link-local would become a RoCE GID
    and could take the slot the pod's IPv4 GID must land in (lab/vm FINDINGS, V6 vs V7).
    """
    link = get_link(pod, temp_name)
    if link is None:
        raise OSError(errno.ENODEV, f"macvlan {temp_name} vanished from the pod netns")
    if addrgen_off:
        spec = {"attrs": [["AF_INET6", {"attrs": [["IFLA_INET6_ADDR_GEN_MODE", ADDR_GEN_MODE_NONE]]}]]}
        try:
            pod.link("set", index=link.index, ifname=name, mtu=mtu, IFLA_AF_SPEC=spec)
            return replace(link, name=name, mtu=mtu)
        except Exception as exc:
            # IPv6 disabled in the pod's kernel: then there is no link-local to worry about.
            if error_code(exc) not in (errno.EAFNOSUPPORT, errno.EOPNOTSUPP):
                raise
    pod.link("set", index=link.index, ifname=name, mtu=mtu)
    return replace(link, name=name, mtu=mtu)


def set_up(ipr: Any, index: int) -> None:
    ipr.link("set", index=index, state="up")


def delete_link(ipr: Any, name: str) -> bool:
    """Delete by name; False when it was not there."""
    link = get_link(ipr, name)
    if link is None:
        return False
    try:
        ipr.link("del", index=link.index)
    except Exception as exc:
        if error_code(exc) in (errno.ENODEV, errno.ENOENT):
            return False
        raise
    return True
