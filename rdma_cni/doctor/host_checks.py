"""The node around the RDMA devices: bonds that hold their IPs (or lent them to a live pod), and the
kubelet's Topology Manager policy (TKE's guide recommends best-effort for GPU/RDMA NUMA affinity).
"""

from __future__ import annotations

import os
import re
from socket import AF_INET

from rdma_cni.attachments import AttachmentRecord
from rdma_cni.doctor.findings import FAIL, OK, SKIP, WARN, Finding
from rdma_cni.doctor.node import NodeSnapshot
from rdma_cni.net.addresses import cidr

ALIGNING_POLICIES = ("best-effort", "restricted", "single-numa-node")


def holder_of(snap: NodeSnapshot, bond: str) -> AttachmentRecord | None:
    for rec in snap.attachments:
        if any(b.bond == bond for b in rec.bonds):
            return rec
    return None


def check_bonds(snap: NodeSnapshot) -> list[Finding]:
    out = []
    for err in snap.errors:
        out.append(Finding("bonds", FAIL, err, "run doctor in the node's network namespace"))
    for netdev in sorted({p.netdev for p in snap.ports if p.netdev}):
        out.append(_bond_finding(snap, netdev))
    return out


def _bond_finding(snap: NodeSnapshot, bond: str) -> Finding:
    name = f"bond {bond}"
    if bond not in snap.host_addrs:
        return Finding(
            name,
            FAIL,
            "the RDMA device's netdev does not exist in the node netns",
            "create the bond (or rename it) so it matches `rdma link`",
        )
    addrs = snap.host_addrs[bond] + snap.host_ipv6.get(bond, [])  # an IPv6-only bond holds its IPs too
    holder = holder_of(snap, bond)
    if addrs and holder is None:
        return Finding(name, OK, f"holds {', '.join(addrs)}; free for a pod")
    if addrs and holder is not None:
        return Finding(
            name,
            WARN,
            f"holds {', '.join(addrs)} but is pinned to {_who(holder)}",
            "a pod start is in progress, or an ADD crashed: `cni-tool state` shows it; "
            "DEL the attachment (or `cni-tool gc`) if the container is gone",
        )
    if holder is not None and snap.netns_alive.get(holder.container_id):
        lent = ", ".join(_recorded_ipv4(holder, bond)) or "its addresses"
        return Finding(name, OK, f"{lent} lent to {_who(holder)}")
    if holder is not None:
        lost = ", ".join(_recorded_ipv4(holder, bond)) or "its addresses"
        return Finding(
            name,
            FAIL,
            f"{lost} pinned to {_who(holder)}, whose netns is gone",
            "the runtime never sent DEL: run `cni-tool gc` (or DEL that container) to give the "
            "IP back to the bond",
        )
    last = _last_known_ipv4(snap, bond)
    return Finding(
        name,
        FAIL,
        f"has no IPv4 address and no pod holds it{last}",
        f"the node lost {bond}'s address: restore it (ip addr add <ip>/<prefix> dev {bond}) "
        "or fix the node's network config",
    )


def _who(rec: AttachmentRecord) -> str:
    return f"container {rec.container_id[:12]} ({rec.ifname})"


def _recorded_ipv4(rec: AttachmentRecord, bond: str) -> list[str]:
    """The IPv4 CIDRs the write-ahead record took from ``bond`` (what DEL will give back)."""
    return [cidr(a) for b in rec.bonds if b.bond == bond for a in b.addresses if a.get("family") == AF_INET]


def _last_known_ipv4(snap: NodeSnapshot, bond: str) -> str:
    for port in snap.host_record.get("ports", []):
        if isinstance(port, dict) and port.get("netdev") == bond and port.get("ipv4"):
            return f" (last known: {port['ipv4']}, from {snap.run_dir}/gid/host.json)"
    return ""


def check_topology_manager(snap: NodeSnapshot) -> list[Finding]:
    policy, source = topology_policy(snap.paths.kubelet_root_dir, snap.paths.proc_root)
    if policy is None:
        return [Finding("topology-manager", SKIP, f"kubelet's policy not readable ({source})")]
    if policy in ALIGNING_POLICIES:
        return [Finding("topology-manager", OK, f"policy {policy} ({source})")]
    return [
        Finding(
            "topology-manager",
            WARN,
            f"policy {policy} ({source}): GPUs and RDMA NICs are not NUMA-aligned",
            "set topologyManagerPolicy: best-effort in the kubelet config and restart kubelet",
        )
    ]


def topology_policy(kubelet_root: str, proc_root: str) -> tuple[str | None, str]:
    """The kubelet's Topology Manager policy: its command line flag, else its config file."""
    configs = [os.path.join(kubelet_root, "config.yaml")]
    flag, config = _kubelet_cmdline(proc_root)
    if flag:
        return flag, "kubelet --topology-manager-policy"
    if config:
        configs.insert(0, config)
    for path in configs:
        policy = _policy_in_config(path)
        if policy is not None:
            return policy, path
    # The kubelet's default when nothing sets it.
    if flag is None and config is None and not any(os.path.exists(p) for p in configs):
        return None, f"no kubelet process and no {configs[-1]}"
    return "none", "kubelet default"


def _kubelet_cmdline(proc_root: str) -> tuple[str | None, str | None]:
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return None, None
    for pid in pids:
        try:
            with open(os.path.join(proc_root, pid, "cmdline"), "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if not argv or os.path.basename(argv[0]) != "kubelet":
            continue
        flag = config = None
        for i, arg in enumerate(argv):
            for key in ("--topology-manager-policy", "--config"):
                value = (
                    arg.split("=", 1)[1]
                    if arg.startswith(key + "=")
                    else (argv[i + 1] if arg == key and i + 1 < len(argv) else None)
                )
                if value is not None:
                    flag, config = (value, config) if key == "--topology-manager-policy" else (flag, value)
        if config and os.path.isabs(config):
            # the file as kubelet sees it: through its own root, which is another mount namespace
            # when the doctor runs in a container (hostPID) or kubelet in a namespace of its own
            seen = os.path.join(proc_root, pid, "root", config.lstrip("/"))
            if os.path.exists(seen):
                config = seen
        return flag, config
    return None, None


def _policy_in_config(path: str) -> str | None:
    """``topologyManagerPolicy`` from a KubeletConfiguration (YAML or JSON); "none" when unset."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    match = re.search(r"""^\s*"?topologyManagerPolicy"?\s*:\s*"?([A-Za-z-]+)"?""", text, re.MULTILINE)
    return match.group(1) if match else "none"
