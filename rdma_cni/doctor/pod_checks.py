"""``cni-tool doctor --pods``: for each container with GPUs or RDMA NICs, which GPU and NIC share a
PCIe root, as findings.

    OK   pod default/pairs-2 main        aligned by PCIe root: 2 GPUs, 2 RDMA NICs
    OK   pod default/pairs-2 main gpu-0  pci0000:00, NUMA 0 (claim default/pairs-2): under its root: bond0

Aligned by root is OK. By NUMA node only is OK where that is all that can be known (a device-plugin
GPU's root) or where every GPU has a NIC under its root and more NICs sit beside them (a claim for
every NIC of a NUMA node); it is a WARN where a GPU whose root is known has no NIC under it. Unaligned
is a WARN. None of these FAILs: where a pod's devices sit says nothing about whether the node can
start RDMA pods (the doctor is the DaemonSet's readiness probe).
"""

from __future__ import annotations

from rdma_cni.doctor.alignment import (
    NO_GPU,
    NO_NIC,
    NUMA,
    ROOT,
    UNALIGNED,
    ContainerAlignment,
    Endpoint,
    align,
)
from rdma_cni.doctor.findings import OK, SKIP, WARN, Finding
from rdma_cni.doctor.pod_view import ABSENT, PodsView

PAIR_FIX = (
    "ask for each GPU and its NIC in one claim with a constraint matchAttribute: "
    "resource.kubernetes.io/pcieRoot (conf/k8s/dra/, docs/dra.md), and recreate the pod"
)


def where(e: Endpoint) -> str:
    root = ",".join(e.place.roots) or (e.unknown or "root unknown")
    numa = ",".join(str(n) for n in e.place.numa) or "?"
    return f"{root}, NUMA {numa}"


def _listed(nics: tuple[Endpoint, ...]) -> str:
    return ", ".join(n.name for n in nics)


def _status(a: ContainerAlignment) -> str:
    if a.verdict in (ROOT, NO_GPU, NO_NIC):
        return OK
    if a.verdict == NUMA:
        fixable = any(g.lacks_root_nic for g in a.gpus) and all(n.place.roots for n in a.nics)
        return WARN if fixable else OK
    return WARN if a.verdict == UNALIGNED else SKIP


def _gpu_line(check: str, status: str, a: ContainerAlignment, i: int) -> Finding:
    p = a.gpus[i]
    name, head = f"{check} {p.gpu.name}", f"{where(p.gpu)} ({p.gpu.source})"
    beside = f"on its NUMA node: {_listed(p.same_numa)}" if p.same_numa else ""
    if p.same_root:  # the NUMA neighbours matter only where not every NIC has a GPU under its root
        also = f"; also {beside}" if beside and a.verdict != ROOT else ""
        return Finding(name, OK, f"{head}: under its root: {_listed(p.same_root)}{also}")
    if not p.gpu.place.roots:  # nothing to say about its root: what NUMA says is all there is
        return Finding(name, status, f"{head}: {beside or 'no RDMA NIC known to be on its NUMA node'}")
    return Finding(name, status, f"{head}: no RDMA NIC under its root"
                   + (f"; {beside}" if beside else " or on its NUMA node"))


def container_lines(a: ContainerAlignment) -> list[Finding]:
    check = f"pod {a.pod} {a.container}"
    status = _status(a)
    if a.verdict == NO_GPU:
        return [Finding(check, OK, f"{a.verdict}: " + ", ".join(f"{n.name} ({where(n)})" for n in a.nics))]
    if a.verdict == NO_NIC:
        gpus = ", ".join(f"{p.gpu.name} ({where(p.gpu)})" for p in a.gpus)
        return [Finding(check, OK, f"{a.verdict}: {gpus}")]
    nics = f"{len(a.nics)} RDMA NIC{'s' * (len(a.nics) != 1)}" + (" (every bond)" if a.every_bond else "")
    count = f"{len(a.gpus)} GPU{'s' * (len(a.gpus) != 1)}, {nics}"
    out = [Finding(check, status, f"{a.verdict}: {count}", PAIR_FIX if status == WARN else "")]
    out += [_gpu_line(check, status, a, i) for i in range(len(a.gpus))]
    if a.apart:
        out.append(Finding(f"{check} NICs apart", status, "under no GPU's root: "
                           + ", ".join(f"{n.name} ({where(n)}, {n.source})" for n in a.apart)))
    return out


def _source(view: PodsView, shown: int) -> Finding:
    if view.kubelet_error == ABSENT:
        return Finding("pods", SKIP, f"no kubelet PodResources socket at {view.socket}: the pods' GPUs and "
                       "RDMA NICs cannot be shown")
    if view.kubelet_error:
        return Finding("pods", WARN, view.kubelet_error,
                       "pass --pod-resources-dir (kubelet's <root-dir>/pod-resources) if its root moved")
    pods = len({c.pod for c in view.containers})
    head = f"kubelet: {pods} pods, {shown} containers with GPUs or RDMA NICs"
    if not view.pools:
        return Finding("pods", OK, f"{head}; no DRA GPU or NIC")
    pools = ", ".join(f"{d} {p}" for d, p in view.pools)
    if view.slices_error:
        return Finding("pods", WARN, f"{head}; DRA pools {pools}: {view.slices_error}",
                       "the DRA GPUs' places stay unknown (our NICs' come from sysfs): give --kubeconfig, "
                       "or run the doctor where the rdma-cni ServiceAccount may list resourceslices")
    return Finding("pods", OK, f"{head}; ResourceSlices of {pools} read ({view.api})")


def check_pods(view: PodsView) -> list[Finding]:
    """The source line (what was read, what could not be), then each container's lines."""
    alignments = align(view.containers, view.facts, view.bonds, view.pci, view.kinds, view.slices_error)
    out = [_source(view, len(alignments))]
    for a in alignments:
        out += container_lines(a)
    return out
