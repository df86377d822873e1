"""What the simulated node gives the device plugin to read: ``device/numa_node``, the
``infiniband_verbs`` / ``infiniband_mad`` classes, ``misc/rdma_cm``, and real char device nodes under a
dev root with the kernel's numbers."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from rdma_cni.rdma import sysfs
from rdma_cni.sim import devnodes, tree
from rdma_cni.sim.daemon import parse_bonds


def build(tmp_path: Path, bonds: list[tree.SimBond], rdma_cm: bool = True) -> str:
    return tree.build_tree(str(tmp_path / "sys"), bonds, gid_slots=4, rdma_cm=rdma_cm)


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def test_numa_node_sits_on_a_pci_parent_and_absent_means_no_parent(tmp_path: Path) -> None:
    root = build(tmp_path, [tree.SimBond("bond0", "mlx5_bond_0", numa_node=1),
                            tree.SimBond("bond1", "mlx5_bond_1", numa_node=-1),
                            tree.SimBond("bond2", "mlx5_bond_2")])
    dev0 = os.path.join(sysfs.device_dir(root, "mlx5_bond_0"), "device")
    assert os.path.islink(dev0) and os.path.basename(os.path.realpath(dev0)) == "0000:17:00.0"
    assert read(os.path.join(dev0, "numa_node")) == "1"
    assert read(os.path.join(sysfs.device_dir(root, "mlx5_bond_1"), "device", "numa_node")) == "-1"
    assert not os.path.lexists(os.path.join(sysfs.device_dir(root, "mlx5_bond_2"), "device"))
    tree.set_numa_node(root, "mlx5_bond_0", None)
    assert not os.path.lexists(dev0)
    # The CNI side still finds the bond's netdev (device/net of the PCI parent is absent).
    assert [p.netdev for p in sysfs.list_ports(root)] == ["bond0", "bond1", "bond2"]


def test_mad_class_names_the_device_and_port_with_the_kernels_numbers(tmp_path: Path) -> None:
    root = build(tmp_path, [tree.SimBond("bond0", "mlx5_bond_0"),
                            tree.SimBond("bond1", "mlx5_bond_1", mad=True, uverbs=5)])
    mad = os.path.join(root, "class", "infiniband_mad")
    assert sorted(n for n in os.listdir(mad) if n != "abi_version") == ["issm5", "umad5"]
    umad = [read(os.path.join(mad, "umad5", a)) for a in ("ibdev", "port", "dev")]
    assert umad == ["mlx5_bond_1", "1", "231:5"]
    assert read(os.path.join(mad, "issm5", "dev")) == "231:69"
    assert read(os.path.join(root, "class", "infiniband_verbs", "uverbs5", "dev")) == "231:197"
    assert read(os.path.join(root, "class", "misc", "rdma_cm", "dev")) == "10:58"


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs CAP_MKNOD")
def test_dev_nodes_are_real_char_devices_made_from_the_dev_attributes(tmp_path: Path) -> None:
    root = build(tmp_path, [tree.SimBond(f"bond{i}", f"mlx5_bond_{i}", mad=True) for i in range(2)])
    dev = str(tmp_path / "dev")
    made = devnodes.make_dev_nodes(root, dev)
    assert sorted(made) == ["issm0", "issm1", "rdma_cm", "umad0", "umad1", "uverbs0", "uverbs1"]
    expected = {"uverbs1": (231, 193), "umad1": (231, 1), "issm1": (231, 65), "rdma_cm": (10, 58)}
    for name, (major, minor) in expected.items():
        st = os.lstat(os.path.join(dev, "infiniband", name))
        assert stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)
        assert stat.S_IMODE(st.st_mode) == 0o666
    # A plain file in the way (not a device) is replaced; a second run changes nothing.
    path = os.path.join(dev, "infiniband", "uverbs0")
    os.unlink(path)
    Path(path).write_text("")
    devnodes.make_dev_nodes(root, dev)
    assert stat.S_ISCHR(os.lstat(path).st_mode)
    inode = os.lstat(path).st_ino
    devnodes.make_dev_nodes(root, dev)
    assert os.lstat(path).st_ino == inode
    assert devnodes.remove_dev_node(dev, "uverbs0") and not devnodes.remove_dev_node(dev, "uverbs0")


def test_daemon_bond_spec_carries_numa_and_mad() -> None:
    bonds = parse_bonds("bond0,bond1:mlx5_bond_9,bond2", "0,-1,none", mad=True)
    assert [(b.device, b.numa_node, b.mad) for b in bonds] == [
        ("mlx5_bond_0", 0, True), ("mlx5_bond_9", -1, True), ("mlx5_bond_2", None, True)]
    assert [b.numa_node for b in parse_bonds("bond0,bond1", "1")] == [1, 1]
    assert [b.numa_node for b in parse_bonds("bond0")] == [None]
    with pytest.raises(ValueError, match="2 values for 3 bonds"):
        parse_bonds("bond0,bond1,bond2", "0,1")
