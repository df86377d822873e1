"""Two real versions meet on the test cluster: the previous version (tests/upgrade/versions.json:
its commit's chart, and its image built by its own scripts, cluster.previous) and this working
tree, with TKE's ibv-app StatefulSet holding bonds throughout. In order, on one one-node cluster
(module scope; each test reads the state the one before it left, as an operator's session does):

1. ``helm install`` of the previous chart and image; an ibv-app pod Running with its 4 bonds;
2. the rolling-update window before the upgrade: this version's thin client (wire 1-2, three fds)
   beside the previous agent, which refuses it (it takes two fds): the call runs in-process, right
   and slower;
3. ``helm upgrade`` to this chart and image: the running pod undisturbed (same UID, container,
   restarts, bonds, addresses, device nodes, GID index), a new pod started by the new code, then
   both deleted and the node exact: the new code gave back what the old code lent;
4. the window after it: the previous version's client, still on disk in the node's kept bundle
   dir, is served by this agent;
5. ``helm rollback`` to the previous revision with pods this version started: they stay
   undisturbed, and once deleted the old code gives back exactly what the new code recorded;
6. the same three moves in shared mode (``rdmaMode=shared``, ``shared.link=macvlan``: this kernel
   has no IPVLAN), rdma-ipvlan's records and addresses;
7. and with the DRA driver (``frontEnd=dra``): a claim prepared by one driver is answered and
   unprepared by the other, in both directions.

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
from cluster import dra as d
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
    t_lock = time.monotonic()
    with cluster.exclusive():
        t1 = time.monotonic()
        TIMES["waiting for the cluster lock"] = t1 - t_lock
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
    TIMES["whole file, without the lock's wait"] = TIMES["whole file"] - TIMES["waiting for the cluster lock"]
    print("\nupgrade scenarios, wall time (s): " + json.dumps({k: round(v, 1) for k, v in TIMES.items()}))


def old_release(verb: str, *sets: str) -> list[str]:
    """``helm install|upgrade`` of the previous version's chart with its image."""
    return [verb, chart.RELEASE, str(STATE["old_chart"]), "--namespace", chart.NAMESPACE,
            "--set", "image.repository=rdma-cni", "--set", f"image.tag={PREV.version}", *sets]  # fmt: skip


def ds_ready(kube: Binaries, tag: str, offer: int = 8) -> list[dict[str, Any]]:
    """The DaemonSet rolled to ``tag`` and Ready, the node offering its devices again (8 bonds, or
    shared mode's 1000; 0: the DRA driver's 8 devices in its ResourceSlice)."""
    w.rollout(kube, timeout=240)
    ds = w.wait_ready(kube, DS, NODES, "kube-system", timeout=120)
    images = {c["image"] for p in ds
              for c in [*p["spec"].get("initContainers", []), *p["spec"]["containers"]]}  # fmt: skip
    assert images == {f"rdma-cni:{tag}"}, images
    if offer:
        w.wait(f"{NODE.name} offers {offer}", lambda: w.node_capacity(kube, NODE.name) == (offer, offer), 90)
    else:
        w.wait("the DRA driver's 8 devices", lambda: len(d.devices(kube, node=NODE.name)) == 8, 90)
    return ds


def upgrade_to_this_version(*sets: str) -> None:
    """``helm upgrade`` to this working tree's chart and image (the chart's defaults and ``sets``)."""
    chart.on_cluster(*chart.release_args("upgrade", "--set", f"image.tag={NEW_TAG}", *sets))


def rollback_to(revision: object) -> None:
    chart.on_cluster("rollback", chart.RELEASE, str(revision), "-n", chart.NAMESPACE)


def installed_build() -> str:
    """The BUILD_ID the node's plugins run now (install.sh's ``current`` link)."""
    return os.readlink(NODE.dir("/opt/cni/bin") / "rdma-cni.d" / "current")


def look(pod: dict[str, Any]) -> invariants.PodView:
    """The pod's bonds, device nodes and environment, seen from the host."""
    name = pod["metadata"]["name"]
    seen: invariants.PodView = w.wait(f"{name}'s container seen from the host",
                                      functools.partial(invariants.pod_view, NODE, pod), 30)  # fmt: skip
    return seen


def seed_pods(kube: Binaries, count: int, dra: bool = False) -> dict[str, dict[str, Any]]:
    """The ibv-app pods (``count`` of them, Ready) as each must stay across a rollout: UID,
    container, restarts, and what the host sees in it; each exactly what was allocated to it (by
    kubelet from the device plugin, or by the scheduler to its claim)."""
    ps = w.wait_ready(kube, SEED, count, timeout=240)
    held = {} if dra else invariants.allocations(NODE)
    assert held is not None, "the node's kubelet answers PodResources"
    out = {}
    for p in ps:
        name = p["metadata"]["name"]
        seen = look(p)
        allocated = invariants.claim_bonds(p) if dra else held.get(("default", name), set())
        assert allocated, f"{name}: no bonds allocated"
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


def agent_count(name: str, *labels: str) -> float:
    """The sum of the node's agent's samples of counter ``name`` that carry every one of ``labels``
    (``'plugin="rdma-macvlan"'``...), from its /metrics."""
    read = functools.partial(invariants.metrics, NODE)
    samples: dict[str, float] = w.wait("the agent's /metrics", read, 60)
    return sum(v for k, v in samples.items() if k.startswith(name) and all(x in k for x in labels))


def served_calls() -> float:
    """How many VERSION calls of rdma-macvlan the node's agent has served."""
    return agent_count("rdma_cni_cni_calls_total{", 'plugin="rdma-macvlan"', 'verb="VERSION"')


def refused_calls() -> float:
    """How many calls the node's agent refused (the client then ran them in-process)."""
    return agent_count("rdma_cni_agent_refused_calls_total")


def version_call(client: str, in_process: str = "") -> tuple[int, str, str]:
    """CNI VERSION through the thin client ``client`` (a path inside the node) to the node's agent,
    as kubelet's runtime runs a plugin on the node. Its fallback is ``in_process`` (a bundle's
    program, which runs the call when the agent refuses it), or else a program that fails, so an
    answer came from the agent."""
    fallback = NODE.dir("/run/rdma-cni") / "upgrade-test-fallback.sh"
    if not in_process:
        fallback.write_text('#!/bin/sh\necho "fallback ran" >&2\nexit 42\n')
        fallback.chmod(0o755)
    try:
        proc = NODE.run(
            f"echo '{{\"cniVersion\":\"1.0.0\"}}' | CNI_COMMAND=VERSION CNI_PATH=/opt/cni/bin "
            f"RDMA_CNI_FALLBACK={in_process or '/run/rdma-cni/' + fallback.name} {client}",
            check=False,
        )
    finally:
        fallback.unlink(missing_ok=True)
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


def test_this_versions_thin_client_beside_the_previous_agent_runs_its_call_in_process(
    kube: Binaries, tmp_path: Path
) -> None:
    """The window of a rollout in which the new client is on disk and the old agent still serves.
    The previous agent takes exactly 2 fds (net, mnt) and refuses this client's 3 (net, mnt, root);
    the client then runs the call in-process (its fallback: here the previous bundle's program,
    the only one on the node yet), so the answer is right and only slower. Not retried with 2 fds:
    for a chrooted caller (Multus thick's delegates) the old agent would run it at the wrong root,
    and the client cannot tell that case from the inside."""
    build_c_client(str(tmp_path))
    client = _as_rdma_macvlan(tmp_path)
    in_process = f"{LIB}/{STATE['old_build']}/rdma-cni"
    refused, served = refused_calls(), served_calls()
    t0 = time.monotonic()
    code, out, err = version_call(client, in_process)
    TIMES["new client, old agent: VERSION in-process"] = time.monotonic() - t0
    assert code == 0, f"exit {code}: {err}"
    assert "1.0.0" in json.loads(out)["supportedVersions"], out
    w.wait("the previous agent counted its refusal", lambda: refused_calls() >= refused + 1, 30)
    assert served_calls() == served, "the previous agent ran a call it should have refused"
    t0 = time.monotonic()
    _served(kube, f"{LIB}/{STATE['old_build']}/rdma-macvlan")
    TIMES["old client, old agent: VERSION served"] = time.monotonic() - t0


def test_helm_upgrade_to_this_version_leaves_the_pod_undisturbed_and_new_pods_start(kube: Binaries) -> None:
    t0 = time.monotonic()
    before, net = STATE["pods"], w.node_network(NODE)
    upgrade_to_this_version()
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
    rollback_to(1)
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


# --------------------------------------------------------------------------- shared mode

SHARED = "app=rdma-shared"
SHARED_SETS = ("--set", "rdmaMode=shared", "--set", "shared.link=macvlan")  # this kernel has no IPVLAN


def shared_pods(kube: Binaries, count: int) -> dict[str, dict[str, Any]]:
    """The shared pods (Ready) as each must stay across a rollout: every bond, an address of its own
    on each, no address in two pods."""
    ps = w.wait_ready(kube, SHARED, count, timeout=240)
    out = {}
    for p in ps:
        name = p["metadata"]["name"]
        seen = look(p)
        assert invariants.shared_errors(NODE, seen) == [], (name, seen)
        status = p["status"]["containerStatuses"][0]
        out[name] = {"uid": p["metadata"]["uid"], "container": status["containerID"],
                     "restarts": status["restartCount"], "bonds": seen.bonds}  # fmt: skip
    addresses = {n: [a for x in v["bonds"].values() for a in x] for n, v in out.items()}
    assert invariants.duplicates(addresses) == [], addresses
    return out


def test_shared_mode_upgrade_and_rollback_keep_each_pods_addresses_and_give_them_back(
    kube: Binaries,
) -> None:
    """The same in shared mode (rdma-ipvlan's records, 1000 virtual devices): the previous version
    switched to shared with no pod holding a device, two pods, the upgrade (a third pod started by
    the new code), the rollback, and every address back on the pods' deletion."""
    t0 = time.monotonic()
    chart.on_cluster(*old_release("upgrade", *SHARED_SETS))
    ds_ready(kube, PREV.version, offer=1000)
    w.apply(kube, w.shared_deployment(replicas=2))
    try:
        before = shared_pods(kube, 2)
        upgrade_to_this_version(*SHARED_SETS)
        ds_ready(kube, NEW_TAG, offer=1000)
        assert shared_pods(kube, 2) == before, "the pods the previous version started are undisturbed"
        kubectl(kube, "scale", "deployment", "rdma-shared", "--replicas=3")
        after = shared_pods(kube, 3)
        assert {k: v for k, v in after.items() if k in before} == before
        rollback_to(chart.history()[-2]["revision"])  # the previous version in shared mode
        ds_ready(kube, PREV.version, offer=1000)
        assert shared_pods(kube, 3) == after, "the pods this version started are undisturbed"
        w.scale_to_zero(kube, "deployment/rdma-shared", SHARED)
    finally:
        kubectl(kube, "delete", "deployment", "rdma-shared", "--wait=false", check=False)
    w.wait_gone(kube, SHARED)
    w.wait_exact([NODE], STATE["baseline"])  # the previous code gave back this version's addresses
    assert invariants.node_files(NODE)["ipvlan records"] == []
    TIMES["shared mode step"] = time.monotonic() - t0


# --------------------------------------------------------------------------- the DRA driver


def test_dra_upgrade_and_rollback_keep_the_claims_pods_and_either_driver_unprepares_the_others(
    kube: Binaries,
) -> None:
    """frontEnd=dra: the previous driver prepares a claim (its records have no ``schema`` key), this
    driver answers it across the upgrade and prepares one of its own (``schema: 1``), and after the
    rollback the previous driver unprepares both: no prepared record, CDI spec or address left."""
    t0 = time.monotonic()
    chart.on_cluster("uninstall", chart.RELEASE, "-n", chart.NAMESPACE, "--wait", "--timeout", "120s")
    chart.on_cluster(*old_release("install", "--set", "frontEnd=dra"))
    ds_ready(kube, PREV.version, offer=0)
    w.apply(kube, w.seed_statefulset(replicas=1))
    try:
        before = seed_pods(kube, 1, dra=True)
        prepared = invariants.node_files(NODE)["prepared claims"]
        assert len(prepared) == 1, prepared
        upgrade_to_this_version("--set", "frontEnd=dra")
        ds_ready(kube, NEW_TAG, offer=0)
        assert seed_pods(kube, 1, dra=True) == before, "the claim's pod is undisturbed"
        scale(kube, 2)
        after = seed_pods(kube, 2, dra=True)
        assert {k: v for k, v in after.items() if k in before} == before
        rollback_to(chart.history()[-2]["revision"])
        ds_ready(kube, PREV.version, offer=0)
        assert seed_pods(kube, 2, dra=True) == after, "the pods this driver prepared are undisturbed"
        w.scale_to_zero(kube, "statefulset/ibv-app", SEED)
    finally:
        kubectl(kube, "delete", "statefulset", "ibv-app", "--ignore-not-found", "--wait=true", timeout=180)
    w.wait_exact([NODE], STATE["baseline"])
    w.wait("every claim unprepared", lambda: not invariants.node_files(NODE)["prepared claims"], 60)
    assert invariants.node_files(NODE)["CDI specs"] == []
    chart.on_cluster("uninstall", chart.RELEASE, "-n", chart.NAMESPACE, "--wait", "--timeout", "120s")
    TIMES["DRA step"] = time.monotonic() - t0
