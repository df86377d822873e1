"""``cni-tool doctor --pods`` end to end: a simulated 8-bond GPU node (root r holds bonds 2r, 2r+1,
roots 0-1 on NUMA 0, 2-3 on NUMA 1, bonds in a node netns), a test kubelet serving PodResources v1
with device-plugin devices and DRA claims, and a loopback API server serving the ResourceSlices of
the stand-in GPU DRA driver (tests/cluster/gpu_dra.py: gpu.nvidia.com, GPUs 2r, 2r+1 under root r)
and of rdma-dra-driver (rdma_cni/dra/slices.py). What it could not read is said, never a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import netns
import pytest
from cluster.gpu_dra import slice_doc
from cluster.gpu_plugin import layout
from dra_api import DraApi
from kube_server import Pki

from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot
from rdma_cni.doctor.diagnose import diagnose
from rdma_cni.doctor.findings import FAIL, OK, SKIP, WARN, Finding, exit_code
from rdma_cni.doctor.node import NodePaths
from rdma_cni.doctor.pod_view import api_config
from rdma_cni.dra.slices import slice_specs
from rdma_cni.kube import podresources
from rdma_cni.rdma.sysfs import gid_for_ip
from rdma_cni.sim import tree
from rdma_cni.sim.podresources import PodResourcesServer, claim, device
from tests.doctor.test_doctor import paths

GPU, NIC = "gpu.nvidia.com", "rdma.tke.cloud.tencent.com"
NODE = "node-a"
RDMA = "tke.cloud.tencent.com/tke-shared-rdma"


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[netns.Node]:
    reason = netns.can_run()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(netns, "PREFIX", "h29d-")
    with netns.node() as n:
        yield n


@pytest.fixture
def kubelet() -> Iterator[PodResourcesServer]:
    d = tempfile.mkdtemp(prefix="h29d-pr-")  # a unix socket path must fit in 108 bytes
    try:
        with PodResourcesServer(os.path.join(d, "kubelet.sock")) as server:
            yield server
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[DraApi]:
    server = DraApi(Pki(tmp_path / "pki"), node=NODE)
    with server:
        yield server


def gpu_node(tmp: Path, n: netns.Node) -> str:
    """8 bonds with PCI parents (bond i: function i, root i // 2, NUMA i // 4), each with its IPv4
    RoCE v2 GID at index 3 and its address in the node netns, as a healthy node has them."""
    bonds = [tree.SimBond(f"bond{i}", f"mlx5_bond_{i}", numa_node=i // 4) for i in range(8)]
    root = tree.build_tree(str(tmp / "sim-sys"), bonds, gid_slots=16)
    for i, b in enumerate(bonds):
        ip = f"198.51.100.{16 * i + 2}"
        tree.write_slot(root, b.device, 1, 3, gid_for_ip(ip), b.name)
        n.bond(b.name, f"{ip}/28")
    return root


def publish(api: DraApi) -> None:
    """The node's two drivers' slices, as they publish them."""
    bonds = [RdmaBond(f"mlx5_bond_{i}", f"bond{i}", 1, i // 4, f"uverbs{i}", pci=tree.pci_address(i),
                      pcie_root=tree.pcie_root(i)) for i in range(8)]  # fmt: skip
    snap = Snapshot(tuple(bonds), tuple(DeviceHealth(b.id, True, "") for b in bonds))
    [ours] = slice_specs(NODE, snap, {}, None)
    gpus = slice_doc(NODE, api.node_uid, layout())
    api.slices = {
        "node-a-rdma": {"metadata": {"name": "node-a-rdma", "resourceVersion": "1"}, "spec": ours},
        gpus["metadata"]["name"]: {**gpus, "metadata": {**gpus["metadata"], "resourceVersion": "2"}},
    }


def pods(kubelet: PodResourcesServer) -> None:
    """Two DRA pods (2 pairs by pcieRoot; one pair across NUMA nodes), a device-plugin pod (the
    seed's: 4 GPUs of the stand-in plugin, 4 bonds of rdma-device-plugin, all on NUMA 0) and a pod
    with neither."""
    def pair_claim(name: str, gpus: list[int], nics: list[int]) -> dict[str, list]:  # type: ignore[type-arg]
        return {"main": [claim("default", name, *[device(GPU, NODE, f"gpu-{g}") for g in gpus],
                               *[device(NIC, NODE, f"bond{b}") for b in nics])]}  # fmt: skip

    kubelet.set_pod("default", "pairs-2", {"main": {}}, claims=pair_claim("pairs-2", [0, 2], [0, 2]))
    kubelet.set_pod("default", "crossed", {"main": {}}, claims=pair_claim("crossed", [0], [6]))
    kubelet.set_pod("default", "ibv-app-0", {"trainer": {
        "nvidia.com/gpu": [f"gpu-{i}" for i in range(4)], RDMA: [f"mlx5_bond_{i}" for i in range(4)]}})
    kubelet.set_pod("default", "web", {"nginx": {}})
    kubelet.set_allocatable("nvidia.com/gpu", {f"gpu-{i}": i // 4 for i in range(8)})
    kubelet.set_allocatable(RDMA, {f"mlx5_bond_{i}": i // 4 for i in range(8)})


def setup(n: netns.Node, tmp: Path, kubelet: PodResourcesServer | None) -> NodePaths:
    pr = os.path.dirname(kubelet.socket) if kubelet else str(tmp / "no-pod-resources")
    return paths(n, gpu_node(tmp, n), tmp, pod_resources_dir=pr)


def pod_lines(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings if f.check == "pods" or f.check.startswith("pod ")}


def doctor_cli(p: NodePaths, *args: str) -> subprocess.CompletedProcess[str]:
    """``cni-tool doctor`` on ``p``, outside any pod (no KUBERNETES_* in its environment)."""
    opts = ["--sysfs-root", p.sysfs_root, "--netns", p.netns, "--cni-bin-dir", p.cni_bin_dir,
            "--conf-dir", p.conf_dir, "--kubelet-root-dir", p.kubelet_root_dir,
            "--pod-resources-dir", p.pod_resources_dir, "--data-dir", p.data_dir, "--run-dir", p.run_dir,
            *[a for d in p.results_dirs for a in ("--cache-dir", d)]]  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    return subprocess.run([sys.executable, "-m", "rdma_cni.cli.tool", "doctor", *args, *opts],
                          capture_output=True, text=True, timeout=120, check=False, env=base)


def test_doctor_pods_shows_which_gpu_and_nic_share_a_root_per_pod(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer, api: DraApi
) -> None:
    p = setup(node, tmp_path, kubelet)
    publish(api)
    pods(kubelet)
    kc = api.kubeconfig(tmp_path / "kubeconfig")
    run = doctor_cli(p, "--pods", "--json", "--kubeconfig", str(kc))
    report = json.loads(run.stdout)
    found = pod_lines([Finding(**f) for f in report["findings"]])
    assert run.returncode == 0, run.stdout + run.stderr  # the node is healthy; no pod line FAILs
    src = found["pods"]
    assert src.status == OK, src
    assert "4 pods, 3 containers with GPUs or RDMA NICs" in src.detail
    assert f"ResourceSlices of {GPU} node-a, {NIC} node-a read (kubeconfig {kc})" in src.detail
    # only the two drivers' pools were asked for, by field selector
    asked = sorted(r["path"] for r in api.requests if "resourceslices" in r["path"])
    assert asked == [f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3D{d}%2C"
                     f"spec.pool.name%3Dnode-a" for d in (GPU, NIC)]  # fmt: skip

    pairs = "pod default/pairs-2 main"
    assert found[pairs].status == OK and found[pairs].detail == "aligned by PCIe root: 2 GPUs, 2 RDMA NICs"
    assert found[f"{pairs} gpu-0"].detail == \
        "pci0000:00, NUMA 0 (claim default/pairs-2): under its root: bond0"  # fmt: skip
    assert found[f"{pairs} gpu-2"].detail == \
        "pci0000:20, NUMA 0 (claim default/pairs-2): under its root: bond2"  # fmt: skip

    crossed = "pod default/crossed main"
    assert found[crossed].status == WARN and found[crossed].detail.startswith("unaligned")
    assert "matchAttribute" in found[crossed].fix
    assert found[f"{crossed} gpu-0"].detail.endswith("no RDMA NIC under its root or on its NUMA node")
    assert "bond6 (pci0000:60, NUMA 1, claim default/crossed)" in found[f"{crossed} NICs apart"].detail

    seed = "pod default/ibv-app-0 trainer"
    assert found[seed].status == OK and found[seed].detail.startswith("aligned by NUMA node only: 4 GPUs")
    assert found[f"{seed} gpu-1"].detail == ("root unknown (device plugin GPU), NUMA 0 (nvidia.com/gpu): "
                                            "on its NUMA node: bond0, bond1, bond2, bond3")  # fmt: skip
    assert not any("default/web" in c for c in found)

    text = doctor_cli(p, "--pods", "--kubeconfig", str(kc))
    assert text.returncode == 0
    assert any(line.startswith("OK") and "pod default/pairs-2 main gpu-2" in line and "bond2" in line
               for line in text.stdout.splitlines()), text.stdout  # fmt: skip


def test_without_pods_flag_nothing_is_asked_of_the_api(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer, api: DraApi
) -> None:
    p = setup(node, tmp_path, kubelet)
    pods(kubelet)
    run = doctor_cli(p, "--kubeconfig", str(api.kubeconfig(tmp_path / "kc")))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "pod default/" not in run.stdout and api.requests == []


def test_no_api_server_is_said_and_our_nics_still_come_from_sysfs(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    p = setup(node, tmp_path, kubelet)
    pods(kubelet)
    access = api_config("", p.conf_dir, {})
    assert access.config is None
    found = pod_lines(findings := diagnose(p, access))
    assert exit_code(findings) == 0
    assert found["pods"].status == WARN
    assert "ResourceSlices not read: no API server known: not in a pod, no --kubeconfig" \
        in found["pods"].detail  # fmt: skip
    pairs = "pod default/pairs-2 main"
    assert found[pairs].status == SKIP and found[pairs].detail.startswith("alignment unknown")
    assert found[f"{pairs} gpu-0"].detail.startswith("ResourceSlices not read: no API server known")
    # the GPUs' places are unknown, the bonds' are not: the device-plugin pod is judged as before
    assert found["pod default/ibv-app-0 trainer"].detail.startswith("aligned by NUMA node only")


def test_api_refusing_the_list_names_the_rbac_and_installed_kubeconfig_is_found(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer, api: DraApi
) -> None:
    p = setup(node, tmp_path, kubelet)
    publish(api)
    pods(kubelet)
    installed = Path(p.conf_dir) / "rdma-multus.d" / "rdma-multus.kubeconfig"
    api.kubeconfig(installed)
    access = api_config("", p.conf_dir, {})
    assert access.where == f"kubeconfig {installed}"
    api.forbid = {"get"}
    found = pod_lines(diagnose(p, access))
    assert found["pods"].status == WARN and "403" in found["pods"].detail
    assert "list' on resourceslices" in found["pods"].detail
    api.forbid = set()
    found = pod_lines(diagnose(p, access))
    assert found["pods"].status == OK and found["pod default/pairs-2 main"].status == OK


def test_no_pod_resources_socket_is_a_skip_and_the_doctor_does_not_fail(
    node: netns.Node, tmp_path: Path
) -> None:
    p = setup(node, tmp_path, None)
    findings = diagnose(p, api_config("", p.conf_dir, {}))
    assert exit_code(findings) == 0
    found = pod_lines(findings)
    assert list(found) == ["pods"] and found["pods"].status == SKIP
    assert "no kubelet PodResources socket" in found["pods"].detail
    assert all(f.status != FAIL for f in findings)


def test_each_container_is_judged_with_its_own_devices(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer, api: DraApi
) -> None:
    """Two containers of one pod, each with a claim of its own: the GPU of one and the NIC of the
    other are never paired."""
    p = setup(node, tmp_path, kubelet)
    publish(api)
    kubelet.set_pod("default", "two", {"a": {}, "b": {}}, claims={
        "a": [claim("default", "two-a", device(GPU, NODE, "gpu-0"), device(NIC, NODE, "bond0"))],
        "b": [claim("default", "two-b", device(GPU, NODE, "gpu-6"), device(NIC, NODE, "bond1"))]})
    got = podresources.list_containers(kubelet.socket)
    assert [(c.pod, c.container, [d.device for d in c.given.claims]) for c in got] == [
        (("default", "two"), "a", ["gpu-0", "bond0"]), (("default", "two"), "b", ["gpu-6", "bond1"])]
    found = pod_lines(diagnose(p, api_config(str(api.kubeconfig(tmp_path / "kc")), p.conf_dir, {})))
    assert found["pod default/two a"].status == OK
    b = found["pod default/two b"]
    assert b.status == WARN and b.detail.startswith("unaligned")


def test_a_shared_pool_pod_has_every_bond_and_is_judged_by_its_gpus(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """The device plugin's status file says the resource is a shared pool: its IDs ("17") name no
    bond, and the pod has every bond, as TKE's shared mode mounts every device."""
    p = setup(node, tmp_path, kubelet)
    status = Path(node.run_dir) / "device-plugin" / "status.json"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text(json.dumps({"pools": [{"resourceName": RDMA, "mode": "shared", "count": 1000,
                                             "hcas": [], "registered": True, "healthy": True}]}))
    kubelet.set_pod("default", "shared-0", {"main": {RDMA: ["17"], "nvidia.com/gpu": ["gpu-6"]}})
    kubelet.set_allocatable("nvidia.com/gpu", {"gpu-6": 1})
    found = pod_lines(diagnose(p, api_config("", p.conf_dir, {})))
    head = found["pod default/shared-0 main"]
    # bonds 0-3 are on the other NUMA node, but nobody chose them: NCCL takes one beside the GPU
    assert head.status == OK and head.detail == "aligned by NUMA node only: 1 GPU, 8 RDMA NICs (every bond)"
    assert found["pod default/shared-0 main gpu-6"].detail.endswith("NUMA node: bond4, bond5, bond6, bond7")
    assert "pod default/shared-0 main NICs apart" not in found
