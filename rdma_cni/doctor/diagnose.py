"""Every check of ``cni-tool doctor``, in the order a person would go through them: installed files,
then the kernel's RDMA setup, the bonds, the GIDs, the plugin's state, the device plugin and what
kubelet allocated (per bond: kubelet's pod vs the pod holding the IP), the kubelet.
"""

from __future__ import annotations

import time
from collections.abc import Callable
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
from rdma_cni.doctor.findings import Finding, exit_code
from rdma_cni.doctor.node import NodePaths, NodeSnapshot, observe
from rdma_cni.retry import look_until

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


RECHECK_SECONDS = 1.0


def diagnose_until(
    paths: NodePaths,
    wait: float,
    pods: ApiAccess | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Finding]:
    """:func:`diagnose`, looked at again every second while anything FAILs, for up to ``wait``
    seconds; the last look is the answer.

    Why: the DaemonSet's containers start together, and its readiness probe runs as they start
    (kubelet triggers a probe that has no result yet at each pod sync). The device plugin writes
    its status a second or two later, so a probe that answered at once FAILed and the pod stayed
    not Ready until the probe's next period (15 s), which a rolling update waits for on every node.
    A healthy node answers at the first look, as before; on one that stays broken a look again
    costs ~10 ms of CPU (measured, 2-bond test node), against ~0.5 s for the probe's process."""
    return look_until(
        lambda: diagnose(paths, pods), lambda seen: not exit_code(seen), wait, RECHECK_SECONDS, clock, sleep
    )
