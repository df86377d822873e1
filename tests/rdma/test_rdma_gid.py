"""Waiting for a GID (bounded) and checking its index."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rdma_cni.cni.errors import GID_MISMATCH, GID_TIMEOUT, CniError
from rdma_cni.rdma import gid, sysfs
from rdma_cni.sim.tree import SimBond, build_tree, write_slot

IP = "198.51.100.2"


@pytest.fixture
def root(tmp_path: Path) -> str:
    return build_tree(str(tmp_path / "sys"), [SimBond("bond0", "mlx5_bond_0")], gid_slots=16)


def test_returns_at_once_when_present(root: str) -> None:
    write_slot(root, "mlx5_bond_0", 1, 1, sysfs.gid_for_ip(IP), "bond0")
    entry = gid.wait_for_gid(root, "mlx5_bond_0", 1, IP, 0)
    assert (entry.index, entry.ipv4, entry.ndev, entry.type) == (1, IP, "bond0", "RoCE v2")


def test_waits_until_the_gid_appears(root: str) -> None:
    timer = threading.Timer(0.2, write_slot, (root, "mlx5_bond_0", 1, 3, sysfs.gid_for_ip(IP), "net1"))
    timer.start()
    try:
        entry = gid.wait_for_gid(root, "mlx5_bond_0", 1, IP, 5000, ndev="net1")
    finally:
        timer.cancel()
    assert entry.index == 3 and entry.ndev == "net1"


def test_timeout_is_103_naming_device_port_and_ip(root: str) -> None:
    write_slot(root, "mlx5_bond_0", 1, 1, sysfs.gid_for_ip(IP), "bond0")
    with pytest.raises(CniError) as e:
        gid.wait_for_gid(root, "mlx5_bond_0", 1, IP, 50, ndev="net1")  # only the host's entry exists
    assert e.value.code == GID_TIMEOUT == 103
    assert "mlx5_bond_0 port 1" in e.value.msg and IP in e.value.msg and "50 ms" in e.value.msg
    assert f"1 ::ffff:{IP} RoCE v2 bond0" in e.value.details


def test_index_check(root: str) -> None:
    write_slot(root, "mlx5_bond_0", 1, 2, sysfs.gid_for_ip(IP), "net1")
    entry = gid.wait_for_gid(root, "mlx5_bond_0", 1, IP, 0)
    gid.check_gid_index(entry, 2)
    with pytest.raises(CniError) as e:
        gid.check_gid_index(entry, 1, "host", root)
    assert e.value.code == GID_MISMATCH == 102
    assert "index 2" in e.value.msg and "host index is 1" in e.value.msg
    assert "2 ::ffff:198.51.100.2 RoCE v2 net1" in e.value.details


def test_wait_for_gid_gone(root: str) -> None:
    from rdma_cni.sim.tree import clear_slot

    write_slot(root, "mlx5_bond_0", 1, 1, sysfs.gid_for_ip(IP), "bond0")
    assert gid.wait_for_gid_gone(root, "mlx5_bond_0", 1, IP, 30) is False
    timer = threading.Timer(0.1, clear_slot, (root, "mlx5_bond_0", 1, 1))
    timer.start()
    try:
        assert gid.wait_for_gid_gone(root, "mlx5_bond_0", 1, IP, 5000) is True
    finally:
        timer.cancel()
