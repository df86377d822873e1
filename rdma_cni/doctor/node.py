"""What the doctor looks at: the node's paths, and one read of its live state shared by every check.

The paths default to a real node's; ``cni-tool doctor`` overrides them from its options, and the
data/run dirs default to what the installed ``tke-rdma-macvlan`` config says, because that config
is what the plugin obeys. :func:`observe` reads sysfs, netlink and the plugin's state once, so checks
are pure functions of a :class:`NodeSnapshot` (and tests can build one by hand).

    snap = observe(NodePaths(sysfs_root="/tmp/sys", netns="/run/netns/node"))
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.attachments import AttachmentRecord, SkippedRestore
from rdma_cni.cni.cache import ResultCache
from rdma_cni.cni.errors import CniError
from rdma_cni.doctor.plugin_view import DEFAULT_RESOURCE, DevicePluginView, observe_device_plugin
from rdma_cni.net import addresses, links
from rdma_cni.net.netns import netlink_in, netns_inode, open_netns
from rdma_cni.rdma import records, sysfs
from rdma_cni.rdma.sysfs import GidEntry, RdmaPort
from rdma_cni.state import NodeState

DELEGATE_SUBDIR = "rdma-multus.d"
DELEGATE_NAME = "tke-rdma-macvlan"
META_NAME = "00-rdma-multus.conflist"


@dataclass(frozen=True)
class NodePaths:
    sysfs_root: str = "/sys"
    netns: str = ""  # "" = the netns this runs in (the node's); else a path like /run/netns/x
    cni_bin_dir: str = "/opt/cni/bin"
    conf_dir: str = "/etc/cni/net.d"
    kubelet_root_dir: str = "/var/lib/kubelet"
    data_dir: str = ""  # "" = from the installed delegate config, else the plugin's default
    run_dir: str = ""
    proc_root: str = "/proc"
    dev_root: str = "/dev"
    results_dirs: tuple[str, ...] = ("/var/lib/cni", "/var/lib/cni/rdma-multus")
    pod_resources_dir: str = ""  # "" = <kubelet_root_dir>/pod-resources (it follows kubelet's --root-dir)
    kubelet_timeout: float = 3.0  # per PodResources call

    def pod_resources(self) -> str:
        return self.pod_resources_dir or os.path.join(self.kubelet_root_dir, "pod-resources")


@dataclass
class NodeSnapshot:
    paths: NodePaths
    data_dir: str
    run_dir: str
    ports: list[RdmaPort]
    gids: dict[tuple[str, int], list[GidEntry]]
    host_addrs: dict[str, list[str]]  # netdev -> IPv4 CIDRs on the node; absent netdev = no such link
    attachments: list[AttachmentRecord]
    unreadable_state: list[str]
    netns_alive: dict[str, bool]  # container ID -> its recorded netns still exists with its inode
    host_record: dict[str, Any] = field(default_factory=dict)
    host_ipv6: dict[str, list[str]] = field(default_factory=dict)  # netdev -> global IPv6 CIDRs
    skipped: list[SkippedRestore] = field(default_factory=list)  # restores left out: re-addressed bonds
    errors: list[str] = field(default_factory=list)  # what could not be read, for the checks to report
    device_plugin: DevicePluginView | None = None  # the plugin's status file and kubelet's PodResources


def pod_names(results_dirs: tuple[str, ...], container_id: str) -> str:
    """``namespace/name`` of the pod whose sandbox is ``container_id``, from any libcni cache."""
    for d in results_dirs:
        for entry in ResultCache(d).entries(container_id=container_id):
            args = dict(entry.cni_args)
            if args.get("K8S_POD_NAME"):
                return f"{args.get('K8S_POD_NAMESPACE', '?')}/{args['K8S_POD_NAME']}"
    return ""


def delegate_config(paths: NodePaths) -> dict[str, Any] | None:
    path = os.path.join(paths.conf_dir, DELEGATE_SUBDIR, f"{DELEGATE_NAME}.conf")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _dirs(paths: NodePaths) -> tuple[str, str]:
    cfg = delegate_config(paths) or {}
    data_dir = paths.data_dir or str(cfg.get("dataDir") or "/var/lib/cni/rdma-macvlan")
    run_dir = paths.run_dir or str(cfg.get("runDir") or "/run/rdma-cni")
    return data_dir, run_dir


def observe(paths: NodePaths) -> NodeSnapshot:
    data_dir, run_dir = _dirs(paths)
    errors: list[str] = []
    ports = sysfs.list_ports(paths.sysfs_root)
    gids = {(p.device, p.port): sysfs.read_gids(paths.sysfs_root, p.device, p.port) for p in ports}
    netdevs = sorted({p.netdev for p in ports if p.netdev})
    host_ipv6: dict[str, list[str]] = {}
    host_addrs = _host_addresses(paths.netns, netdevs, errors, host_ipv6)
    state = NodeState(data_dir)
    attachments = state.attachments()
    return NodeSnapshot(
        paths=paths,
        data_dir=data_dir,
        run_dir=run_dir,
        ports=ports,
        gids=gids,
        host_addrs=host_addrs,
        attachments=attachments,
        unreadable_state=state.unreadable(),
        netns_alive={a.container_id: _netns_alive(a) for a in attachments},
        host_record=records.read_host_record(run_dir),
        host_ipv6=host_ipv6,
        skipped=state.skipped_restores(),
        errors=errors,
        device_plugin=observe_device_plugin(
            paths.pod_resources(), run_dir, _resource(paths) or DEFAULT_RESOURCE, paths.kubelet_timeout
        ),
    )


def _resource(paths: NodePaths) -> str:
    """The resource the installed RDMA network consumes (its ``resourceName``), "" if none."""
    name = (delegate_config(paths) or {}).get("resourceName")
    return name if isinstance(name, str) else ""


def _host_addresses(
    netns: str, netdevs: list[str], errors: list[str], ipv6: dict[str, list[str]] | None = None
) -> dict[str, list[str]]:
    """IPv4 CIDRs of each netdev in the node netns (rtnetlink); a missing link is left out.
    ``ipv6`` gets each netdev's movable (global, not kernel-made) IPv6 CIDRs."""
    out: dict[str, list[str]] = {}
    try:
        ns = open_netns(netns) if netns else None
    except (OSError, CniError) as exc:
        errors.append(f"cannot open node netns {netns}: {exc}")
        return out
    try:
        ipr = netlink_in(ns)
        try:
            for name in netdevs:
                link = links.get_link(ipr, name)
                if link is not None:
                    out[name] = [c for c in addresses.live_cidrs(ipr, link.index) if ":" not in c]
                    if ipv6 is not None:
                        ipv6[name] = [
                            addresses.cidr(a)
                            for a in addresses.snapshot(ipr, link.index)
                            if addresses.is_ipv6(a)
                        ]
        finally:
            ipr.close()
    finally:
        if ns is not None:
            ns.close()
    return out


def _netns_alive(rec: AttachmentRecord) -> bool:
    if not rec.netns:
        return False
    inode = netns_inode(rec.netns)
    return inode is not None and (not rec.netns_inode or inode == rec.netns_inode)
