"""Two real versions meet on the test cluster: the previous version (tests/upgrade/versions.json:
its commit's chart, and its image built by its own scripts, cluster.previous) and this working
tree, with TKE's ibv-app StatefulSet holding bonds throughout. In order, on one one-node cluster
(module scope; each test reads the state the one before it left, as an operator's session does):

1. ``helm install`` of the previous chart and image; an ibv-app pod Running with its 4 bonds;
2. the rolling-update window before the upgrade: this version's thin client (wire 1-2) is served
   by the previous agent (wire 1), which hands the call to its worker as version 1;
3. ``helm upgrade`` to this chart and image: the running pod undisturbed (same UID, container,
   restarts, bonds, addresses, device nodes, GID index), a new pod started by the new code, then
   both deleted and the node exact: the new code gave back what the old code lent;
4. the window after it: the previous version's client, still on disk in the node's kept bundle
   dir, is served by this agent;
5. ``helm rollback`` to the previous revision with pods this version started: they stay
   undisturbed, and once deleted the old code gives back exactly what the new code recorded.

Each pod is looked into from the host (cluster.invariants: its container's namespaces, /dev and
environment), and checked against what kubelet allocated to it (PodResources). The wall time of
each step is printed (pytest -s) and the whole file's at the end.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import build, chart, cluster, invariants, previous, registry
from cluster import topology as topo
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import kubectl
from cluster.node import Node
from cluster.versions import CACHE_ROOT
from netns import build_c_client

pytestmark = [pytest.mark.cluster, pytest.mark.netns, pytest.mark.helm, pytest.mark.upgrade]

NODES = 1
SEED = "k8s-app=ibv-app"
DS = "k8s-app=rdma-cni"
NEW_TAG = "0.1.0"  # this working tree's image, as the harness builds it (cluster.cluster.PRODUCT_TAGS)
LIB = "/opt/cni/bin/rdma-cni.d"  # where install.sh lays each bundle (BUILD_ID dirs, current ->)
PREV = previous.previous()
NODE = Node(1)
TIMES: dict[str, float] = {}
STATE: dict[str, Any] = {}  # what one step leaves for the next: the node's baseline, the revisions


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Binaries]:
    """One labelled node; the previous version's image (built before the cluster lock is taken: a
    first build is minutes) pushed into the cluster's registry; everything removed after."""
    t0 = time.monotonic()
    image = previous.build_previous(CACHE_ROOT)
    TIMES["previous image (build or cache)"] = time.monotonic() - t0
    STATE["old_chart"] = previous.chart(tmp_path_factory.mktemp("previous-chart"))
    with cluster.exclusive():
        t1 = time.monotonic()
        cluster.up(NODES)
        try:
            bins = build.binaries()
            w.label_nodes(bins, NODES)
            registry.push(registry.build_registry(CACHE_ROOT), image, topo.REGISTRY, netns=topo.FABRIC)
            TIMES["cluster up + previous image pushed"] = time.monotonic() - t1
            yield bins
        finally:
            chart.on_cluster("uninstall", chart.RELEASE, "-n", chart.NAMESPACE, "--ignore-not-found",
                             check=False)  # fmt: skip
            cluster.down()
    TIMES["whole file"] = time.monotonic() - t0
    print("\nupgrade scenarios, wall time (s): " + json.dumps({k: round(v, 1) for k, v in TIMES.items()}))


def old_release(verb: str, *sets: str) -> list[str]:
    """``helm install|upgrade`` of the previous version's chart with its image."""
    return [verb, chart.RELEASE, str(STATE["old_chart"]), "--namespace", chart.NAMESPACE,
            "--set", "image.repository=rdma-cni", "--set", f"image.tag={PREV.version}", *sets]  # fmt: skip


def ds_ready(kube: Binaries, tag: str) -> list[dict[str, Any]]:
    """The DaemonSet rolled to ``tag`` and Ready, the node offering its 8 bonds again."""
    w.rollout(kube, timeout=240)
    ds = w.wait_ready(kube, DS, NODES, "kube-system", timeout=120)
    images = {c["image"] for p in ds
              for c in [*p["spec"].get("initContainers", []), *p["spec"]["containers"]]}  # fmt: skip
    assert images == {f"rdma-cni:{tag}"}, images
    w.wait(f"{NODE.name} offers 8", lambda: w.node_capacity(kube, NODE.name) == (8, 8), 90)
    return ds


def installed_build() -> str:
    """The BUILD_ID the node's plugins run now (install.sh's ``current`` link)."""
    return os.readlink(NODE.dir("/opt/cni/bin") / "rdma-cni.d" / "current")


def seed_pods(kube: Binaries, count: int) -> dict[str, dict[str, Any]]:
    """The ibv-app pods (``count`` of them, Ready) as each must stay across a rollout: UID,
    container, restarts, and what the host sees in it; each exactly what kubelet allocated."""
    ps = w.wait_ready(kube, SEED, count, timeout=240)
    held = invariants.allocations(NODE)
    assert held is not None, "the node's kubelet answers PodResources"
    out = {}
    for p in ps:
        name = p["metadata"]["name"]
        look = functools.partial(invariants.pod_view, NODE, p)
        seen = w.wait(f"{name}'s container seen from the host", look, 30)
        allocated = held.get(("default", name), set())
        assert invariants.exclusive_errors(NODE, seen, allocated) == [], (name, allocated, seen)
        status = p["status"]["containerStatuses"][0]
        out[name] = {
            "uid": p["metadata"]["uid"],
            "container": status["containerID"],
            "restarts": status["restartCount"],
            "bonds": seen.bonds,
            "devices": sorted(seen.infiniband),
            "gid_index": seen.env.get("NCCL_IB_GID_INDEX"),
            "hca": seen.env.get("NCCL_IB_HCA"),
        }
    return out


def scale(kube: Binaries, replicas: int) -> None:
    kubectl(kube, "scale", "statefulset", "ibv-app", f"--replicas={replicas}")


def served_calls() -> float:
    """How many VERSION calls of rdma-macvlan the node's agent has served (its /metrics)."""
    read = functools.partial(invariants.metrics, NODE)
    samples: dict[str, float] = w.wait("the agent's /metrics", read, 60)
    return sum(v for k, v in samples.items() if k.startswith("rdma_cni_cni_calls_total{")
               and 'plugin="rdma-macvlan"' in k and 'verb="VERSION"' in k)  # fmt: skip


def version_call(client: str) -> tuple[int, str, str]:
    """CNI VERSION through the thin client ``client`` (a path inside the node) to the node's agent,
    as kubelet's runtime runs a plugin on the node: its fallback is a program that fails, so an
    answer came from the agent."""
    fallback = NODE.dir("/run/rdma-cni") / "upgrade-test-fallback.sh"
    fallback.write_text('#!/bin/sh\necho "fallback ran" >&2\nexit 42\n')
    fallback.chmod(0o755)
    try:
        proc = NODE.run(
            f"echo '{{\"cniVersion\":\"1.0.0\"}}' | CNI_COMMAND=VERSION CNI_PATH=/opt/cni/bin "
            f"RDMA_CNI_FALLBACK=/run/rdma-cni/{fallback.name} {client}",
            check=False,
        )
    finally:
        fallback.unlink()
    return proc.returncode, proc.stdout, proc.stderr


def _as_rdma_macvlan(client_dir: Path) -> str:
    link = client_dir / "rdma-macvlan"
    if not link.exists():
        link.symlink_to("rdma-cni-client")
    return str(link)


def _served(kube: Binaries, client: str) -> dict[str, Any]:
    before = served_calls()
    code, out, err = version_call(client)
    assert code == 0, f"{client}: exit {code}: {err}"
    answer: dict[str, Any] = json.loads(out)
    assert "1.0.0" in answer["supportedVersions"], answer
    w.wait("the agent counted the call", lambda: served_calls() >= before + 1, 30)
    return answer


# --------------------------------------------------------------------------- the steps


def test_the_previous_version_installed_with_helm_runs_an_ibv_app_pod(kube: Binaries) -> None:
    t0 = time.monotonic()
    chart.on_cluster("uninstall", chart.RELEASE, "-n", chart.NAMESPACE, "--ignore-not-found", check=False)
    chart.on_cluster(*old_release("install"))
    ds_ready(kube, PREV.version)
    STATE["old_build"] = installed_build()
    STATE["baseline"] = {NODE.name: w.node_network(NODE)}
    w.apply(kube, w.seed_statefulset(replicas=1))
    STATE["pods"] = seed_pods(kube, 1)
    (pod,) = STATE["pods"].values()
    assert len(pod["bonds"]) == 4 and pod["gid_index"] == invariants.ROCE_V2_INDEX, pod
    TIMES["install previous + 1 pod"] = time.monotonic() - t0


def test_this_versions_thin_client_is_served_by_the_previous_agent(kube: Binaries, tmp_path: Path) -> None:
    """The window of a rollout in which the new client is on disk and the old agent still serves:
    the old agent knows no offer and serves the call as wire version 1."""
    build_c_client(str(tmp_path))
    _served(kube, _as_rdma_macvlan(tmp_path))


def test_helm_upgrade_to_this_version_leaves_the_pod_undisturbed_and_new_pods_start(kube: Binaries) -> None:
    t0 = time.monotonic()
    before, net = STATE["pods"], w.node_network(NODE)
    chart.on_cluster(*chart.release_args("upgrade", "--set", f"image.tag={NEW_TAG}"))
    ds_ready(kube, NEW_TAG)
    STATE["new_build"] = installed_build()
    assert STATE["new_build"] != STATE["old_build"], "the node's plugins are this version's now"
    TIMES["helm upgrade -> DaemonSet rolled"] = time.monotonic() - t0
    assert seed_pods(kube, 1) == before, "the pod the previous version started is undisturbed"
    assert w.node_network(NODE) == net
    scale(kube, 2)  # the node's other 4 bonds, lent by this version
    pods = seed_pods(kube, 2)
    assert {k: v for k, v in pods.items() if k in before} == before
    w.scale_to_zero(kube, "statefulset/ibv-app", SEED)
    w.wait_exact([NODE], STATE["baseline"])  # this version gave back what the previous one lent too
    assert invariants.node_files(NODE)["macvlan records"] == []
    TIMES["upgrade step"] = time.monotonic() - t0


def test_the_previous_thin_client_left_on_disk_is_served_by_this_agent(kube: Binaries) -> None:
    """The other window: the previous bundle (install.sh keeps it beside the current one) still on
    disk, its client run by a runtime that resolved it before the switch."""
    client = f"{LIB}/{STATE['old_build']}/rdma-macvlan"
    assert (NODE.dir("/opt/cni/bin") / "rdma-cni.d" / STATE["old_build"] / "rdma-macvlan").exists()
    _served(kube, client)


def test_helm_rollback_to_the_previous_version_gives_back_what_this_version_lent(kube: Binaries) -> None:
    t0 = time.monotonic()
    scale(kube, 2)
    before, net = seed_pods(kube, 2), w.node_network(NODE)
    revision = next(h["revision"] for h in chart.history() if h["revision"] == 1)
    chart.on_cluster("rollback", chart.RELEASE, str(revision), "-n", chart.NAMESPACE)
    ds_ready(kube, PREV.version)
    assert installed_build() == STATE["old_build"]
    TIMES["helm rollback -> DaemonSet rolled"] = time.monotonic() - t0
    assert seed_pods(kube, 2) == before, "the pods this version started are undisturbed"
    assert w.node_network(NODE) == net
    w.scale_to_zero(kube, "statefulset/ibv-app", SEED)
    w.wait_exact([NODE], STATE["baseline"])  # the previous code gave back what this version recorded
    assert invariants.node_files(NODE)["macvlan records"] == []
    scale(kube, 1)  # and it lends them again
    seed_pods(kube, 1)
    w.scale_to_zero(kube, "statefulset/ibv-app", SEED)
    w.wait_exact([NODE], STATE["baseline"])
    assert [(h["revision"], h["status"]) for h in chart.history()][-1] == (3, "deployed")
    TIMES["rollback step"] = time.monotonic() - t0
