"""A rolling update of the product's DaemonSet and a kill -9 of a device plugin, under pod churn, on
the real 2-node test cluster (kubelet 1.37.2 from Go modules), with two device plugin containers per
node (``devicePlugin.instances=2``): kubelet never reports a node's bonds unallocatable, no pod is
rejected for want of a healthy device, no CNI call fails (but the retried one of a pod whose bonds
a force-deleted pod still held), and each node really ran its new pod beside the old one (the surge).

The one rejection allowed is kubelet's own race, which nothing on the plugin's side closes: an
Allocate that reached the killed plugin in the instant before kubelet saw its connection end
(``rpc error: code = Unavailable``; kubelet does not retry it).

The churn and the counting are tests/cluster/rollout.py's (``scripts/bench-rollout``), small here:
three pods at most alive at once, one rollout, one kill.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster import build, chaos, cluster, rollout
from cluster.build import Binaries

pytestmark = [pytest.mark.cluster, pytest.mark.helm, pytest.mark.netns]

PLAN = chaos.Plan(seed=5, quiet_runs=0, max_pods=3, chart_sets=("--set", "devicePlugin.instances=2"))
KUBELETS_RACE = "rpc error: code = Unavailable"
# A force-deleted pod's bonds handed to the next pod before the old sandbox's DEL: rdma-macvlan waits
# pinnedWaitMs for it, then answers error 11 and kubelet retries the sandbox (docs/known-issues.md).
# The churn force-deletes pods; the retried pod must still run (report.lost).
FORCE_DELETE_RETRY = "is pinned to container"


@pytest.fixture(scope="module")
def kube(request: pytest.FixtureRequest) -> Iterator[Binaries]:
    """The chart installed with two device plugin containers on the two nodes the e2e module leaves
    (cluster.SHARED_HELM; a new cluster when it did not); uninstalled after."""
    clean = cluster.no_new_failures(request.session)
    with cluster.exclusive(), cluster.for_module(chaos.NODES, cluster.SHARED_HELM, clean):
        bins = build.binaries()
        chaos.install(bins, PLAN)
        yield bins
        chaos.uninstall(bins)


def test_a_rollout_and_a_crash_under_churn_reject_no_pod_and_fail_no_cni_call(kube: Binaries) -> None:
    report = rollout.Churn(kube, PLAN).measure(rollouts=1, crashes=1, settle=3.0)
    win, crash, _reference = report.windows
    text = report.text()
    assert win.starts, f"no pod was created during the rollout: nothing was measured\n{text}"
    assert win.max_per_node == 2, f"no node ran its new pod beside the old one (no surge)\n{text}"
    assert win.min_allocatable > 0, f"kubelet reported a node's bonds unallocatable in the rollout\n{text}"
    assert crash.min_allocatable > 0, f"kubelet reported the bonds unallocatable after the kill\n{text}"
    unexpected = {m: n for m, n in report.rejections.items() if KUBELETS_RACE not in m}
    assert unexpected == {}, text
    failed = {m: n for m, n in report.cni_failures.items() if FORCE_DELETE_RETRY not in m}
    assert failed == {}, text
    assert report.lost == [], text
