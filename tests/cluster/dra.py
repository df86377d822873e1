"""What a user does with the DRA variant on the test cluster, as functions the DRA tests, the demo and
the benchmark share: apply ``conf/k8s/dra/``, run the stand-in GPU DRA driver, read the node's
ResourceSlices and a pod's claims, and talk to the driver's socket the way kubelet does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

from cluster import apiread, procs
from cluster.build import Binaries
from cluster.cluster import State, kubectl
from cluster.gpu_dra import DEVICE_CLASS
from cluster.gpu_dra import DRIVER as GPU_DRIVER
from cluster.node import WORK, Node
from cluster.topology import BONDS
from cluster.workloads import REPO, TEST_IMAGE, bare_pod, wait

DRA_DIR = REPO / "conf" / "k8s" / "dra"
EXAMPLES = DRA_DIR / "examples"
DRIVER = "rdma.tke.cloud.tencent.com"
ROOT = "resource.kubernetes.io/pcieRoot"
NUMA = "resource.kubernetes.io/numaNode"
BUS = "resource.kubernetes.io/pciBusID"
FAILPOINT_FILE = "/run/rdma-cni/dra-failpoint-armed"  # node path; rdma-run is mounted in the driver


def manifests(tag: str = "0.1.0", rdma_mode: str = "exclusive", failpoint: str = "") -> str:
    """conf/k8s/dra/*.yaml as a user applies them, with the image tag and RDMA_MODE edited; given a
    failpoint, the driver's container carries it, armed only while FAILPOINT_FILE exists on the
    node (a test-only edit: the driver runs unchanged until the test arms it)."""
    docs: list[dict[str, Any]] = []
    for path in sorted(DRA_DIR.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for d in docs:
        if d["kind"] != "DaemonSet":
            continue
        spec = d["spec"]["template"]["spec"]
        for c in [*spec["initContainers"], *spec["containers"]]:
            c["image"] = f"rdma-cni:{tag}"
            for e in c.get("env", []):
                if e["name"] == "RDMA_MODE":
                    e["value"] = rdma_mode
            if c["name"] == "rdma-dra-driver" and failpoint:
                c["env"] += [
                    {"name": "RDMA_CNI_FAILPOINT", "value": failpoint},
                    {"name": "RDMA_CNI_FAILPOINT_ARMED", "value": FAILPOINT_FILE},
                ]
    return yaml.safe_dump_all(docs)


def example(name: str, image: str = TEST_IMAGE) -> str:
    """An example of conf/k8s/dra/examples with its image replaced (no registry of its is reachable)."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    for d in docs:
        spec = d.get("spec", {})
        spec = spec.get("template", {}).get("spec", spec) if d["kind"] == "Deployment" else spec
        for c in spec.get("containers", []):
            c["image"] = image
            c["command"] = ["sleep", "1000000"]
        if d["kind"] in ("Pod", "Deployment"):
            spec["terminationGracePeriodSeconds"] = 1
    return yaml.safe_dump_all(docs)


SHARED_EXAMPLE = "shared-claim.yaml"


def _shared_example(kind: str) -> dict[str, Any]:
    return next(x for x in yaml.safe_load_all(example(SHARED_EXAMPLE)) if x and x["kind"] == kind)


def shared_claim_template() -> str:
    """examples/shared-claim.yaml's ResourceClaimTemplate (every bond, one share of each): apply it
    once, before :func:`shared_claim_pod`'s pods."""
    return yaml.safe_dump(_shared_example("ResourceClaimTemplate"))


def shared_claim_pod(name: str) -> str:
    """One pod of examples/shared-claim.yaml's Deployment, bare (:func:`workloads.bare_pod`): its
    claim is made from :func:`shared_claim_template`."""
    return bare_pod(_shared_example("Deployment"), name)


def published(bins: Binaries, node: str, mode: str = "exclusive") -> bool:
    """The node's bonds all published in the mode's form: multi-allocatable in shared mode, not in
    exclusive mode. Until the driver republishes them after a switch, a pod of the new mode finds no
    device its DeviceClass selects."""
    devs = devices(bins, node=node)
    return len(devs) == BONDS and all(
        bool(x.get("allowMultipleAllocations")) == (mode == "shared") for x in devs.values()
    )


def start_gpu_dra(bins: Binaries, node: Node) -> None:
    """The stand-in GPU DRA driver in the node's namespaces, recorded so ``down`` ends it, and its
    DeviceClass; returns once its slice is published."""
    kubectl(bins, "apply", "-f", "-", stdin=json.dumps(DEVICE_CLASS))
    stop_gpu_dra(node)  # a reused cluster's: two would publish the one slice over each other
    repo = Path(__file__).resolve().parents[2]
    argv = [
        sys.executable,
        "-m",
        "cluster.gpu_dra",
        "--node",
        node.name,
        "--kubeconfig",
        str(WORK / "pki" / "admin.kubeconfig"),
    ]
    env = dict(procs.node_env(), PYTHONPATH=f"{repo / 'tests'}:{repo}")
    st = State.load()
    proc = procs.spawn(
        f"{node.name}/gpu-dra", argv, WORK / "logs" / node.name / "gpu-dra.log", node.netns, node.mntns, env
    )
    st.procs.append(proc)
    st.save()
    wait(f"{node.name}'s GPU slice", lambda: len(devices(bins, GPU_DRIVER, node.name)) == 8, 60)


def stop_gpu_dra(node: Node) -> None:
    st = State.load()
    mine = [p for p in st.procs if p.name == f"{node.name}/gpu-dra"]
    procs.stop(mine)
    st.procs = [p for p in st.procs if p not in mine]
    st.save()


def slices(bins: Binaries, driver: str = DRIVER, node: str = "") -> list[dict[str, Any]]:
    """The items of ``kubectl get resourceslices -o json`` of ``driver`` (and ``node``), read in process:
    the waits for slices and taints poll this (cluster.apiread says why)."""
    return [
        s
        for s in apiread.resourceslices()
        if s["spec"]["driver"] == driver and (not node or s["spec"].get("nodeName") == node)
    ]


def devices(bins: Binaries, driver: str = DRIVER, node: str = "") -> dict[str, dict[str, Any]]:
    """device name -> the device as published (attributes flattened to their values)."""
    out: dict[str, dict[str, Any]] = {}
    for s in slices(bins, driver, node):
        for d in s["spec"].get("devices", []):
            attrs = {k: next(iter(v.values())) for k, v in d.get("attributes", {}).items()}
            out[d["name"]] = {**d, "attrs": attrs}
    return out


def claims_of(bins: Binaries, pod: str, namespace: str = "default") -> list[dict[str, Any]]:
    """The ResourceClaims the pod holds: its own (status.resourceClaimStatuses) and the one the
    scheduler made for its extended resources (status.extendedResourceClaimStatus)."""
    doc = json.loads(kubectl(bins, "get", "pod", pod, "-n", namespace, "-o", "json").stdout)
    status = doc.get("status", {})
    names = [
        c["resourceClaimName"] for c in status.get("resourceClaimStatuses", []) if c.get("resourceClaimName")
    ]
    ext = status.get("extendedResourceClaimStatus", {}).get("resourceClaimName")
    if ext:
        names.append(ext)
    return [
        json.loads(kubectl(bins, "get", "resourceclaim", n, "-n", namespace, "-o", "json").stdout)
        for n in names
    ]


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = (
        claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    )
    return out


def driver_socket(node: Node) -> Path:
    return node.dir("/var/lib/kubelet") / "plugins" / DRIVER / "dra.sock"


def prepared_records(node: Node) -> list[str]:
    d = node.dir("/var/lib/kubelet") / "plugins" / DRIVER / "claims"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def cdi_specs(node: Node) -> list[str]:
    d = node.dir("/run/cdi")
    return (
        sorted(p.name for p in d.iterdir() if p.name.startswith(DRIVER.replace("/", "-")))
        if d.is_dir()
        else []
    )
