"""sysfs discovery against trees captured from a real kernel (Debian 12, 6.1, Soft-RoCE on bonds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdma_cni.rdma import sysfs
from rdma_cni.sim.fixture import materialise

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "sysfs-rxe-6.1"
if not FIXTURES.is_dir():
    FIXTURES = Path("/work/shared/fixtures/sysfs-rxe-6.1")

pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="captured sysfs fixtures not present")


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("sysfs")
    return {s: materialise(str(FIXTURES / s / "sys"), str(base / s)) for s in ("host", "pod", "exclusive")}


def captured_errors(state: str) -> set[str]:
    return {line.split("\t")[0] for line in (FIXTURES / state / "sys" / "ERRORS").read_text().splitlines()}


def test_class_infiniband_entries_are_symlinks_like_on_a_live_system(trees: dict[str, str]) -> None:
    link = os.path.join(trees["host"], "class", "infiniband", "mlx5_bond_0")
    assert os.path.islink(link)
    assert os.readlink(link) == "../../devices/virtual/infiniband/mlx5_bond_0"


@pytest.mark.parametrize("state", ["host", "pod"])
def test_list_ports_finds_both_bonds_active_on_ethernet(trees: dict[str, str], state: str) -> None:
    ports = sysfs.list_ports(trees[state])
    assert [(p.device, p.port, p.netdev, p.link_layer, p.state) for p in ports] == [
        ("mlx5_bond_0", 1, "bond0", "Ethernet", "ACTIVE"),
        ("mlx5_bond_1", 1, "bond1", "Ethernet", "ACTIVE"),
    ]
    assert all(p.uverbs is None for p in ports)  # the capture has no class/infiniband_verbs


def test_exclusive_state_ports_are_down_and_still_map_to_their_bonds(trees: dict[str, str]) -> None:
    ports = sysfs.list_ports(trees["exclusive"])
    assert [(p.device, p.netdev, p.state) for p in ports] == [
        ("mlx5_bond_0", "bond0", "DOWN"),
        ("mlx5_bond_1", "bond1", "DOWN"),
    ]


@pytest.mark.parametrize("state", ["host", "pod", "exclusive"])
def test_port_for_netdev(trees: dict[str, str], state: str) -> None:
    p0 = sysfs.port_for_netdev(trees[state], "bond0")
    p1 = sysfs.port_for_netdev(trees[state], "bond1")
    assert p0 is not None and (p0.device, p0.port) == ("mlx5_bond_0", 1)
    assert p1 is not None and (p1.device, p1.port) == ("mlx5_bond_1", 1)
    assert sysfs.port_for_netdev(trees[state], "a0") is None  # a bond slave has no RDMA port of its own
    assert sysfs.port_for_netdev(trees[state], "lo") is None


def test_read_gids_host_state_matches_the_capture(trees: dict[str, str]) -> None:
    gids = sysfs.read_gids(trees["host"], "mlx5_bond_0", 1)
    assert [(g.index, g.gid, g.type, g.ndev, g.ipv4) for g in gids] == [
        (0, "fe80::6477:54ff:fe36:5669", "RoCE v2", "bond0", None),
        (1, "::ffff:198.51.100.2", "RoCE v2", "bond0", "198.51.100.2"),
    ]
    assert (
        gids[1].raw
        == (FIXTURES / "host/sys/devices/virtual/infiniband/mlx5_bond_0/ports/1/gids/1").read_text().strip()
    )


def test_read_gids_skips_exactly_the_slots_the_kernel_refused(trees: dict[str, str]) -> None:
    """Every slot without a GID is one whose attrs failed EINVAL on the real kernel, and vice versa."""
    for state in ("host", "pod", "exclusive"):
        errors = captured_errors(state)
        for dev in ("mlx5_bond_0", "mlx5_bond_1"):
            present = {g.index for g in sysfs.read_gids(trees[state], dev, 1)}
            base = f"devices/virtual/infiniband/{dev}/ports/1/gid_attrs/types"
            refused = {int(e.rsplit("/", 1)[1]) for e in errors if e.startswith(base + "/")}
            assert present | refused == set(range(1024))
            assert not present & refused


@pytest.mark.parametrize("state", ["host", "pod", "exclusive"])
def test_roce_v2_index_of_the_bond_ip_is_1_on_rxe(trees: dict[str, str], state: str) -> None:
    assert sysfs.roce_v2_index(trees[state], "mlx5_bond_0", 1, "198.51.100.2") == 1
    assert sysfs.roce_v2_index(trees[state], "mlx5_bond_1", 1, "198.51.100.18") == 1
    assert sysfs.roce_v2_index(trees[state], "mlx5_bond_0", 1, "198.51.100.18") is None
    assert sysfs.roce_v2_index(trees[state], "mlx5_bond_0", 1, "203.0.113.9") is None


def test_pod_state_gid_is_at_the_host_index_with_the_pod_side_ndev(trees: dict[str, str]) -> None:
    """After the move the host's bond0 has no IPv4 (commands.txt) but slot 1 still holds its GID,
    now owned by the pod's macvlan, which the capture named ``bond0`` inside the pod."""
    commands = (FIXTURES / "pod" / "commands.txt").read_text()
    bond0_line = next(line for line in commands.splitlines() if line.startswith("bond0 "))
    assert "198.51.100.2/" not in bond0_line
    entry = sysfs.find_gid(trees["pod"], "mlx5_bond_0", 1, "198.51.100.2")
    assert entry is not None and (entry.index, entry.ndev) == (1, "bond0")


def test_exclusive_state_default_gid_follows_the_mac_and_the_old_link_local_moves_to_slot_2(
    trees: dict[str, str],
) -> None:
    gids = sysfs.read_gids(trees["exclusive"], "mlx5_bond_0", 1)
    assert [(g.index, g.gid) for g in gids] == [
        (0, "fe80::1044:d4ff:fefb:a0a3"),
        (1, "::ffff:198.51.100.2"),
        (2, "fe80::6477:54ff:fe36:5669"),
    ]


def test_find_gid_ndev_filter_picks_one_of_two_entries_of_the_same_gid(tmp_path: Path) -> None:
    from rdma_cni.sim.tree import SimBond, build_tree, write_slot

    root = build_tree(str(tmp_path / "sys"), [SimBond("bond0", "mlx5_bond_0")], gid_slots=8)
    gid = sysfs.gid_for_ip("198.51.100.2")
    write_slot(root, "mlx5_bond_0", 1, 1, gid, "bond0")
    write_slot(root, "mlx5_bond_0", 1, 2, gid, "net1")
    assert sysfs.roce_v2_index(root, "mlx5_bond_0", 1, "198.51.100.2") == 1
    assert sysfs.roce_v2_index(root, "mlx5_bond_0", 1, "198.51.100.2", ndev="net1") == 2


def test_no_rdma_at_all_gives_no_ports(tmp_path: Path) -> None:
    assert sysfs.list_ports(str(tmp_path)) == []
    assert sysfs.port_for_netdev(str(tmp_path), "bond0") is None
    assert sysfs.read_gids(str(tmp_path), "mlx5_bond_0", 1) == []


def test_mlx5_layout_netdev_via_device_net_and_bond_master(tmp_path: Path) -> None:
    """mlx5 LAG: ``device/net`` lists the PF, whose ``master`` is the bond; uverbs via ibdev."""
    root = tmp_path / "sys"
    pci = root / "devices/pci0000:00/0000:00:02.0/0000:3b:00.0"
    dev = pci / "infiniband/mlx5_bond_0"
    (dev / "ports/1/gids").mkdir(parents=True)
    (dev / "ports/1/link_layer").write_text("Ethernet\n")
    (dev / "ports/1/state").write_text("4: ACTIVE\n")
    (dev / "device").symlink_to(os.path.relpath(pci, dev))
    (pci / "net/ens1f0np0").mkdir(parents=True)
    (root / "devices/virtual/net/bond0").mkdir(parents=True)
    (pci / "net/ens1f0np0/master").symlink_to(
        os.path.relpath(root / "devices/virtual/net/bond0", pci / "net/ens1f0np0")
    )
    (root / "class/infiniband").mkdir(parents=True)
    (root / "class/infiniband/mlx5_bond_0").symlink_to(os.path.relpath(dev, root / "class/infiniband"))
    (root / "class/net").mkdir(parents=True)
    (root / "class/net/bond0").symlink_to("../../devices/virtual/net/bond0")
    (root / "class/net/ens1f0np0").symlink_to(os.path.relpath(pci / "net/ens1f0np0", root / "class/net"))
    (root / "class/infiniband_verbs/uverbs3").mkdir(parents=True)
    (root / "class/infiniband_verbs/uverbs3/ibdev").write_text("mlx5_bond_0\n")
    port = sysfs.port_for_netdev(str(root), "bond0")
    assert port == sysfs.RdmaPort("mlx5_bond_0", 1, "bond0", "uverbs3", "Ethernet", "ACTIVE")
    assert port.uverbs_path == "/dev/infiniband/uverbs3"


def test_gid_for_ip_maps_ipv4_and_keeps_ipv6() -> None:
    assert sysfs.gid_text(sysfs.gid_for_ip("198.51.100.10")) == "::ffff:198.51.100.10"
    assert sysfs.gid_for_ip("198.51.100.10").hex().endswith("ffffc633640a")
    assert sysfs.gid_text(sysfs.gid_for_ip("fe80::1")) == "fe80::1"


def test_port_for_netdev_through_a_bond_slave_when_no_gid_names_the_bond(tmp_path: Path) -> None:
    """No GID table entry yet (bond without addresses): ``class/net/bond0/lower_*/device/infiniband``."""
    root = tmp_path / "sys"
    pci = root / "devices/pci0000:00/0000:3b:00.0"
    dev = pci / "infiniband/mlx5_bond_0"
    (dev / "ports/1/gids").mkdir(parents=True)
    (dev / "ports/1/link_layer").write_text("Ethernet\n")
    (dev / "ports/1/state").write_text("1: DOWN\n")
    (root / "class/infiniband").mkdir(parents=True)
    (root / "class/infiniband/mlx5_bond_0").symlink_to(os.path.relpath(dev, root / "class/infiniband"))
    (pci / "net/ens1f0np0").mkdir(parents=True)
    (pci / "net/ens1f0np0/device").symlink_to("../..")
    (root / "devices/virtual/net/bond0").mkdir(parents=True)
    (root / "devices/virtual/net/bond0/lower_ens1f0np0").symlink_to(
        os.path.relpath(pci / "net/ens1f0np0", root / "devices/virtual/net/bond0")
    )
    (root / "class/net").mkdir(parents=True)
    (root / "class/net/bond0").symlink_to("../../devices/virtual/net/bond0")
    port = sysfs.port_for_netdev(str(root), "bond0")
    assert port is not None and (port.device, port.port, port.netdev, port.state) == (
        "mlx5_bond_0",
        1,
        "bond0",
        "DOWN",
    )
    assert sysfs.port_for_netdev(str(root), "bond1") is None
