"""GID records under ``runDir`` for other components (NCCL env injection, doctor) to read.

``runDir/gid/<containerID>/<ifname>.json`` says which RDMA device, port and GID index a pod's
interface got; ``runDir/gid/host.json`` keeps the host's RoCE v2 IPv4 index per device/port — the
"unified" index every pod on the node should see. Files are written atomically (``rdma_cni.durable``)
and are world-readable (0644 in 0755 dirs): they hold no secrets and readers need not be root.

Usage::

    write_pod_record("/run/rdma-cni", "abc123", "net1", entry, uverbs="uverbs0")
    remove_pod_records("/run/rdma-cni", "abc123")
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rdma_cni import durable
from rdma_cni.cni.request import validate_container_id, validate_ifname
from rdma_cni.rdma import sysfs
from rdma_cni.rdma.sysfs import GidEntry

log = logging.getLogger(__name__)

FILE_MODE = 0o644
DIR_MODE = 0o755
HOST_RECORD = "host.json"
HOST_LOCK = "host.lock"  # serialises the read-modify-write of host.json (callers hold no node lock)


def gid_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "gid")


def pod_record_path(run_dir: str, container_id: str, ifname: str) -> str:
    """Validated path: a container ID or ifname like ``../x`` never reaches the filesystem."""
    validate_container_id(container_id)
    validate_ifname(ifname)
    return os.path.join(gid_dir(run_dir), container_id, f"{ifname}.json")


def _ensure_dirs(*paths: str) -> None:
    for p in paths:
        if not os.path.isdir(p):
            durable.ensure_dir(p, DIR_MODE)


def pod_record(
    container_id: str, ifname: str, entry: GidEntry | None, uverbs: str | None = None,
    entry6: GidEntry | None = None, mode: str | None = None,
) -> dict[str, Any]:
    """``gidIndex`` is the IPv4 GID's (what NCCL_IB_GID_INDEX names), or the IPv6 one on an
    IPv6-only interface; ``gidIndexIPv6``/``gidIPv6``/``ipv6`` note the IPv6 GID when there is one.
    ``mode`` (``shared``: rdma-ipvlan, the pod's own address and so its own, dynamic index) is
    written when given; a record without it is exclusive mode's (the host's index)."""
    main = entry or entry6
    if main is None:
        raise ValueError("a pod GID record needs an IPv4 or an IPv6 GID")
    out: dict[str, Any] = {
        "containerId": container_id,
        "ifname": ifname,
        "device": main.device,
        "port": main.port,
        "gidIndex": main.index,
        "gid": main.gid,
        "type": main.type,
        "netdev": main.ndev,
        "ipv4": entry.ipv4 if entry else None,
        "uverbs": f"/dev/infiniband/{uverbs}" if uverbs else None,
    }
    if entry6 is not None:
        out.update({"gidIndexIPv6": entry6.index, "gidIPv6": entry6.gid, "ipv6": entry6.gid})
    if mode is not None:
        out["mode"] = mode
    return out


def write_pod_record(
    run_dir: str, container_id: str, ifname: str, entry: GidEntry | None, uverbs: str | None = None,
    entry6: GidEntry | None = None, mode: str | None = None,
) -> str:
    """Write (atomically) the record of one pod interface; returns its path."""
    path = pod_record_path(run_dir, container_id, ifname)
    _ensure_dirs(run_dir, gid_dir(run_dir), os.path.dirname(path))
    body = pod_record(container_id, ifname, entry, uverbs, entry6, mode)
    durable.atomic_write_json(path, body, FILE_MODE, DIR_MODE)
    return path


def read_pod_record(run_dir: str, container_id: str, ifname: str) -> dict[str, Any] | None:
    """The record, or None when missing or unreadable (logged: a torn file is not fatal for DEL)."""
    path = pod_record_path(run_dir, container_id, ifname)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("GID record %s unreadable, treated as absent: %s", path, e)
        return None
    return data if isinstance(data, dict) else None


def remove_pod_records(run_dir: str, container_id: str, ifname: str | None = None) -> list[str]:
    """Remove one interface's record (or all of the container's); idempotent. Returns removed paths."""
    validate_container_id(container_id)
    cdir = os.path.join(gid_dir(run_dir), container_id)
    if ifname is not None:
        names = [os.path.basename(pod_record_path(run_dir, container_id, ifname))]
    else:
        try:
            names = sorted(n for n in os.listdir(cdir) if n.endswith(".json"))
        except FileNotFoundError:
            names = []
    removed = [os.path.join(cdir, n) for n in names if durable.remove(os.path.join(cdir, n))]
    try:
        os.rmdir(cdir)
    except OSError:
        pass  # absent, or still holds another interface's record
    return removed


def list_pod_records(run_dir: str) -> dict[str, list[str]]:
    """container ID -> interface names that have a record (for GC and ``cni-tool state``)."""
    out: dict[str, list[str]] = {}
    try:
        cids = sorted(os.listdir(gid_dir(run_dir)))
    except FileNotFoundError:
        return out
    for cid in cids:
        cdir = os.path.join(gid_dir(run_dir), cid)
        if os.path.isdir(cdir):
            out[cid] = sorted(n[: -len(".json")] for n in os.listdir(cdir) if n.endswith(".json"))
    return out


def read_host_record(run_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(gid_dir(run_dir), HOST_RECORD)) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("host GID record unreadable, rebuilt from sysfs: %s", e)
        return {}
    return data if isinstance(data, dict) else {}


def _previous_ports(record: Mapping[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for p in record.get("ports", []):
        if isinstance(p, dict) and isinstance(p.get("device"), str) and isinstance(p.get("port"), int):
            out[(p["device"], p["port"])] = p
    return out


def _global_ipv6(g: GidEntry) -> bool:
    return g.ipv4 is None and not ipaddress.IPv6Address(g.gid).is_link_local


def _host_ipv6(
    port: sysfs.RdmaPort, gids: list[GidEntry], previous: dict[str, Any] | None, host_ipv6: list[str] | None
) -> dict[str, Any]:
    """The IPv6 side of a port's host record: the RoCE v2 GID of the bond's first global IPv6 (in
    the order given: add order, the one ADD records), else the lowest such GID."""
    mine = [g for g in gids if g.type == sysfs.ROCE_V2 and g.ndev == port.netdev and _global_ipv6(g)]
    if host_ipv6 is not None:
        by_gid = {g.gid: g for g in reversed(mine)}
        mine = [by_gid[t] for t in (ipaddress.IPv6Address(ip).compressed for ip in host_ipv6) if t in by_gid]
    if mine:
        return {"gidIndexIPv6": mine[0].index, "ipv6": mine[0].gid}
    if previous and isinstance(previous.get("gidIndexIPv6"), int):  # lent to a pod, as for IPv4
        return {"gidIndexIPv6": previous["gidIndexIPv6"], "ipv6": previous.get("ipv6")}
    return {}


def _host_port(
    port: sysfs.RdmaPort, gids: list[GidEntry], previous: dict[str, Any] | None, host_ipv4: set[str] | None,
    host_ipv6: list[str] | None = None,
) -> dict[str, Any]:
    mine = [g for g in gids if g.type == sysfs.ROCE_V2 and g.ipv4 and g.ndev == port.netdev]
    if host_ipv4 is not None:  # a pod interface named like the bond (podIfName: master) is not the host
        mine = [g for g in mine if g.ipv4 in host_ipv4]
    rec: dict[str, Any] = {
        "device": port.device,
        "port": port.port,
        "netdev": port.netdev,
        "uverbs": port.uverbs_path,
        "gids": [{"index": g.index, "gid": g.gid, "ipv4": g.ipv4} for g in mine],
    }
    if mine:
        rec["gidIndex"], rec["ipv4"], rec["present"] = mine[0].index, mine[0].ipv4, True
    elif previous and isinstance(previous.get("gidIndex"), int):
        # The IP is in a pod now (same index, by design): the host's index is still the one to use.
        rec["gidIndex"], rec["ipv4"], rec["present"] = previous["gidIndex"], previous.get("ipv4"), False
    else:
        rec["gidIndex"], rec["ipv4"], rec["present"] = None, None, False
    rec.update(_host_ipv6(port, gids, previous, host_ipv6))
    return rec


def _still_current(
    sysfs_root: str, port: sysfs.RdmaPort, prev: dict[str, Any] | None, host_ipv4: set[str] | None,
    host_ipv6: list[str] | None,
) -> bool:
    """Would a scan of the port's table give ``prev`` again? Yes when the bond holds the addresses
    ``prev`` recorded and each recorded GID is still in its slot. Why not always scan: a scan reads
    every slot (256 per mlx5 port, 1024 on rxe) and every ADD, DEL and GC refreshes every port, so on
    an 8-bond node a verb read ~4000 sysfs files for the one or two bonds it changed (under qemu's
    emulation that was 40 % of an ADD's CPU: profiled)."""
    if prev is None or host_ipv4 is None or host_ipv6 is None:
        return False
    if prev.get("netdev") != port.netdev or prev.get("uverbs") != port.uverbs_path:
        return False
    gids = prev.get("gids")
    if not isinstance(gids, list) or {g.get("ipv4") for g in gids if isinstance(g, dict)} != host_ipv4:
        return False
    if not all(isinstance(g, dict) and _in_slot(sysfs_root, port, g.get("index"), g.get("gid"))
               for g in gids):
        return False
    addrs6 = [ipaddress.IPv6Address(ip) for ip in host_ipv6]
    first = next((a.compressed for a in addrs6 if not a.is_link_local), None)
    if first is None:  # no global IPv6 on the host: a scan keeps prev's IPv6 part as it is
        return True
    return prev.get("ipv6") == first and _in_slot(sysfs_root, port, prev.get("gidIndexIPv6"), first)


def _in_slot(sysfs_root: str, port: sysfs.RdmaPort, index: Any, gid: Any) -> bool:
    """The host's RoCE v2 GID ``gid`` is still at ``index`` of the port's table."""
    if not isinstance(index, int) or not isinstance(gid, str):
        return False
    entry = sysfs.gid_at(sysfs_root, port.device, port.port, index)
    return (
        entry is not None and entry.gid == gid and entry.type == sysfs.ROCE_V2 and entry.ndev == port.netdev
    )


def update_host_record(
    run_dir: str, sysfs_root: str, host_ipv4: Mapping[str, Iterable[str]] | None = None,
    host_ipv6: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, Any]:
    """Rewrite ``host.json`` from the live GID tables; keeps the last index of an IP that moved to a pod.

    ``ndevs/N`` only holds a name, and a pod interface may be named like its bond (``podIfName:
    master``), so sysfs alone cannot tell the host's entry from the pod's. ``host_ipv4`` (netdev ->
    the IPv4 addresses it holds now, from rtnetlink) settles it; without it a same-named pod
    interface counts as the host's (same index either way, by design; only ``present`` differs).
    ``host_ipv6`` (netdev -> its global IPv6 addresses) does the same for ``gidIndexIPv6``.
    The record follows what the bonds hold now: after a re-addressed bond kept its new address,
    its index is the new address's.
    """
    _ensure_dirs(run_dir, gid_dir(run_dir))
    fd = os.open(os.path.join(gid_dir(run_dir), HOST_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        # Its own lock, not the node's: concurrent ADDs refresh it outside the node lock, and each
        # keeps the last index of IPs the others moved (a lost update would drop one).
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = read_host_record(run_dir)
        previous = _previous_ports(before)
        ports = []
        for port in sysfs.list_ports(sysfs_root):
            mine = None if host_ipv4 is None else set(host_ipv4.get(port.netdev or "", ()))
            mine6 = None if host_ipv6 is None else list(host_ipv6.get(port.netdev or "", ()))
            prev = previous.get((port.device, port.port))
            if _still_current(sysfs_root, port, prev, mine, mine6):
                ports.append(prev)
                continue
            gids = sysfs.read_gids(sysfs_root, port.device, port.port)
            ports.append(_host_port(port, gids, prev, mine, mine6))
        record: dict[str, Any] = {"version": 1, "ports": ports}
        if record != before:  # a verb on one bond leaves the others' entries, and the file, as they were
            path = os.path.join(gid_dir(run_dir), HOST_RECORD)
            durable.atomic_write_json(path, record, FILE_MODE, DIR_MODE)
    finally:
        os.close(fd)
    return record
