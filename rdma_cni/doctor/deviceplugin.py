"""The device plugin as the doctor judges it: registered, its devices healthy, kubelet agreeing, and
whether the bonds whose IPs the pods hold are the RDMA devices kubelet mounted in them.

    for a in bond_allocations(view, bonds, pins, pod_of):   # per bond: kubelet's pod vs the IP's pod
        print(a.bond, a.allocated_to, a.held_by, a.verdict)

What it judges was read once by :func:`rdma_cni.doctor.node.observe` (the status file and
kubelet's PodResources: :mod:`rdma_cni.doctor.plugin_view`); this module only reads the snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rdma_cni.doctor.findings import FAIL, OK, SKIP, WARN, Finding
from rdma_cni.doctor.node import NodeSnapshot, pod_names
from rdma_cni.doctor.plugin_view import (  # re-exported: callers knew them here
    ABSENT,
    DEFAULT_RESOURCE,
    STATUS_FILE,
    DevicePluginView,
    observe_device_plugin,
)

__all__ = ["ABSENT", "DEFAULT_RESOURCE", "STATUS_FILE", "DevicePluginView", "observe_device_plugin"]


# ---------------------------------------------------------------- cni-tool doctor


def check_device_plugin(view: DevicePluginView | None) -> list[Finding]:
    """Registered? How many devices, how many healthy, each one's NUMA node; kubelet agrees?"""
    if view is None:
        return []
    if view.dra_registration:
        return [_served_by_dra(view)]
    if view.status is None:
        return [_without_status(view)]
    st = view.status
    if view.status_stale:
        return [_stale(view, st)]
    if isinstance(st.get("pools"), list):
        return check_pools(view, [p for p in st["pools"] if isinstance(p, dict)])
    out = [_registration(view, st)]
    devices = [d for d in st.get("devices", []) if isinstance(d, dict)]
    healthy = [d for d in devices if d.get("healthy") is True]
    if not devices:
        out.append(
            Finding(
                "device-plugin",
                FAIL,
                f"{view.resource}: 0 devices advertised, RDMA pods stay Pending",
                "no RDMA bond found: see the rdma-device lines above and `masters` in tke-rdma-macvlan.conf",
            )
        )
    else:
        status = OK if len(healthy) == len(devices) else WARN
        out.append(
            Finding(
                "device-plugin",
                status,
                f"{view.resource}: {len(devices)} devices, {len(healthy)} healthy",
                "the unhealthy devices below say why; health recovers when the cause goes away",
            )
        )
    for d in devices:
        out.append(_device_line(d))
    out += _kubelet_agrees(view, {str(d.get("id")) for d in healthy})
    return out


def check_pools(view: DevicePluginView, pools: list[dict[str, Any]]) -> list[Finding]:
    """A plugin serving pools: per pool its resource, mode, count, members and health, and whether
    kubelet has as many allocatable as the pool says. One dead HCA of a live shared pool is a WARN
    (the pool still works, with fewer HCAs); a pool with none usable is a FAIL."""
    st = view.status or {}
    out = [
        Finding(
            "device-plugin",
            OK,
            f"rdma-device-plugin (pid {st.get('pid', '?')}) serves {len(pools)} "
            f"pool(s): {', '.join(str(p.get('resourceName')) for p in pools)}",
        )
    ]
    for pool in pools:
        out += _pool_lines(view, pool)
    return out


def _pool_lines(view: DevicePluginView, pool: dict[str, Any]) -> list[Finding]:
    name = str(pool.get("resourceName", "?"))
    check = f"device-plugin {name}"
    members = [m for m in pool.get("hcas", pool.get("devices", [])) if isinstance(m, dict)]
    dead = [m for m in members if m.get("healthy") is not True]
    what = "HCAs" if "hcas" in pool else "bonds"
    ids = (
        ", ".join(f"{m.get('id')}{'' if m.get('healthy') is True else ' (UNHEALTHY)'}" for m in members)
        or "none"
    )
    head = (
        f"{name}: {pool.get('mode', '?')}, {pool.get('count', '?')} devices, {what} {ids}, "
        f"{'healthy' if pool.get('healthy') else 'UNHEALTHY'}, {pool.get('allocations', 0)} allocations"
    )
    out = []
    if pool.get("registered") is not True:
        out.append(
            Finding(
                check,
                FAIL,
                f"{head}; NOT registered with kubelet",
                "is kubelet running? See the plugin's log for this resource",
            )
        )
    elif not members:
        out.append(
            Finding(
                check,
                WARN,
                f"{head}: it selects nothing, pods asking for {name} stay Pending",
                f"check the pool's selectors ({pool.get('selection', '?')}) against `cni-tool gids`",
            )
        )
    elif not pool.get("healthy"):
        out.append(
            Finding(
                check,
                FAIL,
                f"{head}: no member is usable, pods asking for {name} stay Pending",
                "the members below say why",
            )
        )
    else:
        out.append(
            Finding(
                check,
                WARN if dead else OK,
                head,
                "the pool works with fewer members; fix the ones below" if dead else "",
            )
        )
    for m in dead:
        out.append(
            Finding(
                f"{check} {m.get('id')}",
                WARN,
                f"UNHEALTHY: {m.get('reason') or 'no reason given'}",
                "fix the cause named; kubelet gets it back within a second once it is gone",
            )
        )
    out += _pool_kubelet(view, name, pool, members)
    return out


def _pool_kubelet(
    view: DevicePluginView, name: str, pool: dict[str, Any], members: list[dict[str, Any]]
) -> list[Finding]:
    if view.kubelet_error or view.allocatable_by is None:
        return []
    if pool.get("mode") == "shared":
        want = int(pool.get("count") or 0) if pool.get("healthy") and members else 0
    else:
        want = sum(1 for m in members if m.get("healthy") is True)
    have = view.allocatable_by.get(name, 0)
    if have == want:
        return [
            Finding(f"device-plugin {name} kubelet", OK, f"kubelet: {have} allocatable, as the plugin says")
        ]
    return [
        Finding(
            f"device-plugin {name} kubelet",
            WARN,
            f"kubelet has {have} {name} allocatable, the plugin says {want}",
            "kubelet has not got the plugin's latest list: check again in a few seconds; "
            "if it stays, restart rdma-device-plugin",
        )
    ]


def _served_by_dra(view: DevicePluginView) -> Finding:
    """The DaemonSet's DRA variant: rdma-dra-driver serves the bonds and no device plugin should.
    A device plugin's status left from before the switch is stale, not a failure; one that still
    runs and is registered makes two sources of one resource on one node."""
    st = view.status
    if st is not None and not view.status_stale and st.get("registered") is True:
        return Finding(
            "device-plugin",
            WARN,
            f"both rdma-device-plugin (pid {st.get('pid', '?')}) and rdma-dra-driver "
            f"({view.dra_registration}) serve RDMA devices on this node",
            "one node serves the resource from one of them: apply only one of conf/k8s/rdma-cni.yaml "
            "and conf/k8s/dra/",
        )
    left = f"; the device plugin's last status (pid {st.get('pid', '?')}) is stale" if st else ""
    return Finding(
        "device-plugin",
        OK,
        f"RDMA devices are served through DRA by rdma-dra-driver ({view.dra_registration}){left}",
    )


def _stale(view: DevicePluginView, st: dict[str, Any]) -> Finding:
    return Finding(
        "device-plugin",
        FAIL,
        f"rdma-device-plugin (pid {st.get('pid', '?')}) is not running: {view.status_path} is what it "
        f"last wrote; kubelet gets no {view.resource} from it",
        "see the DaemonSet's rdma-device-plugin container (kubectl -n kube-system describe pod ...)",
    )


def _without_status(view: DevicePluginView) -> Finding:
    if view.status_error != ABSENT:
        return Finding(
            "device-plugin",
            FAIL,
            view.status_error,
            "the plugin rewrites it atomically on every change: restart rdma-device-plugin",
        )
    if view.allocatable:
        return Finding(
            "device-plugin",
            OK,
            f"{view.resource}: kubelet has {len(view.allocatable)} allocatable "
            f"(served by a device plugin without a status file at {view.status_path})",
        )
    if not view.kubelet_error:
        return Finding(
            "device-plugin",
            WARN,
            f"no device plugin advertises {view.resource} to kubelet: pods asking for it stay Pending",
            "run rdma-device-plugin (the DaemonSet's device-plugin container)",
        )
    return Finding(
        "device-plugin",
        SKIP,
        f"no device plugin status ({view.status_path}) and no kubelet PodResources ({view.socket}) here",
    )


def _registration(view: DevicePluginView, st: dict[str, Any]) -> Finding:
    who = f"rdma-device-plugin (pid {st.get('pid', '?')})"
    if st.get("registered") is True:
        return Finding(
            "device-plugin",
            OK,
            f"{who} registered {view.resource} with kubelet "
            f"(endpoint {st.get('endpoint', '?')}, {st.get('registrations', '?')} registrations, "
            f"{st.get('allocations', 0)} allocations)",
        )
    return Finding(
        "device-plugin",
        FAIL,
        f"{who} is not registered with kubelet ({st.get('registrations', 0)} "
        "registrations so far): RDMA pods cannot be scheduled here",
        "is kubelet running? Its kubelet.sock must be in the plugin's --device-plugin-dir "
        "(/var/lib/kubelet/device-plugins whatever kubelet's --root-dir); see the plugin's log",
    )


def _device_line(d: dict[str, Any]) -> Finding:
    numa = d.get("numa")
    where = f"{d.get('netdev') or '?'}, NUMA {numa if isinstance(numa, int) and numa >= 0 else 'none'}"
    name = f"device-plugin {d.get('id', '?')}"
    if d.get("healthy") is True:
        return Finding(name, OK, f"{where}, healthy")
    return Finding(
        name,
        WARN,
        f"{where}, UNHEALTHY: {d.get('reason') or 'no reason given'}",
        "fix the cause named (port, bond, uverbs node, bond address); kubelet gets it back "
        "within a second once it is gone",
    )


def _kubelet_agrees(view: DevicePluginView, healthy: set[str]) -> list[Finding]:
    if view.kubelet_error == ABSENT:
        return [Finding("device-plugin kubelet", SKIP, f"no kubelet PodResources socket at {view.socket}")]
    if view.kubelet_error:
        return [
            Finding(
                "device-plugin kubelet",
                WARN,
                view.kubelet_error,
                "pass --pod-resources-dir (kubelet's <root-dir>/pod-resources) if kubelet's root moved",
            )
        ]
    kubelet = {d for d, _ in view.allocatable or []}
    if kubelet == healthy:
        numa = ", ".join(f"{d}={','.join(map(str, n)) or '-'}" for d, n in sorted(view.allocatable or []))
        return [
            Finding(
                "device-plugin kubelet",
                OK,
                f"kubelet: {len(kubelet)} allocatable, as the plugin says (NUMA {numa or '-'})",
            )
        ]
    return [
        Finding(
            "device-plugin kubelet",
            WARN,
            f"kubelet has {sorted(kubelet) or 'none'} allocatable, the plugin's healthy devices are "
            f"{sorted(healthy) or 'none'}",
            "kubelet has not got the plugin's latest list (restarted just now?): check again in a few "
            "seconds; if it stays, restart rdma-device-plugin",
        )
    ]


# ---------------------------------------------------------------- kubelet's pod vs the IP's pod


@dataclass(frozen=True)
class BondAllocation:
    bond: str
    device: str  # the ID kubelet uses for it
    allocated_to: str  # "namespace/name" kubelet gave the device to, "" = nobody
    held_by: str  # "namespace/name" whose netns holds the bond's IP, "container <id>" if unnamed, ""
    verdict: str  # OK / WARN / FAIL
    detail: str
    fix: str = ""


MISMATCH_FIX = (
    "the pod's RDMA interfaces differ from the RDMA devices kubelet mounted in it: delete the pod that "
    "holds the bond (its DEL gives the IP back) and let it be recreated; rdma-multus must read "
    "kubelet's PodResources (podResourcesDir = kubelet's <root-dir>/pod-resources)"
)


def bond_allocations(
    view: DevicePluginView | None,
    bonds: dict[str, str],
    pins: dict[str, str],
    pod_of: Callable[[str], str],
) -> list[BondAllocation]:
    """Per bond (``bonds``: netdev -> RDMA device) whose ID kubelet knows: the pod kubelet allocated
    it to next to the pod holding its IP (``pins``: bond -> container ID; ``pod_of``: container ID
    -> "ns/name" or ""). Bonds kubelet knows by no ID (a shared plugin's opaque "0", "1"…) are left
    out: nothing says which bond such a device is."""
    if view is None or view.pods is None:
        return []
    known, allocated = view.known_ids(), view.allocated()
    out = []
    for bond, device in sorted(bonds.items()):
        key = device if device in known else bond if bond in known else ""
        if not key:
            continue
        to = allocated.get(key, "")
        cid = pins.get(bond, "")
        held = (pod_of(cid) or f"container {cid[:12]}") if cid else ""
        out.append(_judge(bond, key, to, held, bool(cid and pod_of(cid))))
    return out


def _judge(bond: str, key: str, to: str, held: str, named: bool) -> BondAllocation:
    what = f"{bond} ({key})"
    if not to and not held:
        return BondAllocation(bond, key, to, held, OK, f"{what}: free")
    if held and not named:
        return BondAllocation(
            bond,
            key,
            to,
            held,
            WARN,
            f"{what}: kubelet gave it to {to or 'no pod'}, its IP is held by {held} "
            "whose pod is not recorded",
            "`cni-tool state` lists the container's netns",
        )
    if to == held:
        return BondAllocation(bond, key, to, held, OK, f"{what}: kubelet gave it to {to}, which holds its IP")
    if held:
        return BondAllocation(
            bond,
            key,
            to,
            held,
            FAIL,
            f"{what}: its IP is held by pod {held} but kubelet gave the device to {to or 'no pod'}",
            MISMATCH_FIX,
        )
    return BondAllocation(
        bond,
        key,
        to,
        held,
        WARN,
        f"{what}: kubelet gave it to {to}, but no pod holds its IP: {to} has no RDMA interface on it",
        f"if {to} should have RDMA: its tke.cloud.tencent.com/networks annotation must name "
        "the RDMA network (tke-rdma-macvlan); recreate the pod",
    )


def snapshot_allocations(snap: NodeSnapshot) -> list[BondAllocation]:
    """:func:`bond_allocations` of what ``observe`` read (pod names from the libcni caches)."""
    bonds = {p.netdev: p.device for p in snap.ports if p.netdev}
    pins = {b.bond: rec.container_id for rec in snap.attachments for b in rec.bonds}
    names: dict[str, str] = {}

    def pod_of(cid: str) -> str:
        if cid not in names:
            names[cid] = pod_names(snap.paths.results_dirs, cid)
        return names[cid]

    return bond_allocations(snap.device_plugin, bonds, pins, pod_of)


def _shared_resource(view: DevicePluginView) -> bool:
    """The resource is served by a shared pool of this plugin (its status file says so)."""
    pools = (view.status or {}).get("pools", [])
    return any(
        isinstance(p, dict) and p.get("resourceName") == view.resource and p.get("mode") == "shared"
        for p in pools
        if isinstance(pools, list)
    )


def pods_without_rdma(snap: NodeSnapshot) -> list[BondAllocation]:
    """Pods kubelet gave devices of the resource whose IDs name no bond (a shared plugin's "0", "1"…)
    and that hold no bond at all: their annotation names no RDMA network (or their ADD has not run).
    Bond-named IDs are judged per bond by :func:`snapshot_allocations`."""
    view = snap.device_plugin
    if view is None or view.pods is None or _shared_resource(view):
        return []  # a shared pool's pods hold no bond of rdma-macvlan's (ipvlan, or hostNetwork)
    bond_ids = {p.device for p in snap.ports} | {p.netdev for p in snap.ports if p.netdev}
    holders = {pod_names(snap.paths.results_dirs, rec.container_id) for rec in snap.attachments}
    out = []
    for (ns, name), devices in sorted(view.pods.items()):
        ids = devices.get(view.resource, [])
        pod = f"{ns}/{name}"
        if ids and not set(ids) & bond_ids and pod not in holders:
            out.append(BondAllocation(
                "", ",".join(ids), pod, "", WARN,
                f"pod {pod} holds {len(ids)} {view.resource} device(s) ({', '.join(ids)}) but no bond: it "
                "has no RDMA interface",
                "if it should: its tke.cloud.tencent.com/networks annotation must name the RDMA network "
                "(tke-rdma-macvlan); recreate the pod",
            ))  # fmt: skip
    return out


def check_plugin(snap: NodeSnapshot) -> list[Finding]:
    return check_device_plugin(snap.device_plugin)


def check_allocations(snap: NodeSnapshot) -> list[Finding]:
    out = [Finding(f"allocation {a.bond}", a.verdict, a.detail, a.fix) for a in snapshot_allocations(snap)]
    out += [
        Finding(f"allocation {a.allocated_to}", a.verdict, a.detail, a.fix) for a in pods_without_rdma(snap)
    ]
    return out
