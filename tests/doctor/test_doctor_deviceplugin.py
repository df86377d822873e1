"""cni-tool doctor's device plugin lines and cni-tool state's "kubelet gave it to / IP held by", on a
simulated 4-bond node (veth bonds in a node netns), the plugin's status file as rdma-device-plugin
writes it, and a test kubelet serving the real PodResources v1 API on a unix socket."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netns
import pytest

from rdma_cni.cni.cache import CacheEntry, ResultCache
from rdma_cni.doctor.diagnose import run_checks
from rdma_cni.doctor.findings import FAIL, OK, SKIP, WARN, Finding, exit_code
from rdma_cni.doctor.node import NodePaths, observe
from rdma_cni.doctor.plugin_view import observe_device_plugin
from tests.doctor.test_doctor import cni_tool, node, paths, pin, sim_node
from tests.podresources_server import PodResourcesServer

__all__ = ["node"]  # the netns fixture, shared with test_doctor

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"


@pytest.fixture
def kubelet() -> Iterator[PodResourcesServer]:
    d = tempfile.mkdtemp(prefix="h11c-dr-")  # a unix socket path must fit in 108 bytes
    try:
        with PodResourcesServer(os.path.join(d, "kubelet.sock")) as server:
            yield server
    finally:
        shutil.rmtree(d, ignore_errors=True)


def status(run_dir: str, registered: bool = True, unhealthy: dict[str, str] | None = None) -> None:
    """The status file rdma-device-plugin writes (COMMON contract): 4 bonds on 2 NUMA nodes."""
    unhealthy = unhealthy or {}
    devices = [
        {"id": f"mlx5_bond_{i}", "netdev": f"bond{i}", "numa": i // 2,
         "healthy": f"mlx5_bond_{i}" not in unhealthy, "reason": unhealthy.get(f"mlx5_bond_{i}", "")}
        for i in range(4)
    ]  # fmt: skip
    doc = {"resourceName": RESOURCE, "registered": registered, "registrations": 3 if registered else 0,
           "endpoint": "tke-shared-rdma-1733050000.sock", "pid": 4242, "updated": 1733050000.5,
           "allocations": 2, "devices": devices}  # fmt: skip
    path = Path(run_dir) / "device-plugin" / "status.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def setup(n: netns.Node, tmp: Path, server: PodResourcesServer | None) -> NodePaths:
    root = sim_node(tmp, n, count=4, index=3)
    pr = os.path.dirname(server.socket) if server else str(tmp / "no-pod-resources")
    return paths(n, root, tmp, pod_resources_dir=pr)


def checks(findings: list[Finding], prefix: str) -> dict[str, Finding]:
    return {f.check + " | " + f.detail: f for f in findings if f.check.startswith(prefix)}


def named(p: NodePaths, container: str, pod: str) -> None:
    """What the runtime's libcni cache records for the container: the pod's namespace and name."""
    args = [("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", pod)]
    ResultCache(p.results_dirs[0]).write(CacheEntry("rdma-multus", container, "eth0", b"{}", cni_args=args))


def test_registered_plugin_counts_health_numa_and_kubelet_agrees(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    p = setup(node, tmp_path, kubelet)
    status(node.run_dir, unhealthy={"mlx5_bond_3": "port 1 is DOWN"})
    kubelet.set_allocatable(RESOURCE, {"mlx5_bond_0": 0, "mlx5_bond_1": 0, "mlx5_bond_2": 1})
    findings = run_checks(observe(p))
    dp = [f for f in findings if f.check.startswith("device-plugin")]
    lines = {(f.check, f.status): f.detail for f in dp}
    reg = next(f for f in dp if "registered" in f.detail)
    assert reg.status == OK and "pid 4242" in reg.detail and "3 registrations" in reg.detail
    assert lines[("device-plugin", WARN)] == f"{RESOURCE}: 4 devices, 3 healthy"
    assert lines[("device-plugin mlx5_bond_0", OK)] == "bond0, NUMA 0, healthy"
    assert lines[("device-plugin mlx5_bond_2", OK)] == "bond2, NUMA 1, healthy"
    assert lines[("device-plugin mlx5_bond_3", WARN)] == "bond3, NUMA 1, UNHEALTHY: port 1 is DOWN"
    agree = lines[("device-plugin kubelet", OK)]
    assert "3 allocatable" in agree and "mlx5_bond_2=1" in agree, agree
    assert kubelet.calls == ["List", "GetAllocatableResources"]
    assert exit_code(findings) == 0  # unhealthy devices are warnings: the node still serves 3


def test_a_device_on_two_numa_nodes_is_one_allocatable_device_as_kubelet_lists_it_per_node(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    # kubelet answers GetAllocatableResources with one entry per NUMA node of a device's topology
    # (a shared-mode pool's virtual devices sit on every node of the bonds): one device, not two.
    p = setup(node, tmp_path, kubelet)
    status(node.run_dir, unhealthy={"mlx5_bond_3": "port 1 is DOWN"})
    kubelet.set_allocatable(RESOURCE, {"mlx5_bond_0": (0, 1), "mlx5_bond_1": 0, "mlx5_bond_2": 1})
    findings = run_checks(observe(p))
    agree = next(f for f in findings if f.check == "device-plugin kubelet")
    assert agree.status == OK, agree
    assert "3 allocatable" in agree.detail and "mlx5_bond_0=0,1" in agree.detail, agree.detail
    # The per-pool count (shared mode's "kubelet has N allocatable") is of devices too.
    view = observe_device_plugin(os.path.dirname(kubelet.socket), node.run_dir, RESOURCE)
    assert view.allocatable_by == {RESOURCE: 3}


def test_unregistered_plugin_fails_and_a_lagging_kubelet_warns(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    p = setup(node, tmp_path, kubelet)
    status(node.run_dir, registered=False)
    kubelet.set_allocatable(RESOURCE, {"mlx5_bond_0": 0})
    findings = run_checks(observe(p))
    reg = next(f for f in findings if f.check == "device-plugin" and "not registered" in f.detail)
    assert reg.status == FAIL and "kubelet.sock" in reg.fix and "--device-plugin-dir" in reg.fix
    lag = next(f for f in findings if f.check == "device-plugin kubelet")
    assert lag.status == WARN and "['mlx5_bond_0']" in lag.detail and "mlx5_bond_3" in lag.detail
    assert exit_code(findings) == 1


def test_no_status_file_and_no_kubelet_is_skipped_and_a_kubelet_without_the_resource_warns(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    p = setup(node, tmp_path, None)
    (dp,) = [f for f in run_checks(observe(p)) if f.check.startswith("device-plugin")]
    assert dp.status == SKIP
    p2 = NodePaths(**{**p.__dict__, "pod_resources_dir": os.path.dirname(kubelet.socket)})
    (dp,) = [f for f in run_checks(observe(p2)) if f.check.startswith("device-plugin")]
    assert dp.status == WARN and "stay Pending" in dp.detail and "rdma-device-plugin" in dp.fix
    Path(node.run_dir, "device-plugin").mkdir(parents=True)
    Path(node.run_dir, "device-plugin", "status.json").write_text("{torn")
    (dp,) = [f for f in run_checks(observe(p2)) if f.check.startswith("device-plugin")]
    assert dp.status == FAIL and "status.json cannot be read" in dp.detail


def test_state_and_doctor_show_kubelets_pod_next_to_the_ips_pod_and_fail_a_mismatch(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    p = setup(node, tmp_path, kubelet)
    status(node.run_dir)
    kubelet.set_allocatable(RESOURCE, {f"mlx5_bond_{i}": i // 2 for i in range(4)})
    pods = [node.pod(), node.pod()]
    node.ip("addr", "flush", "dev", "bond0")
    node.ip("addr", "flush", "dev", "bond1")
    pin(node, "c0ffee", "bond0", "198.51.100.2/28", pods[0].path)
    named(p, "c0ffee", "trainer-a")
    pin(node, "beef01", "bond1", "198.51.100.18/28", pods[1].path)
    named(p, "beef01", "trainer-b")
    kubelet.set_pod("default", "trainer-a", {"c": {RESOURCE: ["mlx5_bond_0"]}})
    kubelet.set_pod("default", "trainer-b", {"c": {RESOURCE: ["mlx5_bond_2"]}})  # b holds bond1's IP!
    findings = run_checks(observe(p))
    alloc = {f.check: f for f in findings if f.check.startswith("allocation")}
    assert alloc["allocation bond0"].status == OK
    assert "kubelet gave it to default/trainer-a, which holds its IP" in alloc["allocation bond0"].detail
    bad = alloc["allocation bond1"]
    assert bad.status == FAIL and "held by pod default/trainer-b" in bad.detail and "no pod" in bad.detail
    assert "delete the pod" in bad.fix and "PodResources" in bad.fix
    assert alloc["allocation bond2"].status == WARN  # b got mlx5_bond_2 mounted, but no bond2 interface
    assert "default/trainer-b has no RDMA interface" in alloc["allocation bond2"].detail
    assert "tke-rdma-macvlan" in alloc["allocation bond2"].fix
    assert alloc["allocation bond3"].status == OK and "free" in alloc["allocation bond3"].detail
    assert exit_code(findings) == 1

    extra = ("--pod-resources-dir", os.path.dirname(kubelet.socket))
    text = cni_tool(p, "state", *extra)
    assert text.returncode == 1, text.stdout + text.stderr
    rows = {line.split()[0]: line for line in text.stdout.splitlines() if line.startswith("bond")}
    assert rows["bond0"].split()[-2:] == ["default/trainer-a", "default/trainer-a"], rows
    assert rows["bond1"].split()[-3:] == ["-", "default/trainer-b", "FAIL"], rows
    assert "FAIL bond1 (mlx5_bond_1): its IP is held by pod default/trainer-b" in text.stdout
    inv: dict[str, Any] = json.loads(cni_tool(p, "state", "--json", *extra).stdout)
    b1 = next(b for b in inv["bonds"] if b["bond"] == "bond1")
    assert b1["allocatedTo"] == "" and b1["ipHeldBy"] == "default/trainer-b"
    assert b1["allocation"]["status"] == FAIL and len(inv["allocationFailures"]) == 1

    kubelet.set_pod("default", "trainer-b", {"c": {RESOURCE: ["mlx5_bond_1"]}})  # as it should be
    fixed = cni_tool(p, "state", *extra)
    assert fixed.returncode == 0, fixed.stdout
    assert "FAIL" not in fixed.stdout and "WARN" not in fixed.stdout


def test_a_pod_with_opaque_devices_and_no_bond_warns_in_doctor_and_state(
    node: netns.Node, tmp_path: Path, kubelet: PodResourcesServer
) -> None:
    """A shared plugin's IDs name no bond: a pod holding some but no bond's IP has no RDMA network."""
    p = setup(node, tmp_path, kubelet)
    pod = node.pod()
    node.ip("addr", "flush", "dev", "bond0")
    pin(node, "c0ffee", "bond0", "198.51.100.2/28", pod.path)
    named(p, "c0ffee", "with-rdma")
    kubelet.set_pod("default", "with-rdma", {"c": {RESOURCE: ["0"]}})
    kubelet.set_pod("default", "no-rdma", {"c": {RESOURCE: ["1", "2"]}})
    kubelet.set_pod("default", "plain", {"c": {}})
    findings = run_checks(observe(p))
    alloc = [f for f in findings if f.check.startswith("allocation")]
    assert [(f.check, f.status) for f in alloc] == [("allocation default/no-rdma", WARN)], alloc
    assert "holds 2" in alloc[0].detail and "no RDMA interface" in alloc[0].detail
    assert "tke-rdma-macvlan" in alloc[0].fix
    assert exit_code(findings) == 0
    out = cni_tool(p, "state", "--pod-resources-dir", os.path.dirname(kubelet.socket))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARN pod default/no-rdma holds 2" in out.stdout
