"""The pod annotation ``k8s.v1.cni.cncf.io/network-status``, written the way Multus writes it.

Tools that show a pod's secondary networks (``kubectl get pod -o yaml``, dashboards, operators
built on the NPWG client library) read this annotation, so each entry is built by Multus's rules,
not by ours: one entry per pod interface of a network's result (a result with one interface gives
one entry holding all its IPs; with several, IPs follow their ``interface`` index and unindexed ones
go to the last entry), ``default`` only on the default network (its interface with the first
gateway-bearing IP, else its first pod interface), ``gateway`` = the gateways of default routes,
``dns`` always present, and the text is the entries each indented by four spaces, joined by ``,`` in
``[...]``. Our addition is ``device-info`` on each RDMA bond interface (NPWG Device Information
``pci`` with ``rdma-device``, plus an ``rdma`` object with port and GID index — extra keys the NPWG
client ignores), read from the GID records rdma-macvlan leaves in its ``runDir``.

Writing it is best effort: one PATCH bounded by the API timeouts; a failure is logged and counted
(``<cacheDir>/stats/network-status.json``), never turned into a failed ADD — the pod's network works.

DEL sets it to ``[]``: what the NPWG client's ``SetNetworkStatus`` writes for no statuses, the call
Multus's DEL made until its PR #1173 (2023) stopped writing on DEL, because the pod may be gone
and a StatefulSet's new pod of the same name may already own the annotation. Both are handled here
instead: a pod gone is not a failure, and the PATCH carries the pod's UID, so it lands on no other
pod. Same best effort, counted in the same file, never a failed DEL.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rdma_cni import durable
from rdma_cni.cni.errors import CniError
from rdma_cni.cni.result import Result, Route
from rdma_cni.devices.pci import address_of
from rdma_cni.rdma import records

log = logging.getLogger("rdma_cni.multus")

ANNOTATION = "k8s.v1.cni.cncf.io/network-status"
DEVICE_INFO_VERSION = "1.0.0"
STATS_FILE = os.path.join("stats", "network-status.json")
CLEARED = "[]"  # no networks: what the NPWG client writes for an empty status list

# (interface name) -> device-info object or None
DeviceInfoFor = Callable[[str], dict[str, Any] | None]


def network_statuses(
    name: str, result: Result, is_default: bool, device_info: DeviceInfoFor
) -> list[dict[str, Any]]:
    """The entries Multus would write for one network's ADD result."""
    gateways = [_go_ip(r.gw) for r in result.routes if _is_default_route(r)]
    dns = _dns(result)
    if len(result.interfaces) == 1:
        entry = _entry(name, is_default, dns, gateways)
        sandboxed = [i for i in result.interfaces if i.sandbox]
        if sandboxed:
            _set_interface(entry, sandboxed[-1].name, sandboxed[-1].mac, sandboxed[-1].mtu, device_info)
        ips = [_ip(c.address) for c in result.ips]
        if ips:
            entry["ips"] = ips
        return [_ordered(entry)]
    gateway_iface = next((c.interface for c in result.ips if c.gateway and c.interface is not None), -1)
    entries: list[dict[str, Any]] = []
    by_index: dict[int, dict[str, Any]] = {}
    marked = False
    for index, iface in enumerate(result.interfaces):
        if not iface.sandbox:
            continue
        default_here = False
        if is_default and not marked and (index == gateway_iface or gateway_iface == -1):
            default_here = marked = True
        entry = _entry(name, default_here, dns, gateways)
        _set_interface(entry, iface.name, iface.mac, iface.mtu, device_info)
        entries.append(entry)
        by_index[index] = entry
    for cfg in result.ips:
        target = (
            by_index.get(cfg.interface) if cfg.interface is not None else (entries[-1] if entries else None)
        )
        if target is not None:
            target.setdefault("ips", []).append(_ip(cfg.address))
    return [_ordered(e) for e in entries]


def render(entries: Sequence[Mapping[str, Any]]) -> str:
    """The annotation's text, laid out as Multus lays it out (each entry indented, joined by ``,``)."""
    return "[" + ",".join(json.dumps(e, indent=4) for e in entries) + "]"


def rdma_device_info(delegate_config: bytes, container_id: str) -> DeviceInfoFor:
    """device-info for the interfaces rdma-macvlan or rdma-ipvlan made in this attachment, from their
    GID records (shared mode's carry the pod address's own index: what an older NCCL reads)."""
    run_dir, sysfs_root = _macvlan_dirs(delegate_config)

    def lookup(ifname: str) -> dict[str, Any] | None:
        if run_dir is None:
            return None
        try:
            record = records.read_pod_record(run_dir, container_id, ifname)
        except CniError:
            return None
        if not record or not isinstance(record.get("device"), str):
            return None
        device = record["device"]
        pci: dict[str, str] = {"rdma-device": device}
        address = address_of(sysfs_root, device)
        if address:
            pci = {"pci-address": address, "rdma-device": device}
        rdma = {k: record[v] for k, v in (("port", "port"), ("gid-index", "gidIndex"), ("gid", "gid"))
                if record.get(v) is not None}  # fmt: skip
        return {"type": "pci", "version": DEVICE_INFO_VERSION, "pci": pci, "rdma": {"device": device, **rdma}}

    return lookup


def publish(patch: Callable[[dict[str, str]], None], text: str, pod: str, cache_dir: str) -> bool:
    """PATCH the annotation; on failure log and count, never raise (the ADD has succeeded)."""
    try:
        patch({ANNOTATION: text})
    except (CniError, OSError) as exc:
        msg = exc.msg if isinstance(exc, CniError) else f"{type(exc).__name__}: {exc}"
        log.error("pod %s: %s not written (the pod's networks are up): %s", pod, ANNOTATION, msg)
        _count_failure(cache_dir, pod, msg)
        return False
    log.info("pod %s: %s written", pod, ANNOTATION)
    return True


def clear(patch: Callable[[dict[str, str]], bool], pod: str, cache_dir: str) -> bool:
    """Set the annotation to ``[]`` on DEL; ``patch`` answers False when the pod is gone (or its
    name now belongs to a new pod). A failure is logged and counted, never raised: the pod's
    networks are deleted whatever the API server does."""
    try:
        found = patch({ANNOTATION: CLEARED})
    except Exception as exc:  # noqa: BLE001 - an escape would fail every retry of this DEL: a stuck pod
        msg = exc.msg if isinstance(exc, CniError) else f"{type(exc).__name__}: {exc}"
        log.warning("pod %s: %s not cleared: %s (its networks are deleted anyway)", pod, ANNOTATION, msg)
        _count_failure(cache_dir, pod, msg)
        return False
    if found:
        log.info("pod %s: %s cleared", pod, ANNOTATION)
    else:
        log.debug("pod %s: %s not cleared: the pod is gone, or a new pod has its name", pod, ANNOTATION)
    return found


def failures(cache_dir: str) -> dict[str, Any]:
    """What :func:`publish` and :func:`clear` counted:
    ``{"failures": n, "lastError": ..., "lastPod": ..., "updated": t}``."""
    try:
        with open(os.path.join(cache_dir, STATS_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {"failures": 0}
    return data if isinstance(data, dict) and isinstance(data.get("failures"), int) else {"failures": 0}


def _count_failure(cache_dir: str, pod: str, msg: str) -> None:
    stats = failures(cache_dir)
    stats = {"failures": stats["failures"] + 1, "lastError": msg, "lastPod": pod, "updated": time.time()}
    try:
        path = os.path.join(cache_dir, STATS_FILE)
        durable.ensure_dir(cache_dir, 0o700)
        durable.ensure_dir(os.path.dirname(path), 0o700)
        durable.atomic_write_json(path, stats, 0o600, 0o700, sync=False)
    except OSError as exc:
        log.warning("cannot count the network-status failure in %s: %s", cache_dir, exc)


def _entry(name: str, is_default: bool, dns: dict[str, Any], gateways: list[str]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "dns": dns}
    if is_default:
        entry["default"] = True
    if gateways:
        entry["gateway"] = list(gateways)
    return entry


def _set_interface(entry: dict[str, Any], name: str, mac: str, mtu: int, device_info: DeviceInfoFor) -> None:
    entry["interface"] = name
    if mac:
        entry["mac"] = mac
    if mtu:
        entry["mtu"] = mtu
    info = device_info(name)
    if info:
        entry["device-info"] = info


_ORDER = ("name", "interface", "ips", "mac", "mtu", "default", "dns", "device-info", "gateway")


def _ordered(entry: Mapping[str, Any]) -> dict[str, Any]:
    """Keys in the NPWG client's struct order, so the text reads like Multus's."""
    return {k: entry[k] for k in _ORDER if k in entry}


def _dns(result: Result) -> dict[str, Any]:
    d = result.dns
    out: dict[str, Any] = {}
    if d.nameservers:
        out["nameservers"] = list(d.nameservers)
    if d.domain:
        out["domain"] = d.domain
    if d.search:
        out["search"] = list(d.search)
    if d.options:
        out["options"] = list(d.options)
    return out


def _is_default_route(route: Route) -> bool:
    """Multus's test: the destination address is all zeros, whatever its prefix length."""
    try:
        return ipaddress.ip_interface(route.dst).ip.packed.strip(b"\0") == b""
    except ValueError:
        return False


def _go_ip(text: str) -> str:
    """Go's ``net.IP.String()``: a missing gateway prints as ``<nil>`` in what Multus writes."""
    return str(ipaddress.ip_address(text)) if text else "<nil>"


def _ip(cidr: str) -> str:
    return str(ipaddress.ip_interface(cidr).ip)


def _macvlan_dirs(config: bytes) -> tuple[str | None, str]:
    """rdma-macvlan's (or rdma-ipvlan's) ``runDir`` and ``sysfsRoot`` in a network's config; (None, ...)
    if it has none."""
    try:
        raw = json.loads(config)
    except ValueError:
        return None, "/sys"
    plugins = raw.get("plugins") if isinstance(raw, dict) else None
    for plugin in plugins if isinstance(plugins, list) else [raw]:
        if isinstance(plugin, dict) and plugin.get("type") in ("rdma-macvlan", "rdma-ipvlan"):
            run_dir = plugin.get("runDir")
            sysfs_root = plugin.get("sysfsRoot")
            return (
                run_dir if isinstance(run_dir, str) and run_dir else "/run/rdma-cni",
                sysfs_root if isinstance(sysfs_root, str) and sysfs_root else "/sys",
            )
    return None, "/sys"
