"""A release installed as its users install it: scripts/release (from a clean clone of HEAD) pushes
0.1.0 into the test cluster's own registry (203.0.113.1:5000, on the fabric), then the cluster runs
``helm install rdma-cni oci://.../charts/rdma-cni --version 0.1.0`` with the chart's defaults and
each node's containerd pulls the release's image from the registry: the harness only ever pushes
docker.io/library/rdma-cni there, so a pod running the release's digest was pulled, not imported.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import release_support as support
from cluster import build, chart, cluster
from cluster import topology as topo
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import RDMA

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.helm]

NODES = 2
DS = "k8s-app=rdma-cni"
REGISTRY = f"{topo.REGISTRY}/release"


@pytest.fixture(scope="module")
def kube(request: pytest.FixtureRequest) -> Iterator[Binaries]:
    """The two labelled nodes the e2e and rollout modules leave with the chart uninstalled
    (cluster.SHARED_HELM), or a new cluster when they did not."""
    clean = cluster.no_new_failures(request.session)
    with cluster.exclusive(), cluster.for_module(NODES, cluster.SHARED_HELM, clean):
        bins = build.binaries()
        w.label_nodes(bins, NODES)
        yield bins


def _offers_8(kube: Binaries, node: str) -> bool:
    return w.node_capacity(kube, node) == (8, 8)


def test_helm_installs_the_release_from_the_registry_and_the_nodes_pull_its_image(
    kube: Binaries, tmp_path: Path
) -> None:
    clone = support.clone(tmp_path)
    out = tmp_path / "out"
    proc = support.release(
        clone, support.VERSION, "--registry", REGISTRY, "--insecure", "--out", str(out), netns=topo.FABRIC
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    (entry,) = json.loads((clone / "releases.json").read_text())
    digest = entry["image"].rsplit("@", 1)[1]

    oci = f"oci://{REGISTRY}/charts/rdma-cni"
    chart.on_cluster("uninstall", chart.RELEASE, "-n", chart.NAMESPACE, "--ignore-not-found", check=False)
    chart.on_cluster(
        "install", chart.RELEASE, oci, "--version", support.VERSION, "--plain-http", "-n", chart.NAMESPACE
    )
    pods = w.wait_ready(kube, DS, NODES, "kube-system", timeout=300)

    ref = f"{REGISTRY}/rdma-cni:{support.VERSION}"
    for p in pods:
        spec = p["spec"]
        assert {c["image"] for c in [*spec.get("initContainers", []), *spec["containers"]]} == {ref}
        statuses = [*p["status"].get("initContainerStatuses", []), *p["status"]["containerStatuses"]]
        assert {s["imageID"] for s in statuses} == {f"{REGISTRY}/rdma-cni@{digest}"}
    for n in range(1, NODES + 1):
        node = topo.node_name(n)
        w.wait(f"{node} offers 8 {RDMA}", functools.partial(_offers_8, kube, node), 90)
    chart.on_cluster("uninstall", chart.RELEASE, "-n", chart.NAMESPACE, "--wait", check=False, timeout=300)
