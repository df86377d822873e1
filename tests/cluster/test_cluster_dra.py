"""The DRA variant on a real cluster (tests/cluster: Kubernetes v1.37.2 and containerd 2.4 built from Go
modules; one simulated RDMA node of 8 bonds on 2 NUMA nodes and 4 PCIe roots, 2 bonds a root), installed
as a user installs it: ``kubectl apply -f conf/k8s/dra/``.

In order, on one cluster (module scope): the ResourceSlices and a bond's taint; seed 000's ibv-app
StatefulSet, unchanged, served through the DeviceClass's extendedResourceName; claims that align GPUs
(the stand-in GPU DRA driver, tests/cluster/gpu_dra.py: root r holds GPUs 2r, 2r+1) and NICs by PCIe
root; a claim for a tainted bond; a claim whose config sets a field our driver does not define; the
faults (the driver killed -9 mid-prepare, the kubelet restarted,
an unknown claim unprepared); then shared mode by claim.
"""

from __future__ import annotations

import calendar
import functools
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from cluster import apiread, build, cluster
from cluster import dra as d
from cluster import topology as topo
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import kubectl
from cluster.node import Node
from rdma_cni.proto import dra_v1_pb2, dra_v1_pb2_grpc
from rdma_cni.sim import tree as sim_tree

pytestmark = [pytest.mark.cluster, pytest.mark.dra, pytest.mark.netns]

NODE = Node(1)
SEED = "k8s-app=ibv-app"
DS = "k8s-app=rdma-cni"
GPU_DRIVER = "gpu.nvidia.com"


@pytest.fixture(scope="module")
def kube() -> Iterator[Binaries]:
    """One node labelled, conf/k8s/dra/ applied, the driver's slices published, the GPU DRA driver
    running; everything removed after (``RDMA_CNI_CLUSTER_REUSE=1`` keeps a cluster that is up)."""
    reuse = os.environ.get("RDMA_CNI_CLUSTER_REUSE") == "1"
    with cluster.exclusive():
        if not (reuse and cluster.State.load().procs):
            cluster.up(1)
        try:
            bins = build.binaries()
            w.label_nodes(bins, 1)
            w.apply(bins, d.manifests(failpoint="dra-prepare-spec-written:stop"))
            w.wait_ready(bins, DS, 1, "kube-system", timeout=240)
            w.wait("the driver's 8 devices published", lambda: len(d.devices(bins, node=NODE.name)) == 8, 60)
            d.start_gpu_dra(bins, NODE)
            yield bins
        finally:
            if not reuse:
                cluster.down()


@pytest.fixture(scope="module")
def baseline(kube: Binaries) -> dict[str, Any]:
    for kind, name in (("statefulset", "ibv-app"), ("deployment", "rdma-shared"), ("pod", "gpu-nic-pairs-2")):
        kubectl(kube, "delete", kind, name, "--ignore-not-found", "--wait=true", timeout=180)
    w.wait_gone(kube, SEED)
    time.sleep(2)  # the last DEL's GID update
    return w.node_network(NODE)


def pod(bins: Binaries, name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(kubectl(bins, "get", "pod", name, "-o", "json").stdout)
    return doc


def bonds_of(bins: Binaries, name: str) -> dict[str, str]:
    out = json.loads(w.pod_exec(bins, name, "ip", "-j", "-4", "addr"))
    return {a["ifname"]: a["addr_info"][0]["local"] for a in out if a["ifname"].startswith("bond")}


def wait_exact(before: dict[str, Any], timeout: float = 60) -> None:
    w.wait_exact([NODE], {NODE.name: before}, timeout)


def env_of(bins: Binaries, name: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in w.pod_exec(bins, name, "env").split("\n") if "=" in line)


# --------------------------------------------------------------------------- the slices


def test_resourceslices_show_every_bond_with_the_standard_and_our_attributes(kube: Binaries) -> None:
    devs = d.devices(kube, node=NODE.name)
    assert sorted(devs) == [f"bond{b}" for b in range(topo.BONDS)]
    for b in range(topo.BONDS):
        a = devs[f"bond{b}"]["attrs"]
        assert a[d.ROOT] == sim_tree.pcie_root(b)
        assert a[d.NUMA] == topo.bond_numa(b)
        assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", a[d.BUS]), a[d.BUS]
        assert a["bond"] == f"bond{b}" and a["hca"] == f"mlx5_bond_{b}"
        assert a["linkLayer"] == "Ethernet"
        assert a["gidIndex"] == 3, "the host's RoCE v2 index: the one every pod keeps"
        assert a["ipv4Subnet"] == str(topo.bond_subnet(1, b))
        assert "taints" not in devs[f"bond{b}"] and "allowMultipleAllocations" not in devs[f"bond{b}"]
    # each root holds 2 bonds and 2 GPUs: what the alignment tests rely on
    gpus = d.devices(kube, GPU_DRIVER, NODE.name)
    for r in {a["attrs"][d.ROOT] for a in devs.values()}:
        assert sum(g["attrs"][d.ROOT] == r for g in gpus.values()) == 2
        assert sum(b["attrs"][d.ROOT] == r for b in devs.values()) == 2


def _tainted(bins: Binaries, dev: str) -> bool:
    return bool(d.devices(bins, node=NODE.name).get(dev, {}).get("taints"))


def test_a_bond_set_down_is_tainted_within_a_second_and_untainted_when_it_comes_back(kube: Binaries) -> None:
    t0 = time.monotonic()
    with w.bond_down(NODE, "bond5"):
        w.wait("bond5 tainted", lambda: _tainted(kube, "bond5"), 10, 0.05)
        took = time.monotonic() - t0
        taint = d.devices(kube, node=NODE.name)["bond5"]["taints"][0]
        assert taint["key"] == "rdma.tke.cloud.tencent.com/unhealthy" and taint["effect"] == "NoSchedule"
        assert took < 1.0, f"tainted {took:.2f} s after the link went down"
        assert not any(_tainted(kube, f"bond{b}") for b in range(topo.BONDS) if b != 5)
    w.wait("bond5 untainted", lambda: not _tainted(kube, "bond5"), 10, 0.05)


# --------------------------------------------------------------------------- the seed's pods, unchanged


def test_seed_statefulset_unchanged_runs_two_pods_with_four_bonds_each_and_two_stay_pending(
    kube: Binaries, baseline: dict[str, Any]
) -> None:
    w.apply(kube, w.seed_statefulset())
    w.wait("two seed pods ready", lambda: sum(w.ready(p) for p in w.pods(kube, SEED)) == 2, 240)
    message = w.wait("ibv-app-2 unschedulable", functools.partial(w.unschedulable, kube, "ibv-app-2"), 60)
    assert "cannot allocate all claims" in message or "Insufficient" in message, message
    time.sleep(3)  # nothing more starts
    ps = w.pods(kube, SEED)
    running = sorted(p["metadata"]["name"] for p in ps if w.ready(p))
    pending = sorted(p["metadata"]["name"] for p in ps if p["status"].get("phase") == "Pending")
    # the StatefulSet starts its pods in order (podManagementPolicy OrderedReady, the seed's default):
    # ibv-app-3 is never created while ibv-app-2 waits, so two replicas stay unscheduled
    assert running == ["ibv-app-0", "ibv-app-1"] and pending == ["ibv-app-2"], (running, pending)
    sts = json.loads(kubectl(kube, "get", "statefulset", "ibv-app", "-o", "json").stdout)
    assert sts["spec"]["replicas"] == 4 and sts["status"].get("readyReplicas") == 2
    # no device-plugin resource on this node: the scheduler served tke-shared-rdma through DRA
    assert w.node_capacity(kube, NODE.name) == (0, 0)
    held: set[str] = set()
    for name in running:
        (claim,) = d.claims_of(kube, name)
        devs = sorted(r["device"] for r in d.results(claim))
        assert len(devs) == 4 and all(r["driver"] == d.DRIVER for r in d.results(claim))
        assert not held & set(devs), "no bond in two pods"
        held |= set(devs)
        bonds = bonds_of(kube, name)
        assert sorted(bonds) == devs, "the claim's bonds, and only those, in the pod"
        for ifname, address in bonds.items():
            assert address == topo.bond_ip(1, int(ifname.removeprefix("bond"))), "the bond's own IP"
        indexes = sorted(int(b.removeprefix("bond")) for b in devs)
        infiniband = set(w.pod_exec(kube, name, "ls", "/dev/infiniband").split())
        want = {f"{k}{i}" for i in indexes for k in ("uverbs", "umad", "issm")} | {"rdma_cm"}
        assert infiniband == want
        env = env_of(kube, name)
        assert env["NCCL_IB_GID_INDEX"] == "3", "the host's RoCE v2 index, unified"
        assert env["NCCL_IB_HCA"].lstrip("=").split(",") == [f"mlx5_bond_{i}" for i in indexes]
    node = w.node_network(NODE)
    for b in held:
        ipv4 = [a for a, _ in node["addr"].get(b, []) if ":" not in a]
        assert ipv4 == [], f"{b}'s address moved into its pod, not copied"


def test_seed_scaled_to_zero_leaves_the_node_exact_and_the_claims_unprepared(
    kube: Binaries, baseline: dict[str, Any]
) -> None:
    w.scale_to_zero(kube, "statefulset/ibv-app", SEED)
    wait_exact(baseline)
    w.wait("no prepared claim left", lambda: not d.prepared_records(NODE) and not d.cdi_specs(NODE), 30)
    kubectl(kube, "delete", "statefulset", "ibv-app", "--wait=true")


# --------------------------------------------------------------------------- GPU <-> NIC alignment


def test_two_gpu_nic_pairs_by_pcie_root_each_get_a_nic_under_their_gpus_root(
    kube: Binaries, baseline: dict[str, Any]
) -> None:
    w.apply(kube, d.example("gpu-nic-pairs-2.yaml"))
    try:
        w.wait("gpu-nic-pairs-2 ready", lambda: w.ready(apiread.pod("gpu-nic-pairs-2")), 180)
        (claim,) = d.claims_of(kube, "gpu-nic-pairs-2")
        got = {r["request"]: r for r in d.results(claim)}
        assert sorted(got) == ["gpu-0", "gpu-1", "nic-0", "nic-1"]
        gpus, nics = d.devices(kube, GPU_DRIVER, NODE.name), d.devices(kube, node=NODE.name)
        for i in range(2):
            gpu, nic = got[f"gpu-{i}"], got[f"nic-{i}"]
            assert gpu["driver"] == GPU_DRIVER and nic["driver"] == d.DRIVER
            assert gpus[gpu["device"]]["attrs"][d.ROOT] == nics[nic["device"]]["attrs"][d.ROOT], (gpu, nic)
        # the network is the CNI's: the claim's bonds, with their IPs, in the pod
        assert sorted(bonds_of(kube, "gpu-nic-pairs-2")) == sorted(
            got[f"nic-{i}"]["device"] for i in range(2)
        )
        env = env_of(kube, "gpu-nic-pairs-2")
        assert {k for k in env if k.startswith("GPU_")} == {
            f"GPU_{gpus[got[f'gpu-{i}']['device']]['attrs']['index']}_PCIE_ROOT" for i in range(2)
        }, "the GPU driver's CDI devices reached the container"
    finally:
        kubectl(kube, "delete", "pod", "gpu-nic-pairs-2", "--wait=true", check=False)
    wait_exact(baseline)


def _one_root_claim(n: int) -> str:
    """A pod whose one claim asks for n GPUs and n NICs all under one PCIe root."""
    tmpl = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"one-root-{n}", "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpus", "exactly": {"deviceClassName": GPU_DRIVER, "count": n}},
                        {"name": "nics", "exactly": {"deviceClassName": d.DRIVER, "count": n}},
                    ],
                    "constraints": [{"requests": ["gpus", "nics"], "matchAttribute": d.ROOT}],
                }
            }
        },
    }
    p = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"one-root-{n}", "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": w.TEST_IMAGE,
                    "command": ["sleep", "1000000"],
                    "resources": {"claims": [{"name": "c"}]},
                }
            ],
            "resourceClaims": [{"name": "c", "resourceClaimTemplateName": f"one-root-{n}"}],
        },
    }
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [tmpl, p]})


def test_more_pairs_than_any_root_holds_stays_pending_with_the_schedulers_reason(kube: Binaries) -> None:
    w.apply(kube, _one_root_claim(3))
    try:
        message = w.wait("one-root-3 unschedulable", lambda: w.unschedulable(kube, "one-root-3"), 60)
        assert "cannot allocate all claims" in message, message
        assert pod(kube, "one-root-3")["status"]["phase"] == "Pending"
    finally:
        kubectl(kube, "delete", "pod,resourceclaimtemplate", "one-root-3", "--wait=true", check=False)


def test_a_claim_for_a_tainted_bond_is_not_allocated(kube: Binaries) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "wants-bond6", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "nic",
                        "exactly": {
                            "deviceClassName": d.DRIVER,
                            "selectors": [
                                {"cel": {"expression": f'device.attributes["{d.DRIVER}"].bond == "bond6"'}}
                            ],
                        },
                    }
                ]
            }
        },
    }
    p = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "wants-bond6", "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": w.TEST_IMAGE,
                    "command": ["sleep", "1000000"],
                    "resources": {"claims": [{"name": "c"}]},
                }
            ],
            "resourceClaims": [{"name": "c", "resourceClaimName": "wants-bond6"}],
        },
    }
    with w.bond_down(NODE, "bond6"):
        try:
            w.wait("bond6 tainted", lambda: _tainted(kube, "bond6"), 10, 0.05)
            w.apply(kube, json.dumps({"apiVersion": "v1", "kind": "List", "items": [claim, p]}))
            message = w.wait("wants-bond6 unschedulable", lambda: w.unschedulable(kube, "wants-bond6"), 60)
            assert "cannot allocate all claims" in message, message
            alloc = json.loads(kubectl(kube, "get", "resourceclaim", "wants-bond6", "-o", "json").stdout)
            assert not alloc.get("status", {}).get("allocation"), "never allocated while tainted"
        finally:
            kubectl(kube, "delete", "pod,resourceclaim", "wants-bond6", "--wait=true", check=False)
    w.wait("bond6 untainted", lambda: not _tainted(kube, "bond6"), 10, 0.05)


def _pod_events(bins: Binaries, name: str) -> list[str]:
    events = json.loads(kubectl(bins, "get", "events", "-o", "json", "--field-selector",
                                f"involvedObject.name={name}").stdout)["items"]
    return [f"{e.get('reason')}: {e.get('message')}" for e in events if e.get("type") == "Warning"]


@pytest.mark.tenant
def test_a_claim_whose_config_sets_a_field_the_driver_does_not_define_is_refused_before_prepare(
    kube: Binaries,
) -> None:
    """A pod author's opaque claim config for our driver (docs/security.md, DRA): decoded strictly,
    so ``masters`` (a node key) is refused by name at NodePrepareResources, and nothing is prepared."""
    params = {"apiVersion": "rdma.tke.cloud.tencent.com/v1alpha1", "kind": "RdmaConfig", "masters": ["eth0"]}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "tenant-config", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": d.DRIVER}}],
                                  "config": [{"requests": ["nic"], "opaque": {"driver": d.DRIVER,
                                                                              "parameters": params}}]}}}
    p = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tenant-config", "namespace": "default"},
         "spec": {"terminationGracePeriodSeconds": 1,
                  "containers": [{"name": "app", "image": w.TEST_IMAGE, "command": ["sleep", "1000000"],
                                  "resources": {"claims": [{"name": "c"}]}}],
                  "resourceClaims": [{"name": "c", "resourceClaimName": "tenant-config"}]}}  # fmt: skip
    records = d.prepared_records(NODE)
    w.apply(kube, json.dumps({"apiVersion": "v1", "kind": "List", "items": [claim, p]}))
    try:
        said = w.wait("tenant-config refused at prepare",
                      lambda: next((e for e in _pod_events(kube, "tenant-config") if "masters" in e), None),
                      120)
        print(f"\nclaim config with masters: {said[-300:]}")
        assert "unknown field(s) masters" in said and "from the ResourceClaim" in said, said
        assert d.prepared_records(NODE) == records, "nothing prepared for it"
    finally:
        kubectl(kube, "delete", "pod,resourceclaim", "tenant-config", "--wait=true", check=False)


# --------------------------------------------------------------------------- faults


def _driver_pid() -> int:
    """The driver's process, found in the node's cgroup tree by its command line."""
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            with open(f"/proc/{proc}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{proc}/cgroup") as f:
                cg = f.read()
        except OSError:
            continue
        if b"rdma-dra-driver" in argv and "/rcl-node1" in cg and argv[0].endswith(b"rdma-cni"):
            return int(proc)
    raise AssertionError("rdma-dra-driver is not running on the node")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_the_driver_killed_mid_prepare_is_retried_by_kubelet_and_nothing_is_doubled(
    kube: Binaries, baseline: dict[str, Any]
) -> None:
    armed = NODE.dir("/run/rdma-cni") / os.path.basename(d.FAILPOINT_FILE)
    armed.touch()
    try:
        w.apply(kube, d.example("gpu-nic-pairs-1.yaml"))
        pid = _driver_pid()
        # the failpoint stops the driver after the CDI spec is written, before the claim's record
        w.wait("the driver stopped mid-prepare", lambda: _state(pid) == "T", 120, 0.1)
        armed.unlink()
        os.kill(pid, signal.SIGKILL)
        w.wait(
            "gpu-nic-pairs-1 ready after kubelet's retry",
            lambda: w.ready(apiread.pod("gpu-nic-pairs-1")),
            180,
        )
        (claim,) = d.claims_of(kube, "gpu-nic-pairs-1")
        uid = claim["metadata"]["uid"]
        # exactly this claim's record and spec (a write under way may still hold its temp file a moment)
        w.wait(
            "one record, one spec",
            lambda: (
                d.prepared_records(NODE) == [f"{uid}.json"]
                and len(d.cdi_specs(NODE)) == 1
                and uid in d.cdi_specs(NODE)[0]
            ),
            10,
            0.1,
        )
        assert len(bonds_of(kube, "gpu-nic-pairs-1")) == 1
    finally:
        armed.unlink(missing_ok=True)
        kubectl(kube, "delete", "pod", "gpu-nic-pairs-1", "--wait=true", check=False)
    wait_exact(baseline)
    w.wait("no prepared claim left", lambda: not d.prepared_records(NODE) and not d.cdi_specs(NODE), 30)


def _registered_lines(bins: Binaries) -> list[str]:
    (p,) = w.pods(bins, DS, "kube-system")
    out = kubectl(
        bins,
        "logs",
        "-n",
        "kube-system",
        p["metadata"]["name"],
        "-c",
        "rdma-dra-driver",
        "--timestamps",
        check=False,
    ).stdout
    return [line for line in out.splitlines() if "kubelet registered" in line]


def _stamp(line: str) -> float:
    """kubectl logs --timestamps' RFC 3339 stamp (UTC, nanoseconds) as epoch seconds."""
    stamp = line.split()[0].rstrip("Z")
    whole, _, frac = stamp.partition(".")
    return calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + float(f"0.{frac or 0}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_the_kubelet_restarted_re_registers_the_driver_within_two_seconds_and_its_wiped_slices_come_back(
        kube: Binaries, sig: int) -> None:
    before = len(_registered_lines(kube))
    uids = {s["metadata"]["uid"] for s in d.slices(kube, node=NODE.name)}
    sock = NODE.dir("/var/lib/kubelet") / "device-plugins" / "kubelet.sock"
    t0 = time.monotonic()
    cluster.restart(f"{NODE.name}/kubelet", sig)
    lines = w.wait("the driver registered again", lambda: (ls := _registered_lines(kube))[before:] and ls, 30)
    # from the new kubelet's first socket (its managers are up) to the driver's "kubelet registered"
    took = _stamp(lines[before]) - sock.stat().st_ctime
    assert took < 2.0, f"re-registered {took:.2f} s after the kubelet came back"
    # The new kubelet deletes the node's slices in the background (wipeResourceSlices at its start);
    # the driver's watch sees them go and creates them again: new objects, all 8 devices.
    w.wait("the driver's slices created again after kubelet's wipe",
           lambda: not uids & {s["metadata"]["uid"] for s in d.slices(kube, node=NODE.name)}
           and len(d.devices(kube, node=NODE.name)) == 8, 30, 0.1)
    print(f"\nkubelet restarted -> slices wiped and published again: {time.monotonic() - t0:.1f} s")


def test_unprepare_of_an_unknown_claim_succeeds(kube: Binaries) -> None:
    with grpc.insecure_channel(f"unix:{d.driver_socket(NODE)}") as ch:
        stub = dra_v1_pb2_grpc.DRAPluginStub(ch)
        uid = "0b0e8a4e-6d1f-4a9b-9f0e-3c2d1b0a9f8e"
        req = dra_v1_pb2.NodeUnprepareResourcesRequest(
            claims=[dra_v1_pb2.Claim(namespace="default", uid=uid, name="never-prepared")]
        )
        resp = stub.NodeUnprepareResources(req, timeout=10)
    assert uid in resp.claims and resp.claims[uid].error == ""


# --------------------------------------------------------------------------- shared mode by claim


def test_shared_mode_by_claim_four_pods_share_every_bond_with_addresses_of_their_own(
    kube: Binaries, baseline: dict[str, Any]
) -> None:
    w.apply(kube, d.manifests(rdma_mode="shared"))
    w.wait("shared devices published", functools.partial(d.published, kube, NODE.name, "shared"), 240)
    w.wait_ready(kube, DS, 1, "kube-system", timeout=240)
    w.use_macvlan_link(NODE)
    shared_base = w.node_network(NODE)
    w.apply(kube, d.example("shared-claim.yaml"))
    try:
        ps = w.wait_ready(kube, "app=rdma-shared", 4, timeout=240)
        addrs: dict[str, dict[str, str]] = {}
        for p in ps:
            name = p["metadata"]["name"]
            (claim,) = d.claims_of(kube, name)
            assert sorted(r["device"] for r in d.results(claim)) == [f"bond{b}" for b in range(topo.BONDS)]
            addrs[name] = bonds_of(kube, name)
            assert sorted(addrs[name]) == [f"bond{b}" for b in range(topo.BONDS)]
        for b in range(topo.BONDS):
            mine = [a[f"bond{b}"] for a in addrs.values()]
            assert len(set(mine)) == 4, f"each pod its own address on bond{b}: {mine}"
        a, b2 = list(addrs)[:2]
        out = kubectl(kube, "exec", a, "--", "ping", "-c", "1", "-W", "3", addrs[b2]["bond0"], check=False)
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        kubectl(kube, "delete", "deployment", "rdma-shared", "--wait=true", check=False)
    w.wait_gone(kube, "app=rdma-shared")
    wait_exact(shared_base)
