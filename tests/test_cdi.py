"""CDI spec files from the device model's Allocate answer: layout, IDs, atomic replace and removal,
against a tmp dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rdma_cni.devices import cdi
from rdma_cni.devices.allocation import ContainerAllocation, DeviceSpec
from rdma_cni.devices.model import RdmaBond

KIND = "rdma.tke.cloud.tencent.com/bond"


def spec(name: str) -> DeviceSpec:
    return DeviceSpec(f"/dev/infiniband/{name}", f"/host/dev/infiniband/{name}", "rw")


BONDS = [RdmaBond("mlx5_bond_0", "bond0", 1, 0, "uverbs0", ("umad0",), ("issm0",)),
         RdmaBond("mlx5_bond_1", "bond1", 1, 0, "uverbs1")]
ALLOC = ContainerAllocation(
    devices=(spec("uverbs0"), spec("umad0"), spec("issm0"), spec("uverbs1"), spec("rdma_cm")),
    envs={"NCCL_IB_HCA": "=mlx5_bond_0,mlx5_bond_1", "UCX_NET_DEVICES": "mlx5_bond_0:1,mlx5_bond_1:1",
          "NCCL_IB_GID_INDEX": "3"})


def test_spec_has_one_device_per_bond_and_shared_nodes_and_env_once(tmp_path: Path) -> None:
    ids = cdi.write_spec(str(tmp_path), KIND, "uid-1", ALLOC, BONDS)
    assert ids == {"mlx5_bond_0": f"{KIND}=uid-1-mlx5_bond_0", "mlx5_bond_1": f"{KIND}=uid-1-mlx5_bond_1"}
    path = tmp_path / "rdma.tke.cloud.tencent.com-bond_uid-1.json"
    doc = json.loads(path.read_text())
    assert doc["cdiVersion"] == "0.6.0" and doc["kind"] == KIND
    assert doc["containerEdits"]["env"] == ["NCCL_IB_GID_INDEX=3", "NCCL_IB_HCA==mlx5_bond_0,mlx5_bond_1",
                                            "UCX_NET_DEVICES=mlx5_bond_0:1,mlx5_bond_1:1"]
    assert doc["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/infiniband/rdma_cm", "hostPath": "/host/dev/infiniband/rdma_cm", "permissions": "rw"}]
    first, second = doc["devices"]
    assert first["name"] == "uid-1-mlx5_bond_0"
    assert [n["path"] for n in first["containerEdits"]["deviceNodes"]] == [
        "/dev/infiniband/uverbs0", "/dev/infiniband/umad0", "/dev/infiniband/issm0"]
    hosts = [n["hostPath"] for n in second["containerEdits"]["deviceNodes"]]
    assert hosts == ["/host/dev/infiniband/uverbs1"]
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"


def test_rewrite_replaces_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    cdi.write_spec(str(tmp_path), KIND, "u", ALLOC, BONDS)
    one = ContainerAllocation(devices=(spec("uverbs1"),), envs={"NCCL_IB_HCA": "=mlx5_bond_1"})
    ids = cdi.write_spec(str(tmp_path), KIND, "u", one, BONDS[1:])
    assert list(ids) == ["mlx5_bond_1"]
    assert os.listdir(tmp_path) == ["rdma.tke.cloud.tencent.com-bond_u.json"]
    doc = json.loads((tmp_path / "rdma.tke.cloud.tencent.com-bond_u.json").read_text())
    assert len(doc["devices"]) == 1 and "deviceNodes" not in doc["containerEdits"]


def test_remove_spec_twice_is_fine(tmp_path: Path) -> None:
    cdi.write_spec(str(tmp_path), KIND, "u", ALLOC, BONDS)
    assert cdi.remove_spec(str(tmp_path), KIND, "u") is True
    assert cdi.remove_spec(str(tmp_path), KIND, "u") is False
    assert os.listdir(tmp_path) == []
