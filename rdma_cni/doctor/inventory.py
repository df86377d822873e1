"""Who holds what on this node, and what the host is missing right now (``cni-tool state``).

An attachment (container, ifname) pins bonds; while its pod netns lives, the bonds' addresses are
*lent* to it. When that netns is gone and no DEL came, the addresses are *missing* from the host
until DEL or GC gives them back. The pod's namespace/name is the record's (the CNI_ARGS the
runtime passed ADD), or for records written before ADD kept it, the runtime's libcni result cache's
(its ``cniArgs``). A bond whose routes went to a pod table of their own (the pod already routed
one of its prefixes: :mod:`rdma_cni.net.pod_routing`) shows that table and the ``from`` rules
ADD put in the pod, so ``ip rule`` in the pod can be read against them.

    inv = inventory(observe(NodePaths()))
    print(render_inventory(inv))
"""

from __future__ import annotations

import json
from typing import Any

from rdma_cni.attachments import AttachmentRecord, BondRecord, bond_drift
from rdma_cni.doctor.deviceplugin import pods_without_rdma, snapshot_allocations
from rdma_cni.doctor.node import NodeSnapshot, pod_names
from rdma_cni.doctor.plugin_view import ABSENT, DevicePluginView
from rdma_cni.net.addresses import cidr
from rdma_cni.net.rtnl import attr


def _addresses(rec: AttachmentRecord, bond: str) -> list[str]:
    return [cidr(a) for b in rec.bonds if b.bond == bond for a in b.addresses]


def _pod_rules(b: BondRecord) -> list[dict[str, Any]]:
    """The ``from <address> lookup <table>`` rules ADD created in the pod for a bond whose routes
    went to a table of their own (a rule the pod already had is not ours and not recorded)."""
    return [{"priority": attr(r, "FRA_PRIORITY"), "from": attr(r, "FRA_SRC"),
             "table": attr(r, "FRA_TABLE", r.get("table"))} for r in b.pod_rules]


def _attachment(snap: NodeSnapshot, rec: AttachmentRecord) -> dict[str, Any]:
    alive = snap.netns_alive.get(rec.container_id, False)
    return {
        "containerId": rec.container_id,
        "ifname": rec.ifname,
        "pod": f"{rec.pod_namespace}/{rec.pod_name}" if rec.pod_name
        else pod_names(snap.paths.results_dirs, rec.container_id),
        "network": rec.network,
        "netns": rec.netns,
        "netnsAlive": alive,
        "phase": rec.phase,
        "bonds": [
            {
                "bond": b.bond,
                "podIfname": b.pod_ifname,
                "addresses": _addresses(rec, b.bond),
                "rdma": b.rdma,
                "podTable": b.pod_table,  # None: the bond's routes are in the pod's main table
                "podRules": _pod_rules(b),
            }
            for b in rec.bonds
        ],
    }


def _missing(snap: NodeSnapshot) -> list[dict[str, Any]]:
    """Addresses a bond should have on the host now but does not."""
    out = []
    for rec in snap.attachments:
        if snap.netns_alive.get(rec.container_id, False):
            continue  # lent to a live pod: not missing
        for b in rec.bonds:
            live = set(snap.host_addrs.get(b.bond, []))
            lost = [c for c in _addresses(rec, b.bond) if c not in live]
            if not lost:
                continue
            drift = bond_drift(b, snap.host_addrs.get(b.bond, []) + snap.host_ipv6.get(b.bond, []))
            if drift.readdressed:
                why = (f"pinned to container {rec.container_id} whose netns is gone, but the bond was "
                       f"re-addressed ({', '.join(drift.current)}): `cni-tool gc` keeps it, drops the record")
            else:
                why = f"pinned to container {rec.container_id} whose netns is gone; `cni-tool gc` restores it"
            out.append({"bond": b.bond, "addresses": lost, "reason": why})
    pinned = {b.bond for rec in snap.attachments for b in rec.bonds}
    for netdev in sorted({p.netdev for p in snap.ports if p.netdev}):
        if netdev in pinned or netdev not in snap.host_addrs:
            continue
        if not snap.host_addrs[netdev]:
            last = _last_known(snap, netdev)
            out.append(
                {
                    "bond": netdev,
                    "addresses": [last] if last else [],
                    "reason": "no IPv4 address and no attachment holds it",
                }
            )
    return out


def _last_known(snap: NodeSnapshot, netdev: str) -> str:
    for port in snap.host_record.get("ports", []):
        if isinstance(port, dict) and port.get("netdev") == netdev and port.get("ipv4"):
            return str(port["ipv4"])
    return ""


def inventory(snap: NodeSnapshot) -> dict[str, Any]:
    pins = {b.bond: rec.container_id for rec in snap.attachments for b in rec.bonds}
    allocs = {a.bond: a for a in snapshot_allocations(snap)}
    bonds = []
    for netdev in sorted({p.netdev for p in snap.ports if p.netdev} | set(pins)):
        port = next((p for p in snap.ports if p.netdev == netdev), None)
        alloc = allocs.get(netdev)
        bonds.append(
            {
                "bond": netdev,
                "rdmaDevice": f"{port.device}/{port.port}" if port else "",
                "hostAddresses": snap.host_addrs.get(netdev, []),
                "pinnedTo": pins.get(netdev, ""),
                # kubelet's pod for the bond's device (PodResources) next to the pod holding its IP
                "allocatedTo": alloc.allocated_to if alloc else None,
                "ipHeldBy": alloc.held_by if alloc else None,
                "allocation": {"status": alloc.verdict, "detail": alloc.detail, "fix": alloc.fix}
                if alloc
                else None,
            }
        )
    view = snap.device_plugin
    return {
        "dataDir": snap.data_dir,
        "bonds": bonds,
        "attachments": [_attachment(snap, r) for r in snap.attachments],
        "missing": _missing(snap),
        "unreadableState": snap.unreadable_state,
        "kubelet": _kubelet_source(view),
        "allocationFailures": [a.detail for a in allocs.values() if a.verdict == "FAIL"],
        "skippedRestores": [
            {"bond": n.bond, "containerId": n.container_id, "ifname": n.ifname, "recorded": n.recorded,
             "current": n.current, "routes": n.routes, "rules": n.rules, "time": n.time}
            for n in snap.skipped
        ],
        "podsWithoutRdma": [
            {"pod": a.allocated_to, "devices": a.device.split(","), "detail": a.detail}
            for a in pods_without_rdma(snap)
        ],
    }


def _kubelet_source(view: DevicePluginView | None) -> str:
    if view is None:
        return ""
    if view.kubelet_error == ABSENT:
        return f"no kubelet PodResources socket at {view.socket}: allocations unknown"
    return view.kubelet_error or f"kubelet PodResources {view.socket} ({view.resource})"


def render_inventory(inv: dict[str, Any]) -> str:
    header = "BOND     RDMA           HOST ADDRESSES               PINNED TO"
    if any(b.get("allocation") for b in inv["bonds"]):
        header += "     KUBELET GAVE IT TO    IP HELD BY"
    lines = [header]
    for b in inv["bonds"]:
        addrs = ",".join(b["hostAddresses"]) or "-"
        line = f"{b['bond']:<8} {b['rdmaDevice'] or '-':<14} {addrs:<28} {b['pinnedTo'][:12] or '-':<13}"
        if b.get("allocation"):
            line += f" {b['allocatedTo'] or '-':<21} {b['ipHeldBy'] or '-'}"
            if b["allocation"]["status"] != "OK":
                line += f"  {b['allocation']['status']}"
        lines.append(line.rstrip())
    if inv.get("kubelet"):
        lines.append(f"(allocations: {inv['kubelet']})")
    for b in inv["bonds"]:
        a = b.get("allocation")
        if a and a["status"] != "OK":
            lines.append(f"{a['status']} {a['detail']}")
            if a["fix"]:
                lines.append(f"     fix: {a['fix']}")
    for p in inv.get("podsWithoutRdma", []):
        lines.append(f"WARN {p['detail']}")
    lines.append("")
    if not inv["attachments"]:
        lines.append("no attachments: nothing is pinned")
    for a in inv["attachments"]:
        state = "netns alive" if a["netnsAlive"] else "NETNS GONE"
        pod = a["pod"] or "pod unknown"
        lines.append(
            f"container {a['containerId']} ({pod}) {a['ifname']}: {a['phase']}, {state} {a['netns']}"
        )
        for b in a["bonds"]:
            gid = ""
            rdma = b["rdma"] if isinstance(b["rdma"], dict) else {}
            index = rdma.get("podGidIndex", rdma.get("hostGidIndex"))
            if index is not None:
                uverbs = f", /dev/infiniband/{rdma['uverbs']}" if rdma.get("uverbs") else ""
                gid = f", {rdma.get('device', '?')} GID index {index}{uverbs}"
            lines.append(f"  {b['bond']} -> {b['podIfname']}: {', '.join(b['addresses']) or '-'}{gid}")
            if b.get("podTable") is not None:
                lines.append(f"    {b['bond']} routes in pod table {b['podTable']}, rules: {_rules_text(b)}")
    lines.append("")
    if not inv["missing"]:
        lines.append("the host is missing nothing")
    for m in inv["missing"]:
        lines.append(f"MISSING {m['bond']}: {', '.join(m['addresses']) or '?'} ({m['reason']})")
    for note in inv.get("skippedRestores", []):
        lines.append(
            f"WARN {note['bond']} re-addressed: restore skipped; container {note['containerId']} "
            f"({note['ifname']}) held {', '.join(note['recorded'])}, the bond holds "
            f"{', '.join(note['current'])} now (kept; cleared by the next ADD on it)"
        )
    for path in inv["unreadableState"]:
        lines.append(f"UNREADABLE state file {path}: DEL cannot restore from it; inspect it by hand")
    return "\n".join(lines) + "\n"


def _rules_text(b: dict[str, Any]) -> str:
    """As ``ip rule`` prints them: ``100: from 198.51.100.2 lookup 100``."""
    rules = [f"{r['priority']}: from {r['from']} lookup {r['table']}" for r in b.get("podRules", [])]
    return "; ".join(rules) or "none of its own (an identical rule was already in the pod)"


def render_inventory_json(inv: dict[str, Any]) -> str:
    return json.dumps(inv, indent=1) + "\n"
