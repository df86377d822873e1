"""What must hold on the test cluster while pods come and go (the chaos run, tests/cluster/chaos.py),
read from the nodes themselves, never from the product's own records:

- while it runs, for each Running RDMA pod: its bond interfaces, their addresses, its
  ``/dev/infiniband``, ``NCCL_IB_GID_INDEX`` / ``NCCL_IB_HCA`` and the node's GID slot are exactly
  what kubelet allocated to it (PodResources: the device plugin's IDs or the DRA claim's devices), and
  no bond is in two pods (shared mode: no address in two pods);
- at the end, after every pod is gone: what :func:`leftovers` lists is empty.

A pod is looked into from the host: its container's process (found in the node's cgroup tree by the
pod's UID) gives its network namespace, its ``/dev`` and its environment, so a check costs one ``ip``
process per pod and no ``kubectl exec``.

    seen = invariants.pod_view(node, pod)        # PodView(bonds={"bond0": "198.51.100.2"}, ...)
    wrong = invariants.exclusive_errors(node, seen, {"bond0"})
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster import apiread
from cluster import dra as d
from cluster import topology as topo
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import RDMA
from cluster.node import Node
from rdma_cni.kube import podresources

CGROUP = Path("/sys/fs/cgroup/pids")  # every v1 hierarchy holds the node's tree; pids is one
ROCE_V2_INDEX = "3"  # the host's RoCE v2 IPv4 slot on mlx5: what every pod keeps in exclusive mode
HCA = re.compile(r"mlx5_bond_(\d+)$")


@dataclass
class PodView:
    """What one pod has, seen from the host."""

    bonds: dict[str, list[str]] = field(default_factory=dict)  # bond ifname -> its IPv4 addresses
    infiniband: set[str] = field(default_factory=set)
    env: dict[str, str] = field(default_factory=dict)


def container_pid(node: Node, uid: str) -> int | None:
    """A process of the pod's app container (not its sandbox's pause), from the node's cgroups."""
    base = CGROUP / node.cgroup_root.lstrip("/")
    for procs in base.glob(f"kubepods/**/pod{uid}/*/cgroup.procs"):
        for pid in procs.read_text().split():
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() != "pause":
                    return int(pid)
            except OSError:
                continue
    return None


def pod_view(node: Node, pod: dict[str, Any]) -> PodView | None:
    """The pod's bonds, devices and environment; None when its container runs no process now."""
    pid = container_pid(node, pod["metadata"]["uid"])
    if pid is None:
        return None
    argv = ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-j", "-4", "addr"]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
    try:
        links = json.loads(out.stdout or "[]")
        dev = {p.name for p in Path(f"/proc/{pid}/root/dev/infiniband").iterdir()}
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (OSError, ValueError):
        return None  # the container ended while being read
    env = dict(e.split("=", 1) for e in raw.decode(errors="replace").split("\0") if "=" in e)
    bonds = {
        a["ifname"]: sorted(i["local"] for i in a.get("addr_info", []))
        for a in links
        if a["ifname"].startswith("bond")
    }
    return PodView(bonds, dev, env)


def allocations(node: Node) -> dict[tuple[str, str], set[str]] | None:
    """(namespace, pod) -> the bonds kubelet allocated to it from the device plugin (PodResources
    List); None while the node's kubelet does not answer (killed, restarting)."""
    sock = node.dir("/var/lib/kubelet") / "pod-resources" / "kubelet.sock"
    try:
        held, _ = podresources.node_allocations(str(sock), timeout=3)
    except Exception:  # noqa: BLE001 (a kubelet being restarted answers nothing, or half)
        return None
    out: dict[tuple[str, str], set[str]] = {}
    for key, given in held.items():
        bonds = {f"bond{m.group(1)}" for i in given.devices.get(RDMA, []) if (m := HCA.search(i))}
        if bonds:
            out[key] = bonds
    return out


def claim_bonds(pod: dict[str, Any]) -> set[str] | None:
    """The bonds the scheduler allocated to the pod's claims (DRA), from the ResourceClaims in the API:
    the allocation itself (kubelet's PodResources once listed a running pod without its claim's devices
    in two checks 2 s apart). None while the API does not answer."""
    status = pod.get("status", {})
    names = [
        c["resourceClaimName"]
        for c in status.get("resourceClaimStatuses") or []
        if c.get("resourceClaimName")
    ]
    ext = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    names += [ext] if ext else []
    ns = pod["metadata"].get("namespace", "default")
    try:
        claims = [
            apiread.get_object(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{n}") for n in names
        ]
    except apiread.ReadError:
        return None
    return {r["device"] for c in claims for r in d.results(c) if r["driver"] == d.DRIVER}


def exclusive_errors(node: Node, seen: PodView, allocated: set[str]) -> list[str]:
    """How the pod differs from its allocation in exclusive mode: interfaces named like its bonds and
    no other, each with the bond's own address, their device nodes and rdma_cm only, the host's
    RoCE v2 index in its environment and the bond's address in that GID slot."""
    errs = []
    if set(seen.bonds) != allocated:
        errs.append(f"interfaces {sorted(seen.bonds)} != allocated {sorted(allocated)}")
    for b, addrs in seen.bonds.items():
        own = topo.bond_ip(node.n, int(b.removeprefix("bond")))
        if addrs != [own]:
            errs.append(f"{b} has {addrs}, not the bond's own {own}")
    idx = sorted(int(b.removeprefix("bond")) for b in allocated)
    want = {f"{k}{i}" for i in idx for k in ("uverbs", "umad", "issm")} | {"rdma_cm"}
    if seen.infiniband != want:
        errs.append(f"/dev/infiniband {sorted(seen.infiniband)} != {sorted(want)}")
    if seen.env.get("NCCL_IB_GID_INDEX") != ROCE_V2_INDEX:
        errs.append(f"NCCL_IB_GID_INDEX={seen.env.get('NCCL_IB_GID_INDEX')}")
    hcas = seen.env.get("NCCL_IB_HCA", "").lstrip("=").split(",")
    if sorted(hcas) != sorted(f"mlx5_bond_{i}" for i in idx):
        errs.append(f"NCCL_IB_HCA={seen.env.get('NCCL_IB_HCA')}")
    for i in idx:
        if not gid_holds(node, i, topo.bond_ip(node.n, i)):
            errs.append(f"mlx5_bond_{i} GID {ROCE_V2_INDEX} does not hold {topo.bond_ip(node.n, i)}: "
                        f"its table is {gid_table(node, i)}")  # fmt: skip
    return errs


def shared_errors(node: Node, seen: PodView) -> list[str]:
    """Shared mode: every bond, each with one address of its own in the bond's subnet (not the
    bond's)."""
    errs = []
    if sorted(seen.bonds) != [f"bond{b}" for b in range(topo.BONDS)]:
        errs.append(f"interfaces {sorted(seen.bonds)}: not every bond")
    for b, addrs in seen.bonds.items():
        i = int(b.removeprefix("bond"))
        net, own = topo.bond_subnet(node.n, i), topo.bond_ip(node.n, i)
        if len(addrs) != 1 or addrs[0] == own or not _in(addrs[0], net):
            errs.append(f"{b} has {addrs} (subnet {net}, the bond's own {own})")
    return errs


def _in(address: str, net: ipaddress.IPv4Network) -> bool:
    return ipaddress.ip_address(address) in net


def gid_holds(node: Node, bond: int, address: str) -> bool:
    """The simulated HCA's RoCE v2 slot holds the IPv4-mapped GID of ``address``."""
    path = node.sys_tree / "class" / "infiniband" / f"mlx5_bond_{bond}" / "ports" / "1" / "gids"
    o = [int(x) for x in address.split(".")]
    tail = f"{o[0]:02x}{o[1]:02x}:{o[2]:02x}{o[3]:02x}"
    try:
        return (path / ROCE_V2_INDEX).read_text().strip().endswith(tail)
    except OSError:
        return False


def gid_table(node: Node, bond: int) -> dict[str, str]:
    """The HCA's non-zero GID slots: what a wrong slot held instead."""
    path = node.sys_tree / "class" / "infiniband" / f"mlx5_bond_{bond}" / "ports" / "1" / "gids"
    try:
        texts = {g.name: g.read_text().strip() for g in path.iterdir()}
    except OSError as e:
        return {"error": str(e)}
    return {k: v for k, v in sorted(texts.items()) if v.strip("0:")}


def duplicates(held: dict[str, list[str]]) -> list[str]:
    """What two pods hold at once: ``held`` maps each pod to its bonds (exclusive) or addresses
    (shared)."""
    owner: dict[str, str] = {}
    out = []
    for pod, things in held.items():
        for t in things:
            if t in owner:
                out.append(f"{t} in {owner[t]} and {pod}")
            owner[t] = pod
    return out


# --------------------------------------------------------------------------- the end


def node_files(node: Node) -> dict[str, list[str]]:
    """What a node keeps per pod, which no pod may leave behind: rdma-macvlan's and rdma-ipvlan's
    records, the DRA driver's prepared claims and CDI specs, the runtime's network namespaces."""
    netns = node.run("ls /run/netns 2>/dev/null || true", check=False).stdout.split()
    out = {
        "macvlan records": _files(node.dir("/var/lib/cni") / "rdma-macvlan"),
        "ipvlan records": _files(node.dir("/var/lib/cni") / "rdma-ipvlan"),
        "prepared claims": d.prepared_records(node),
        "CDI specs": d.cdi_specs(node),
        "netns": sorted(netns),
    }
    return out


def _files(root: Path) -> list[str]:
    """The per-attachment records under a plugin's ``dataDir`` (rdma_cni.state: ``attachments/``;
    its ``lock`` and ``claims/<00..ff>`` lock files are the node's, never deleted)."""
    d = root / "attachments"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def cni_iptables(node: Node) -> list[str]:
    """The cluster network plugin's NAT entries (chains ``CNI-…``): one set per pod sandbox."""
    out = node.run("iptables-save -t nat 2>/dev/null || true", check=False).stdout
    return sorted(line for line in out.splitlines() if "CNI-" in line and not line.startswith("#"))


def metrics(node: Node) -> dict[str, float]:
    """The node's agent's /metrics (hostNetwork port 9513), as ``name{labels}`` -> value; {} when it
    does not answer."""
    argv = [
        "nsenter",
        f"--net=/run/netns/{node.netns}",
        "curl",
        "-sf",
        "-m",
        "10",
        "http://127.0.0.1:9513/metrics",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=20).stdout
    samples = {}
    for line in out.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def holders(samples: dict[str, float]) -> dict[str, str]:
    """bond -> the pod ``rdma_cni_bond_holder`` says holds it (value 1)."""
    out = {}
    for key, value in samples.items():
        if key.startswith("rdma_cni_bond_holder{") and value == 1:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', key))
            out[labels.get("bond", "")] = labels.get("pod", "")
    return out


def metrics_errors(samples: dict[str, float]) -> list[str]:
    """What the metrics of an idle node must say: no holder, no lost address, no record, one GID
    index."""
    if not samples:
        return ["/metrics did not answer"]
    errs = [k for k, v in samples.items() if k.startswith("rdma_cni_bond_holder{") and v]
    errs += [k for k, v in samples.items() if k.startswith("rdma_cni_bond_address_lost{") and v]
    errs += [f"{k} {v:g}" for k, v in samples.items() if k.startswith("rdma_cni_state_records") and v]
    if samples.get("rdma_cni_gid_index_unified") != 1:
        errs.append(f"rdma_cni_gid_index_unified {samples.get('rdma_cni_gid_index_unified')}")
    return errs


def resource_errors(bins: Binaries, node: Node, front_end: str, mode: str) -> list[str]:
    """The node's offer equals its truth (8 healthy bonds): allocatable in the API and in kubelet
    for the device plugin (1000 in shared mode), the 8 devices untainted in the ResourceSlices for
    DRA."""
    if front_end == "dra":
        devs = d.devices(bins, node=node.name)
        tainted = sorted(n for n, x in devs.items() if x.get("taints"))
        errs = [f"{len(devs)} DRA devices published"] if len(devs) != topo.BONDS else []
        return errs + [f"{t} tainted" for t in tainted]
    want = 1000 if mode == "shared" else topo.BONDS
    api, kubelet = w.node_capacity(bins, node.name), w.kubelet_allocatable(node)
    errs = [f"API capacity/allocatable {api}"] if api != (want, want) else []
    return errs + ([f"kubelet allocatable {kubelet}"] if kubelet != want else [])


def claims_left() -> list[str]:
    """ResourceClaims still in the default namespace (every chaos pod's is deleted with it)."""
    try:
        items = apiread.get_list("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims")
    except apiread.ReadError as e:
        return [str(e)]
    return [i["metadata"]["name"] for i in items]
