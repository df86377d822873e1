"""Bond selection: device IDs as netdev, RDMA device or PCI address (of a lower NIC or of the RDMA
device), opaque IDs as a count, pins, and error 11 naming who holds what. The sysfs layout is built
the way the kernel lays it out (class/net/<bond>/lower_<nic> -> ../<nic>, <nic>/device -> PCI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdma_cni.cni.errors import CniError
from rdma_cni.cni.request import Attachment, Request
from rdma_cni.plugins.macvlan.select import aliases, choose_bonds


def sysfs(tmp_path: Path) -> str:
    root = tmp_path / "sys"
    pci = root / "devices" / "pci0000:00"
    for i in range(2):
        for port in range(2):
            fn = f"0000:3b:0{i}.{port}"
            (pci / fn).mkdir(parents=True)
            nic = root / "class" / "net" / f"eth{i}{port}"
            nic.mkdir(parents=True)
            os.symlink(os.path.relpath(pci / fn, nic), nic / "device")
        bond = root / "class" / "net" / f"bond{i}"
        bond.mkdir(parents=True)
        for port in range(2):
            os.symlink(f"../eth{i}{port}", bond / f"lower_eth{i}{port}")
        ib = root / "class" / "infiniband" / f"mlx5_bond_{i}"
        ib.mkdir(parents=True)
        os.symlink(os.path.relpath(pci / f"0000:3b:0{i}.0", ib), ib / "device")
    return str(root)


def req(cid: str = "c1", **rc: object) -> Request:
    return Request(command="ADD", cni_version="1.1.0", container_id=cid, ifname="net1",
                   runtime_config=dict(rc))


def rdma_of(bond: str) -> str:
    return f"mlx5_bond_{bond[-1]}"


def choose(root: str, r: Request, pins: dict[str, Attachment] | None = None, count: int = 1) -> list[str]:
    return choose_bonds(r, ["bond0", "bond1"], count, pins or {}, lambda b: "", rdma_of, root)


def test_aliases_cover_netdev_rdma_device_and_pci_of_lowers(tmp_path: Path) -> None:
    root = sysfs(tmp_path)
    assert aliases(root, "bond1", "mlx5_bond_1") == {"bond1", "mlx5_bond_1", "0000:3b:01.0", "0000:3b:01.1"}


@pytest.mark.parametrize("dev_id", ["bond1", "mlx5_bond_1", "0000:3b:01.1", "0000:3b:01.0"])
def test_a_device_id_names_its_bond(tmp_path: Path, dev_id: str) -> None:
    assert choose(sysfs(tmp_path), req(deviceID=dev_id)) == ["bond1"]


def test_opaque_ids_only_give_a_count(tmp_path: Path) -> None:
    assert choose(sysfs(tmp_path), req(deviceIDs=["0", "1"])) == ["bond0", "bond1"]


def test_pinned_bonds_are_skipped_and_none_free_is_error_11_naming_holders(tmp_path: Path) -> None:
    root = sysfs(tmp_path)
    pins = {"bond0": Attachment("other", "net1")}
    assert choose(root, req(), pins) == ["bond1"]
    pins["bond1"] = Attachment("third", "eth1")
    with pytest.raises(CniError) as err:
        choose(root, req(), pins)
    assert err.value.code == 11
    assert "bond0 by container other (net1)" in err.value.msg
    assert "bond1 by container third (eth1)" in err.value.msg


def test_a_named_bond_pinned_to_someone_else_is_error_11(tmp_path: Path) -> None:
    with pytest.raises(CniError) as err:
        choose(sysfs(tmp_path), req(deviceID="mlx5_bond_0"), {"bond0": Attachment("x", "net1")})
    assert err.value.code == 11 and "bond0 is pinned to container x" in err.value.msg


def test_device_ids_must_be_strings(tmp_path: Path) -> None:
    with pytest.raises(CniError) as err:
        choose(sysfs(tmp_path), req(deviceIDs=[1]))
    assert err.value.code == 7
