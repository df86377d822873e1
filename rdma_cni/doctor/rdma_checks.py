"""RDMA prerequisites, as TKE's guide's "Environment Verification" checks them by hand: the kernel's RDMA
netns mode, every RDMA device ACTIVE, and per device a RoCE v2 GID for the bond's IPv4 address at
the same index everywhere (the "unified GID index" NCCL_IB_GID_INDEX relies on).
"""

from __future__ import annotations

from rdma_cni.cni.errors import CniError
from rdma_cni.doctor.findings import FAIL, OK, SKIP, WARN, Finding
from rdma_cni.doctor.node import NodeSnapshot
from rdma_cni.doctor.shared_pools import find_config
from rdma_cni.rdma import mode
from rdma_cni.rdma.sysfs import ROCE_V2, GidEntry, RdmaPort


def check_netns_mode(snap: NodeSnapshot) -> list[Finding]:
    try:
        current = mode.current_netns_mode(snap.paths.sysfs_root)
    except CniError as exc:
        return [
            Finding("rdma-netns-mode", FAIL, exc.msg, "load the RDMA drivers (mlx5_ib / ib_core) on the node")
        ]
    if current == mode.SHARED:
        return [Finding("rdma-netns-mode", OK, "kernel RDMA netns mode is shared")]
    return [
        Finding(
            "rdma-netns-mode",
            FAIL,
            f"kernel RDMA netns mode is {current}, rdma-macvlan needs shared",
            mode.FIX_SHARED,
        )
    ]


def check_devices(snap: NodeSnapshot) -> list[Finding]:
    if not snap.ports:
        return [
            Finding(
                "rdma-devices",
                FAIL,
                f"no RDMA device under {snap.paths.sysfs_root}/class/infiniband",
                "this is not an RDMA node, or the RDMA drivers are not loaded (lsmod | grep ib_core)",
            )
        ]
    return [_device_finding(p) for p in snap.ports]


def _device_finding(port: RdmaPort) -> Finding:
    name = f"rdma-device {port.device}/{port.port}"
    where = f"netdev {port.netdev or '?'}, {port.uverbs_path or 'no uverbs device'}"
    if port.link_layer != "Ethernet":
        return Finding(
            name,
            WARN,
            f"link layer {port.link_layer}, not RoCE ({where})",
            "rdma-macvlan serves RoCE (Ethernet) ports only",
        )
    if port.state != "ACTIVE":
        return Finding(
            name,
            FAIL,
            f"port state {port.state} ({where})",
            f"bring {port.netdev or 'the bond'} and its slaves up; check cabling and `rdma link`",
        )
    if not port.netdev:
        return Finding(
            name,
            FAIL,
            "ACTIVE but no netdev found for the port",
            "check `rdma link show`: the device must run over a bond (netdev bondN)",
        )
    return Finding(name, OK, f"ACTIVE, {where}")


def check_uverbs(snap: NodeSnapshot) -> list[Finding]:
    """The verbs device files pods open (a simulated or captured tree has none to check)."""
    import os

    if os.path.realpath(snap.paths.sysfs_root) != "/sys":
        return [Finding("uverbs", SKIP, f"{snap.paths.sysfs_root} is not this node's /sys")]
    out = []
    for port in snap.ports:
        if not port.uverbs:
            continue
        path = os.path.join(snap.paths.dev_root, "infiniband", port.uverbs)
        if os.path.exists(path):
            out.append(
                Finding(
                    f"uverbs {port.device}",
                    OK,
                    f"{path}: pods get it from the device plugin and "
                    "need the IPC_LOCK capability to pin memory",
                )
            )
        else:
            out.append(
                Finding(
                    f"uverbs {port.device}",
                    WARN,
                    f"{path} is missing: no pod can open {port.device}",
                    "load ib_uverbs (modprobe ib_uverbs)",
                )
            )
    return out


def _v2_ipv4(entries: list[GidEntry]) -> list[GidEntry]:
    return [g for g in entries if g.type == ROCE_V2 and g.ipv4]


def check_gids(snap: NodeSnapshot) -> list[Finding]:
    """Per port: the RoCE v2 GID of the bond's IPv4 (on the host, or in the pod it was lent to)."""
    out = []
    indices: dict[str, int] = {}
    for port in snap.ports:
        if port.link_layer != "Ethernet" or not port.netdev:
            continue
        finding, index = _gid_finding(snap, port)
        out.append(finding)
        if index is not None:
            indices[f"{port.device}/{port.port}"] = index
    if len(set(indices.values())) > 1:
        listing = ", ".join(f"{k}={v}" for k, v in sorted(indices.items()))
        out.append(
            Finding(
                "gid-index-unified",
                WARN,
                f"RoCE v2 GID indices differ between devices: {listing}",
                "NCCL_IB_GID_INDEX cannot be one value on this node; give every bond exactly one "
                "IPv4 address and no extra IPv6 addresses, then re-add them in the same order",
            )
        )
    elif indices:
        index = next(iter(indices.values()))
        advice = f"NCCL_IB_GID_INDEX={index}"
        if find_config(snap.paths.conf_dir) is not None:  # shared mode: not the pods' index
            advice += (
                " for rdma-macvlan pods; an rdma-ipvlan pod's addresses have indexes of their own: its "
                "network-status device-info has them, NCCL >= 2.21 finds them with the variable unset"
            )
        out.append(
            Finding(
                "gid-index-unified",
                OK,
                f"every device has its RoCE v2 IPv4 GID at index {index} ({advice})",
            )
        )
    return out


def _gid_finding(snap: NodeSnapshot, port: RdmaPort) -> tuple[Finding, int | None]:
    name = f"roce-v2-gid {port.device}/{port.port}"
    entries = _v2_ipv4(snap.gids.get((port.device, port.port), []))
    host_ips = {c.split("/")[0] for c in snap.host_addrs.get(port.netdev or "", [])}
    on_host = [g for g in entries if g.ipv4 in host_ips]
    if on_host:
        g = on_host[0]
        return Finding(name, OK, f"index {g.index}: {g.gid} ({g.ipv4} on {port.netdev})"), g.index
    if host_ips:
        return Finding(
            name,
            FAIL,
            f"{port.netdev} has {', '.join(sorted(host_ips))} but no RoCE v2 GID for it",
            f"check that {port.device} runs over {port.netdev} (`rdma link`), then re-add the "
            f"address: ip addr del/add on {port.netdev}",
        ), None
    lent = [g for g in entries if g.ipv4 not in host_ips]
    if lent:
        g = lent[0]
        where = f"{g.ipv4}, on {g.ndev or 'an interface'} outside the node netns"
        if any(b.bond == port.netdev for rec in snap.attachments for b in rec.bonds):
            return Finding(name, OK, f"index {g.index}: {g.gid} ({where}: lent to a pod)"), g.index
        return (
            Finding(
                name,
                WARN,
                f"index {g.index}: {g.gid} ({where}), but no attachment holds {port.netdev}",
                "another plugin moved the address, or the state was lost: see `cni-tool state`",
            ),
            g.index,
        )
    return Finding(
        name,
        FAIL,
        f"no RoCE v2 IPv4 GID: {port.netdev} has no IPv4 address and no pod holds one",
        f"give {port.netdev} its IPv4 address back (see `cni-tool state`)",
    ), None
