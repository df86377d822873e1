"""cni-tool doctor on a plugin serving pools: the status file as rdma-device-plugin's own StatusFile
writes it (two pools: a seed-002 style InfiniBand pool and a RoCE pool), read back as the doctor
reads it, next to a test kubelet serving the real PodResources v1 API."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from rdma_cni.deviceplugin.status import StatusFile, status_path
from rdma_cni.devices.hca import Hca
from rdma_cni.devices.model import DeviceHealth
from rdma_cni.devices.pools import SHARED, PoolSpec, SharedSnapshot
from rdma_cni.devices.selectors import Selectors
from rdma_cni.doctor.deviceplugin import check_device_plugin
from rdma_cni.doctor.findings import FAIL, OK, WARN, Finding
from rdma_cni.doctor.plugin_view import observe_device_plugin
from tests.podresources_server import PodResourcesServer

IB, ROCE = "rdma/hca_shared_devices_a", "rdma/hca_shared_devices_b"
SPECS = (
    PoolSpec(IB, SHARED, 200, Selectors(if_names=("ibs108",)), "configList[0]"),
    PoolSpec(ROCE, SHARED, 100, Selectors(link_types=("Ethernet",)), "configList[1]"),
)


def hca(name: str, netdev: str, layer: str = "Ethernet") -> Hca:
    return Hca(name, 1, layer, netdev, (netdev,), None, "15b3", "101b", "mlx5_core", 0, "uverbs0")


@pytest.fixture
def dirs() -> Iterator[tuple[str, PodResourcesServer]]:
    d = tempfile.mkdtemp(prefix="h21-dr-")  # a unix socket path must fit in 108 bytes
    os.mkdir(os.path.join(d, "pr"))
    try:
        with PodResourcesServer(os.path.join(d, "pr", "kubelet.sock")) as server:
            yield d, server
    finally:
        shutil.rmtree(d, ignore_errors=True)


def written(run_dir: str, roce_health: list[bool], registered: bool = True, ib: bool = True) -> None:
    status = StatusFile(status_path(run_dir), IB, SPECS)
    ib_hcas = (hca("mlx5_4", "ibs108", "InfiniBand"),) if ib else ()
    status.pool(IB).snapshot(
        SharedSnapshot(200, ib_hcas, tuple(DeviceHealth(h.id, True, "") for h in ib_hcas))
    )
    roce = tuple(hca(f"mlx5_bond_{i}", f"bond{i}") for i in range(4))
    health = tuple(
        DeviceHealth(h.id, ok, "" if ok else f"netdev bond{i} of {h.id} is down")
        for i, (h, ok) in enumerate(zip(roce, roce_health, strict=True))
    )
    status.pool(ROCE).snapshot(SharedSnapshot(100, roce, health))
    for spec in SPECS:
        if registered:
            status.pool(spec.resource_name).registered(f"{spec.resource_name.split('/')[1]}-1.sock")
    status.close()


def findings(d: str, server: PodResourcesServer) -> dict[str, Finding]:
    view = observe_device_plugin(os.path.dirname(server.socket), d, IB)
    return {f.check: f for f in check_device_plugin(view)}


def test_each_pool_shows_resource_mode_count_hcas_and_health(dirs: tuple[str, PodResourcesServer]) -> None:
    d, server = dirs
    server.set_allocatable(IB, {str(i): 1 for i in range(200)})
    server.set_allocatable(ROCE, {str(i): None for i in range(100)})
    written(d, [True] * 4)
    found = findings(d, server)
    assert found["device-plugin"].status == OK and "serves 2 pool(s)" in found["device-plugin"].detail
    ib = found[f"device-plugin {IB}"]
    assert ib.status == OK and ib.detail.startswith(f"{IB}: shared, 200 devices, HCAs mlx5_4, healthy")
    assert found[f"device-plugin {ROCE}"].detail.startswith(
        f"{ROCE}: shared, 100 devices, HCAs mlx5_bond_0, mlx5_bond_1, mlx5_bond_2, mlx5_bond_3, healthy"
    )
    assert found[f"device-plugin {IB} kubelet"].status == OK


def test_one_dead_hca_of_a_live_pool_is_a_warn_all_dead_a_fail(dirs: tuple[str, PodResourcesServer]) -> None:
    d, server = dirs
    server.set_allocatable(ROCE, {str(i): None for i in range(100)})
    written(d, [False, True, True, True])
    found = findings(d, server)
    pool = found[f"device-plugin {ROCE}"]
    assert pool.status == WARN and "mlx5_bond_0 (UNHEALTHY)" in pool.detail and ", healthy" in pool.detail
    dead = found[f"device-plugin {ROCE} mlx5_bond_0"]
    assert dead.status == WARN and "bond0 of mlx5_bond_0 is down" in dead.detail
    written(d, [False] * 4)
    found = findings(d, server)
    assert (
        found[f"device-plugin {ROCE}"].status == FAIL
        and "no member is usable" in found[f"device-plugin {ROCE}"].detail
    )
    kubelet = found[f"device-plugin {ROCE} kubelet"]  # kubelet still counts 100 allocatable: it lags
    assert kubelet.status == WARN and "says 0" in kubelet.detail


def test_an_unregistered_pool_fails_and_an_empty_one_warns(dirs: tuple[str, PodResourcesServer]) -> None:
    d, server = dirs
    written(d, [True] * 4, registered=False)
    assert findings(d, server)[f"device-plugin {ROCE}"].status == FAIL
    written(d, [True] * 4, ib=False)
    empty = findings(d, server)[f"device-plugin {IB}"]
    assert empty.status == WARN and "selects nothing" in empty.detail and "ifNames=ibs108" in empty.fix


def test_a_shared_pools_pod_holding_no_bond_is_not_a_warn(dirs: tuple[str, PodResourcesServer]) -> None:
    """Seed 002's nccl-test pods are hostNetwork and TKE's shared-mode pods use ipvlan: neither holds
    a bond of rdma-macvlan's, which for an exclusive resource's pod would mean "no RDMA interface"."""
    from rdma_cni.doctor.deviceplugin import pods_without_rdma
    from rdma_cni.doctor.node import NodePaths, NodeSnapshot

    d, server = dirs
    server.set_pod("default", "nccl-test-bm4lj", {"nccl-test": {IB: ["7"]}})
    written(d, [True] * 4)
    view = observe_device_plugin(os.path.dirname(server.socket), d, IB)
    assert view.pods == {("default", "nccl-test-bm4lj"): {IB: ["7"]}}
    snap = NodeSnapshot(NodePaths(results_dirs=()), d, d, [], {}, {}, [], [], {}, device_plugin=view)
    assert pods_without_rdma(snap) == []
    view.status = {k: v for k, v in (view.status or {}).items() if k != "pools"}  # a one-pool exclusive file
    assert [a.allocated_to for a in pods_without_rdma(snap)] == ["default/nccl-test-bm4lj"]
