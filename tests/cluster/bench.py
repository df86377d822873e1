"""``scripts/bench-cluster``: the seed pod on the real test cluster, timed, against a reference pod.

Creation to Running, measured from the client as a user sees it (``kubectl create`` returns -> the
pod's phase is Running with its container started, polled every 50 ms), for:

- the seed pod: seed 000's container with ``nvidia.com/gpu: 4`` and ``tke-shared-rdma: 4`` and the
  annotation ``tke-route-eni,tke-rdma-macvlan`` (4 bonds moved in through rdma-multus);
- the reference: the same pod with neither the RDMA resources nor the annotation (only the
  cluster network, ptp), on the same cluster, interleaved with the seed pods.

"first" is the first seed pod after the DaemonSet came up; then ``--runs`` warm ones. Each pod is
deleted and its bonds are back on the node before the next starts. Also: how long after a kubelet
restart (SIGTERM) its device plugin offers 8 bonds again (kubelet's PodResources view).

``--dra`` then switches the node to the DRA variant (``conf/k8s/dra/``: the same seed pod, unchanged,
served through the DeviceClass's extendedResourceName) and times the same seed pods through it,
interleaved with reference pods again, for the ratio DRA / device plugin; and NodePrepareResources of
a running seed pod's 4-bond claim, called on the driver's socket as kubelet calls it (each call
after an unprepare, so the whole path runs: the claim read from the API server, the CDI spec and the
records written).

``--multus`` then makes upstream Multus (thin, tests/cluster/multus.py) the node's meta plugin
instead of rdma-multus and times the same seed pod with its annotation in Multus's form (the NAD
``rdma-exclusive`` of ``type: rdma-macvlan`` with ``resourceName`` tke-shared-rdma, referenced 4
times), interleaved with reference pods again: pod start under Multus against under rdma-multus, in
one run.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import grpc
import yaml

from cluster import apiread, build, cluster, multus
from cluster import dra as d
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import kubectl
from cluster.node import Node
from cluster.versions import MULTUS
from rdma_cni.proto import dra_v1_pb2, dra_v1_pb2_grpc


def pod_doc(name: str, rdma: bool, networks: dict[str, str] | None = None) -> str:
    """The seed pod (``networks``: its annotations instead of the seed's, e.g. Multus's form)."""
    sts = yaml.safe_load(w.seed_statefulset())
    spec = sts["spec"]["template"]["spec"]
    meta: dict[str, object] = {"name": name, "labels": {"bench": "1"}}
    if rdma:
        meta["annotations"] = networks or sts["spec"]["template"]["metadata"]["annotations"]
    else:
        spec["containers"][0]["resources"] = {}
    spec["terminationGracePeriodSeconds"] = 1
    # One node, but through the scheduler (not nodeName): under DRA it is the scheduler that makes the
    # pod's claim for tke-shared-rdma; a pod bound by nodeName has none and fails admission.
    spec["nodeSelector"] = {"kubernetes.io/hostname": "rdma-node-1"}
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def running(bins: Binaries, name: str) -> bool:
    """The pod Running with every container running: polled every 0.05 s, so read in process."""
    try:
        st = apiread.pod(name).get("status", {})
    except apiread.ReadError:
        return False
    return st.get("phase") == "Running" and all(
        "running" in c.get("state", {}) for c in st.get("containerStatuses", [{}])
    )


def one(bins: Binaries, name: str, rdma: bool, networks: dict[str, str] | None = None) -> float:
    doc = pod_doc(name, rdma, networks)
    t0 = time.monotonic()
    kubectl(bins, "create", "-f", "-", stdin=doc)
    w.wait(f"{name} Running", lambda: running(bins, name), 180, 0.05)
    took = time.monotonic() - t0
    kubectl(bins, "delete", "pod", name, "--wait=true", timeout=180)
    return took


def seed_and_reference(
    bins: Binaries,
    nd: Node,
    clean: dict[str, Any],
    runs: int,
    tag: str,
    networks: dict[str, str] | None = None,
) -> tuple[list[float], list[float]]:
    seed, ref = [], []
    for i in range(runs):
        ref.append(one(bins, f"ref-{tag}{i}", False))
        seed.append(one(bins, f"seed-{tag}{i}", True, networks))
        w.wait_exact([nd], {nd.name: clean})
    return seed, ref


def prepare_p50(bins: Binaries, nd: Node, runs: int) -> float:
    """NodePrepareResources of a running seed pod's claim, after an unprepare each time (ms)."""
    kubectl(bins, "create", "-f", "-", stdin=pod_doc("seed-prepare", True))
    w.wait("seed-prepare Running", lambda: running(bins, "seed-prepare"), 180, 0.05)
    (claim,) = d.claims_of(bins, "seed-prepare")
    meta = claim["metadata"]
    ref = dra_v1_pb2.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])
    took = []
    with grpc.insecure_channel(f"unix:{d.driver_socket(nd)}") as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        for _ in range(runs):
            stub.NodeUnprepareResources(dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[ref]), timeout=30)
            t0 = time.monotonic()
            out = stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(claims=[ref]), timeout=30)
            took.append((time.monotonic() - t0) * 1000)
            assert not out.claims[meta["uid"]].error and len(out.claims[meta["uid"]].devices) == 4, out
    kubectl(bins, "delete", "pod", "seed-prepare", "--wait=true", timeout=180)
    return statistics.median(took)


def window_probe(bins: Binaries) -> str:
    """A seed pod right after the switch: Running, failed (with kubelet's reason) or still Pending."""
    kubectl(bins, "create", "-f", "-", stdin=pod_doc("seed-window", True))
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 120:
            if running(bins, "seed-window"):
                return f"Running after {time.monotonic() - t0:.1f} s"
            st = apiread.pod("seed-window")["status"]
            if st.get("phase") == "Failed":
                return f"Failed: {st.get('reason')}: {st.get('message')}"
            time.sleep(0.2)
        return f"not Running within 120 s: {json.dumps(st.get('conditions'))}"
    finally:
        kubectl(bins, "delete", "pod", "seed-window", "--wait=true", timeout=180)


def switch_to_dra(bins: Binaries, nd: Node) -> None:
    w.apply(bins, d.manifests())
    w.rollout(bins)
    w.wait("the driver's 8 devices", lambda: len(d.devices(bins, node=nd.name)) == 8, 120)
    # kubelet keeps a stopped device plugin's resource registered for 5 minutes (capacity 8,
    # allocatable 0): what a seed pod meets in that window is reported (seen: it runs through DRA)
    logging.info("a seed pod while kubelet still has the device plugin's resource: %s", window_probe(bins))


def switch_to_multus(bins: Binaries, nd: Node) -> None:
    """Upstream Multus instead of rdma-multus, as a user swaps meta plugins: our DaemonSet without its
    meta config, rdma-multus's config removed, the cluster network as a top-level config, Multus's
    own DaemonSet, and the NAD."""
    w.apply(bins, multus.product_without_meta())
    w.rollout(bins)
    (nd.dir("/etc/cni/net.d") / "00-rdma-multus.conflist").unlink(missing_ok=True)
    multus.cluster_network(nd)
    w.apply(bins, multus.deployment("thin"))
    w.wait_ready(bins, multus.SELECTOR, 1, "kube-system", timeout=240)
    w.apply(bins, multus.nad("rdma-exclusive", multus.RDMA_MACVLAN, multus.RESOURCE))
    w.wait("capacity", lambda: w.node_capacity(bins, nd.name) == (8, 8), 120)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="bench: %(message)s", stream=sys.stderr)
    p = argparse.ArgumentParser(prog="scripts/bench-cluster")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--dra", action="store_true", help="also the same pods through the DRA driver")
    p.add_argument("--multus", action="store_true", help="also the same pods under upstream Multus")
    a = p.parse_args(argv)
    with cluster.exclusive():
        try:
            t0 = time.monotonic()
            cluster.up(1)
            up_s = time.monotonic() - t0
            bins = build.binaries()
            w.label_nodes(bins, 1)
            w.apply(bins, w.product_manifest())
            w.wait_ready(bins, "k8s-app=rdma-cni", 1, "kube-system", timeout=300)
            nd = Node(1)
            w.wait("capacity", lambda: w.kubelet_allocatable(nd) == 8, 120)
            # and in the API, where the scheduler reads it: kubelet publishes it at its next node
            # status update (every 10 s), so a pod created before waited Pending for it (the first
            # pod took 9.09 s once the DaemonSet turned Ready ~5 s after the apply)
            t_api = time.monotonic()
            w.wait("allocatable in the API", lambda: w.node_capacity(bins, nd.name) == (8, 8), 60)
            lag = time.monotonic() - t_api
            print(f"the node's allocatable 8 in the API {lag:.2f} s after kubelet offered 8")
            clean = w.node_network(nd)
            first = one(bins, "seed-first", True)
            w.wait_exact([nd], {nd.name: clean})
            seed, ref = seed_and_reference(bins, nd, clean, a.runs, "")
            back = w.restart_kubelet(nd, signal.SIGTERM)
            if a.dra:
                switch_to_dra(bins, nd)
                dra_seed, dra_ref = seed_and_reference(bins, nd, clean, a.runs, "dra-")
                prep = prepare_p50(bins, nd, 20)
            if a.multus:
                switch_to_multus(bins, nd)
                m_first = one(bins, "seed-multus-first", True, multus.references(4))
                w.wait_exact([nd], {nd.name: clean})
                m_seed, m_ref = seed_and_reference(bins, nd, clean, a.runs, "multus-", multus.references(4))
        finally:
            cluster.down()
    p50s, p50r = statistics.median(seed), statistics.median(ref)
    print(f"cluster up (1 node, cached binaries and images): {up_s:.1f} s")
    print(f"seed pod creation->Running, first after the DaemonSet: {first:.2f} s")
    print(
        f"seed pod creation->Running, warm p50 of {a.runs}: {p50s:.2f} s "
        f"(min {min(seed):.2f}, max {max(seed):.2f})"
    )
    print(f"reference pod (no RDMA, no GPU) p50 of {a.runs}: {p50r:.2f} s")
    print(f"ratio seed / reference: {p50s / p50r:.2f}")
    print(
        f"kubelet restarted (SIGTERM): device plugin's 8 bonds offered again {back:.2f} s after kubelet.sock"
    )
    if a.dra:
        p50d, p50dr = statistics.median(dra_seed), statistics.median(dra_ref)
        print(
            f"DRA: seed pod (unchanged, extendedResourceName) creation->Running warm p50 of {a.runs}: "
            f"{p50d:.2f} s (min {min(dra_seed):.2f}, max {max(dra_seed):.2f}); reference p50 {p50dr:.2f} s"
        )
        print(
            f"ratio DRA / device plugin (seed p50): {p50d / p50s:.2f} (goal <= 1.2); "
            f"against each phase's reference: {(p50d / p50dr) / (p50s / p50r):.2f}"
        )
        print(f"NodePrepareResources, a 4-bond claim on the real API server, p50 of 20: {prep:.1f} ms")
    if a.multus:
        p50m, p50mr = statistics.median(m_seed), statistics.median(m_ref)
        print(
            f"upstream Multus {MULTUS} (thin): seed pod (NAD rdma-exclusive x4) creation->Running "
            f"first {m_first:.2f} s, warm p50 of {a.runs}: {p50m:.2f} s (min {min(m_seed):.2f}, max "
            f"{max(m_seed):.2f}); reference p50 {p50mr:.2f} s"
        )
        print(
            f"ratio Multus / rdma-multus (seed p50): {p50m / p50s:.2f}; against each phase's reference: "
            f"{(p50m / p50mr) / (p50s / p50r):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
