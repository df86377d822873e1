"""Where the device model says each RDMA device sits on PCI: its function's address and the PCIe
root above it (what a DRA driver publishes as ``pciBusID`` and ``pcieRoot``). Pure reads of a sysfs
tree under tmp: no namespace, no socket."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from rdma_cni.devices import hca, inventory
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.pci import address_of, pcie_root
from rdma_cni.sim import tree

NUMA8 = (0, 0, 0, 0, 1, 1, 1, 1)


def gpu_node(root: Path, numa: tuple[int | None, ...] = NUMA8) -> str:
    bonds = [tree.SimBond(f"bond{i}", f"mlx5_bond_{i}", numa_node=n) for i, n in enumerate(numa)]
    return tree.build_tree(str(root), bonds, gid_slots=4)


def function(root: Path, *path: str) -> str:
    """A PCI function at ``devices/<path...>`` with its ``bus/pci/devices`` link, as the kernel
    lays it out; returns its address."""
    target = root.joinpath("devices", *path)
    target.mkdir(parents=True)
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, bus), bus / path[-1])
    return path[-1]


def test_eight_bonds_on_two_numa_nodes_sit_under_four_pcie_roots_two_each(tmp_path: Path) -> None:
    bonds = inventory.discover(PluginConfig(sysfs_root=gpu_node(tmp_path / "sys")))
    by_root: dict[str | None, list[str]] = defaultdict(list)
    for b in bonds:
        by_root[b.pcie_root].append(b.netdev)
    assert dict(by_root) == {
        "pci0000:00": ["bond0", "bond1"],
        "pci0000:20": ["bond2", "bond3"],
        "pci0000:40": ["bond4", "bond5"],
        "pci0000:60": ["bond6", "bond7"],
    }
    assert [b.pci for b in bonds] == [f"0000:{0x17 + i:02x}:00.0" for i in range(8)]
    for members in by_root.values():  # a root's NICs share its NUMA node (and later its GPUs)
        assert len({b.numa for b in bonds if b.netdev in members}) == 1


def test_the_root_is_the_root_complex_of_the_resolved_path_past_ports_and_switches(tmp_path: Path) -> None:
    direct = function(tmp_path, "pci0000:00", "0000:00:01.0", "0000:01:00.0")
    switched = function(
        tmp_path, "pci0001:3a", "0001:3a:00.0", "0001:3b:00.0", "0001:3c:08.0", "0001:3d:00.0"
    )
    assert pcie_root(str(tmp_path), direct) == "pci0000:00"
    assert pcie_root(str(tmp_path), switched) == "pci0001:3a"


def test_no_root_for_an_unknown_function_or_one_not_under_a_root_complex(tmp_path: Path) -> None:
    odd = function(tmp_path, "platform", "0000:05:00.0")
    assert pcie_root(str(tmp_path), odd) is None
    assert pcie_root(str(tmp_path), "0000:09:00.0") is None
    assert pcie_root(str(tmp_path), None) is None
    assert pcie_root(str(tmp_path), "../../etc") is None


def test_a_virtual_device_has_neither_pci_address_nor_root(tmp_path: Path) -> None:
    root = gpu_node(tmp_path / "sys", numa=(None, 1))
    bonds = inventory.discover(PluginConfig(sysfs_root=root))
    assert [(b.id, b.pci, b.pcie_root) for b in bonds] == [
        ("mlx5_bond_0", None, None),
        ("mlx5_bond_1", "0000:18:00.0", "pci0000:00"),
    ]
    assert address_of(root, "mlx5_bond_0") is None
    assert address_of(root, "../mlx5_bond_1") is None


def test_hcas_read_for_pools_carry_the_same_root(tmp_path: Path) -> None:
    root = gpu_node(tmp_path / "sys", numa=(0, 0, 1))
    tree.add_ib_hca(root, tree.SimIbHca("mlx5_4", "ibs108", pci_index=4, uverbs=4, numa_node=1))
    assert [(h.id, h.pci, h.pcie_root) for h in hca.read_hcas(root)] == [
        ("mlx5_4", "0000:1b:00.0", "pci0000:40"),
        ("mlx5_bond_0", "0000:17:00.0", "pci0000:00"),
        ("mlx5_bond_1", "0000:18:00.0", "pci0000:00"),
        ("mlx5_bond_2", "0000:19:00.0", "pci0000:20"),
    ]
