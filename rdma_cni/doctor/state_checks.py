"""Is the plugin's state consistent with the node: every pin held by a live pod netns, every state
file readable, no GID record left behind by a pod that is gone (rdma-ipvlan's pods' records are
theirs), and any give-back that left a re-addressed bond's old addresses out (WARN).
"""

from __future__ import annotations

from rdma_cni.attachments import PHASE_ADDING, PHASE_IPAM_PENDING
from rdma_cni.cni.errors import CniError
from rdma_cni.doctor.findings import FAIL, OK, WARN, Finding
from rdma_cni.doctor.node import NodeSnapshot
from rdma_cni.doctor.shared_pools import find_config
from rdma_cni.plugins.ipvlan.config import parse_del_config
from rdma_cni.rdma import records
from rdma_cni.state import NodeState


def check_state(snap: NodeSnapshot) -> list[Finding]:
    out = []
    for path in snap.unreadable_state:
        out.append(
            Finding(
                "state",
                FAIL,
                f"{path} cannot be read: DEL cannot restore from it",
                "if its pod is gone: give the bond its address back by hand, then remove the file",
            )
        )
    for rec in snap.attachments:
        bonds = ", ".join(b.bond for b in rec.bonds) or "no bond yet"
        who = f"container {rec.container_id[:12]} ({rec.ifname})"
        if rec.phase == PHASE_IPAM_PENDING:
            ipam = (rec.ipam or {}).get("type")
            out.append(
                Finding(
                    "state",
                    WARN,
                    f"{who} was deleted but its IPAM lease ({ipam}) is not released yet; it holds no bond",
                    "the runtime retries DEL until the IPAM plugin answers: check that plugin",
                )
            )
        elif not snap.netns_alive.get(rec.container_id, False):
            out.append(
                Finding(
                    "state",
                    FAIL,
                    f"{who} pins {bonds} but its netns {rec.netns or '(none)'} is gone",
                    "the runtime never sent DEL: `cni-tool gc` (or a CNI DEL for that container) "
                    "gives the addresses back",
                )
            )
        elif rec.phase == PHASE_ADDING:
            out.append(
                Finding(
                    "state",
                    WARN,
                    f"{who} is still adding {bonds}",
                    "a pod start is in progress; if it stays, the ADD crashed: DEL that container",
                )
            )
        else:
            out.append(Finding("state", OK, f"{who} holds {bonds}"))
    out += _stale_gid_records(snap)
    for note in snap.skipped:
        out.append(
            Finding(
                "state",
                WARN,
                f"restore skipped: {note.describe()}",
                "the present addresses were kept (the node's config re-addressed the bond); make sure no "
                f"pod or node still expects {', '.join(note.recorded)} (cleared by the next ADD of it)",
            )
        )
    if not out:
        out.append(Finding("state", OK, f"nothing pinned ({snap.data_dir})"))
    return out


def _stale_gid_records(snap: NodeSnapshot) -> list[Finding]:
    known = {rec.container_id for rec in snap.attachments} | _shared_mode_containers(snap.paths.conf_dir)
    out = []
    for cid, ifnames in records.list_pod_records(snap.run_dir).items():
        if cid not in known:
            out.append(
                Finding(
                    "state",
                    WARN,
                    f"GID record of container {cid[:12]} ({', '.join(ifnames)}) has no attachment",
                    f"remove {records.gid_dir(snap.run_dir)}/{cid}",
                )
            )
    return out


def _shared_mode_containers(conf_dir: str) -> set[str]:
    """Containers rdma-ipvlan holds addresses for: their GID records (``mode: shared``) sit in the
    same runDir as rdma-macvlan's and are theirs, not left behind."""
    found = find_config(conf_dir)
    if found is None:
        return set()
    try:
        cfg, _ = parse_del_config(found[1])
    except CniError:
        return set()
    return {rec.container_id for rec in NodeState(cfg.data_dir).attachments()}
