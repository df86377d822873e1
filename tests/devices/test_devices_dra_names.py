"""The way back from a DRA device name to the bond: rdma-multus's reading of a simulated node's sysfs
names every bond exactly as the DRA driver's ResourceSlice does (the same device model, the same
naming), labels that are not the netdev included. No sockets, no netlink."""

from __future__ import annotations

from pathlib import Path

from rdma_cni.devices import inventory
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.dra_names import NamedBond, node_bonds
from rdma_cni.devices.model import DeviceHealth, Snapshot
from rdma_cni.dra.slices import slice_specs
from rdma_cni.sim import tree

# Two netdevs whose labels collide (Bond_A and bond-a both give "bond-a"), one with no DNS-label
# characters at all, and mlx5_bond_10 after mlx5_bond_2 (natural order, as the model sorts).
BONDS = [("bond0", "mlx5_bond_0"), ("Bond_A", "mlx5_bond_1"), ("bond-a", "mlx5_bond_2"),
         ("bond_10", "mlx5_bond_10")]  # fmt: skip


def node(tmp_path: Path) -> str:
    root = str(tmp_path / "sys")
    tree.build_tree(root, [tree.SimBond(name, dev) for name, dev in BONDS], gid_slots=4)
    return root


def published(root: str) -> list[str]:
    """The device names the DRA driver's slice gives the bonds the device model finds."""
    bonds = inventory.discover(PluginConfig(sysfs_root=root, cni_conf="/nonexistent/rdma.conf"))
    snap = Snapshot(bonds, tuple(DeviceHealth(b.id, True, "") for b in bonds))
    [spec] = slice_specs("node-1", snap, {}, None)
    return [d["name"] for d in spec["devices"]]


def test_every_bond_is_found_by_the_name_the_driver_publishes(tmp_path: Path) -> None:
    root = node(tmp_path)
    got = node_bonds(root, None)
    assert list(got) == published(root) == ["bond0", "bond-a", "bond-a-2", "bond-10"]
    assert got["bond-a"] == NamedBond("bond-a", "mlx5_bond_1", "Bond_A")
    assert got["bond-a-2"] == NamedBond("bond-a-2", "mlx5_bond_2", "bond-a")
    assert got["bond-10"] == NamedBond("bond-10", "mlx5_bond_10", "bond_10")


def test_masters_limit_the_bonds_and_a_netdev_without_rdma_device_is_none(tmp_path: Path) -> None:
    root = node(tmp_path)
    got = node_bonds(root, ["bond_10", "eth9", "bond0"])
    assert got == {"bond0": NamedBond("bond0", "mlx5_bond_0", "bond0"),
                   "bond-10": NamedBond("bond-10", "mlx5_bond_10", "bond_10")}  # fmt: skip
