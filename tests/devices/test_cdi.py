"""CDI spec files from the device model's Allocate answer: layout, IDs, atomic replace and removal,
against a tmp dir."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from rdma_cni.devices import cdi
from rdma_cni.devices.allocation import ContainerAllocation, DeviceSpec
from rdma_cni.devices.model import RdmaBond

KIND = "rdma.tke.cloud.tencent.com/bond"
CDICHECK = Path(__file__).resolve().parents[1] / "cdicheck"


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


def _go() -> str | None:
    for cand in (os.environ.get("GO", ""), "/usr/local/go/bin/go", shutil.which("go") or ""):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def test_containerd_cdi_library_injects_the_spec_once_with_real_device_numbers(tmp_path: Path) -> None:
    """The spec as containerd 2.4.2's CDI library (v1.1.1) reads and injects it (tests/cdicheck/):
    both bonds' devices resolve, the spec's own edits (env, rdma_cm) come once, and the char device
    numbers come from hostPath."""
    go = _go()
    if go is None or os.geteuid() != 0:
        pytest.skip("needs Go (tests/cdicheck is built with it) and root (mknod)")
    binary = tmp_path / "cdicheck"
    build = subprocess.run([go, "build", "-o", str(binary), "."], cwd=CDICHECK, capture_output=True,
                           text=True, env=dict(os.environ, GOFLAGS="-mod=mod"), timeout=300)
    if build.returncode != 0:
        pytest.skip(f"tests/cdicheck does not build here (no module cache or proxy?): {build.stderr[-300:]}")
    dev = tmp_path / "dev" / "infiniband"
    dev.mkdir(parents=True)
    numbers = {"uverbs0": (231, 192), "umad0": (231, 0), "issm0": (231, 64), "uverbs1": (231, 193),
               "rdma_cm": (10, 58)}
    for name, (major, minor) in numbers.items():
        os.mknod(dev / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    alloc = ContainerAllocation(
        devices=tuple(DeviceSpec(f"/dev/infiniband/{n}", str(dev / n), "rw") for n in numbers),
        envs=ALLOC.envs)
    ids = cdi.write_spec(str(tmp_path / "cdi"), KIND, "6f1c2a9e-4b1d-4c55-9d0e-0a1b2c3d4e5f", alloc, BONDS)
    out = subprocess.run([str(binary), str(tmp_path / "cdi"), *ids.values()], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    envs = sorted(x for x in lines if x.startswith("env "))
    assert envs == [f"env {k}={v}" for k, v in sorted(ALLOC.envs.items())]
    assert sorted(x for x in lines if x.startswith("dev ")) == sorted(
        f"dev /dev/infiniband/{n} c {ma} {mi}" for n, (ma, mi) in numbers.items())
