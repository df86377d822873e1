"""Who holds which device on the node, as a plugin that picks bonds itself reads it: kubelet's real
PodResources v1 API on a unix socket (the test kubelet's server), else kubelet's device checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdma_cni.cni.errors import CniError
from rdma_cni.kube.allocated import PodRef, pod_view
from tests.podresources_server import PodResourcesServer, claim, device

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
DRIVER = "rdma.tke.cloud.tencent.com"
ME = PodRef("default", "ibv-app-0", "u-0")


def dirs(tmp_path: Path) -> tuple[str, str]:
    pr, dp = tmp_path / "pod-resources", tmp_path / "device-plugins"
    pr.mkdir()
    dp.mkdir()
    return str(pr), str(dp)


def test_pod_resources_name_this_pods_devices_and_every_other_holder(tmp_path: Path) -> None:
    pr, dp = dirs(tmp_path)
    with PodResourcesServer(f"{pr}/kubelet.sock") as kubelet:
        kubelet.set_pod("default", "ibv-app-0", {"trainer": {RESOURCE: ["mlx5_bond_3", "mlx5_bond_2"]}})
        kubelet.set_pod("team", "other", {"a": {RESOURCE: ["mlx5_bond_0"], "nvidia.com/gpu": ["GPU-1"]}})
        dra = [claim("team", "c1", device(DRIVER, "node-1", "bond5"))]
        kubelet.set_pod("team", "dra", {"b": {}}, {"b": dra})
        kubelet.set_allocatable(RESOURCE, {f"mlx5_bond_{i}": 0 for i in range(8)})
        got = pod_view(ME, RESOURCE, DRIVER, pr, dp)
        assert kubelet.calls == ["List", "GetAllocatableResources"]
    assert got is not None
    assert got.mine == ("mlx5_bond_3", "mlx5_bond_2")  # kubelet's order, as Multus v4.2.3 keeps it
    assert got.others == {"mlx5_bond_0": "pod team/other", "bond5": "pod team/dra"}
    assert got.served and got.source.startswith("kubelet PodResources")


def test_a_resource_kubelet_does_not_serve_and_nobody_holds_is_not_served(tmp_path: Path) -> None:
    pr, dp = dirs(tmp_path)
    with PodResourcesServer(f"{pr}/kubelet.sock") as kubelet:
        kubelet.set_pod("default", "ibv-app-0", {"trainer": {}})
        got = pod_view(ME, RESOURCE, DRIVER, pr, dp)
    assert got is not None and got.mine == () and got.others == {} and not got.served


def checkpoint(dp: str, entries: list[tuple[str, list[str]]], registered: tuple[str, ...] = ()) -> None:
    rows = [{"PodUID": uid, "ContainerName": "c", "ResourceName": RESOURCE, "DeviceIDs": {"0": ids},
             "AllocResp": ""} for uid, ids in entries]  # fmt: skip
    data = {"PodDeviceEntries": rows, "RegisteredDevices": {r: [] for r in registered}}
    doc = {"Data": data, "Checksum": 1}
    Path(dp, "kubelet_internal_checkpoint").write_text(json.dumps(doc))


def test_without_a_socket_the_checkpoint_says_by_pod_uid(tmp_path: Path) -> None:
    pr, dp = dirs(tmp_path)
    checkpoint(dp, [("u-0", ["mlx5_bond_1"]), ("u-9", ["mlx5_bond_4"])])
    got = pod_view(ME, RESOURCE, DRIVER, pr, dp)
    assert got is not None
    assert got.mine == ("mlx5_bond_1",) and got.others == {"mlx5_bond_4": "pod UID u-9"} and got.served


def test_a_kubelet_that_cannot_answer_falls_back_to_the_checkpoint(tmp_path: Path) -> None:
    pr, dp = dirs(tmp_path)
    checkpoint(dp, [], registered=(RESOURCE,))
    with PodResourcesServer(f"{pr}/kubelet.sock", malformed=True):
        got = pod_view(ME, RESOURCE, DRIVER, pr, dp)
    assert got is not None and got.mine == () and got.served and "checkpoint" in got.source


def test_neither_socket_nor_checkpoint_is_nothing_to_respect(tmp_path: Path) -> None:
    pr, dp = dirs(tmp_path)
    assert pod_view(ME, RESOURCE, DRIVER, pr, dp) is None


def test_an_unreadable_checkpoint_is_an_error_not_a_blind_choice(tmp_path: Path) -> None:
    pr, dp = dirs(tmp_path)
    Path(dp, "kubelet_internal_checkpoint").write_text("{not json")
    with pytest.raises(CniError) as err:
        pod_view(ME, RESOURCE, DRIVER, pr, dp)
    assert "kubelet device checkpoint" in err.value.msg and "cannot be read" in err.value.msg
