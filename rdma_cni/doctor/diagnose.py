"""Every check of ``cni-tool doctor``, in the order a person would go through them: installed files,
then the kernel's RDMA setup, the bonds, the GIDs, the plugin's state, the device plugin and what
kubelet allocated (per bond: kubelet's pod vs the pod holding the IP), the kubelet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rdma_cni.doctor import (
    deviceplugin,
    host_checks,
    install_checks,
    metrics_checks,
    rdma_checks,
    shared_pools,
    state_checks,
)
from rdma_cni.doctor.findings import Finding
from rdma_cni.doctor.node import NodePaths, NodeSnapshot, observe

if TYPE_CHECKING:
    from rdma_cni.doctor.pod_view import ApiAccess

CHECKS = (
    install_checks.check_binaries,
    install_checks.check_configs,
    rdma_checks.check_netns_mode,
    rdma_checks.check_devices,
    rdma_checks.check_uverbs,
    host_checks.check_bonds,
    rdma_checks.check_gids,
    state_checks.check_state,
    shared_pools.check_shared_pools,
    deviceplugin.check_plugin,
    deviceplugin.check_allocations,
    host_checks.check_topology_manager,
    metrics_checks.check_metrics,
)


def run_checks(snap: NodeSnapshot) -> list[Finding]:
    return [finding for check in CHECKS for finding in check(snap)]


def diagnose(paths: NodePaths, pods: ApiAccess | None = None) -> list[Finding]:
    """Every check; with ``pods`` (how to reach the API server, for DRA devices' slices) also each
    pod's GPU and NIC alignment, last (``cni-tool doctor --pods``)."""
    snap = observe(paths)
    findings = run_checks(snap)
    if pods is None:
        return findings
    # Here, not at the top: the pod lines' modules (the API client's YAML, the alignment's value
    # types) cost ~65 ms of a cold interpreter (python -X importtime) that the plain doctor, the
    # DaemonSet's readiness probe, never needs.
    from rdma_cni.doctor import pod_checks, pod_view

    return findings + pod_checks.check_pods(pod_view.observe_pods(snap, pods))
