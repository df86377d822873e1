"""A rolling update of the product's DaemonSet under pod churn, on the real 2-node test cluster (kubelet
1.37.2 from Go modules): no pod rejected at admission, no CNI call failed, kubelet never reports the
node's bonds unallocatable, and each node really ran its new pod beside the old one (the surge).

The churn and the counting are tests/cluster/rollout.py's (``scripts/bench-rollout``), small here:
three pods at most alive at once, one rollout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from cluster import build, chaos, cluster, rollout
from cluster.build import Binaries

pytestmark = [pytest.mark.cluster, pytest.mark.helm, pytest.mark.netns]

PLAN = chaos.Plan(seed=5, quiet_runs=0, max_pods=3)


@pytest.fixture(scope="module")
def kube() -> Iterator[Binaries]:
    """The cluster with the chart installed (Helm, the device plugin front end, exclusive mode);
    ``RDMA_CNI_CLUSTER_REUSE=1`` keeps a cluster that is up, and up."""
    reuse = os.environ.get("RDMA_CNI_CLUSTER_REUSE") == "1"
    with cluster.exclusive():
        if not (reuse and cluster.State.load().procs):
            cluster.up(chaos.NODES)
        try:
            bins = build.binaries()
            chaos.install(bins, PLAN)
            yield bins
            chaos.uninstall(bins)
        finally:
            if not reuse:
                cluster.down()


@pytest.mark.xfail(
    reason="known issue (docs/known-issues.md): a surge rollout under churn still rejected 3 pods or failed "
    "1 CNI call in some runs (scripts/bench-rollout); the cause is not found yet",
    strict=False,
)
def test_a_rollout_under_churn_rejects_no_pod_and_fails_no_cni_call(kube: Binaries) -> None:
    report = rollout.Churn(kube, PLAN).measure(rollouts=1, crashes=0, settle=3.0)
    (win,) = report.windows
    text = report.text()
    assert win.starts, f"no pod was created during the rollout: nothing was measured\n{text}"
    assert win.max_per_node == 2, f"no node ran its new pod beside the old one (no surge)\n{text}"
    assert report.rejected == 0, text
    assert report.cni_failed == 0, text
    assert win.min_allocatable > 0, f"kubelet reported a node's bonds unallocatable\n{text}"
    assert report.lost == [], text
