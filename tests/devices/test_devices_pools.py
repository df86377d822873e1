"""The pool model without a socket: HCAs read from a simulated sysfs laid out as the kernel lays out
PCI functions (rdma_cni.sim.tree), Mellanox's selectors, a shared pool's device list, Allocate,
preferred allocation and health, and the exclusive-pool overlap rule."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdma_cni.deviceplugin.server import device_list
from rdma_cni.devices import shared
from rdma_cni.devices.allocation import AllocationError
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.hca import Hca, read_hcas
from rdma_cni.devices.health import HcaObservation, evaluate_hca
from rdma_cni.devices.model import DeviceHealth
from rdma_cni.devices.pools import (
    EXCLUSIVE,
    SHARED,
    PoolSpec,
    SharedSnapshot,
    conflicts,
    shared_members,
    virtual_ids,
)
from rdma_cni.devices.selectors import Selectors, parse_selectors
from rdma_cni.sim.tree import SimBond, SimIbHca, add_ib_hca, build_tree, pci_dir, put

ROCE = [f"mlx5_bond_{i}" for i in range(4)]
IB = ["mlx5_4", "mlx5_5"]


@pytest.fixture
def tree(tmp_path: Path) -> tuple[str, str]:
    """4 RoCE bonds (NUMA 0,0,1,1) and 2 InfiniBand HCAs (ibs108 on NUMA 1, ibs109 on NUMA 0), every
    char device under a dev root (plain files stand in for the nodes: Allocate only checks they exist)."""
    root = build_tree(
        str(tmp_path / "sys"),
        [SimBond(f"bond{i}", ROCE[i], numa_node=i // 2, mad=True) for i in range(4)],
        gid_slots=4,
        rdma_cm=True,
    )
    add_ib_hca(root, SimIbHca("mlx5_4", "ibs108", pci_index=4, uverbs=4, numa_node=1))
    add_ib_hca(root, SimIbHca("mlx5_5", "ibs109", pci_index=5, uverbs=5, numa_node=0))
    dev = tmp_path / "dev" / "infiniband"
    dev.mkdir(parents=True)
    for name in [f"{k}{i}" for k in ("uverbs", "umad", "issm") for i in range(6)] + ["rdma_cm"]:
        (dev / name).write_text("")
    return root, str(tmp_path / "dev")


def by_id(root: str) -> dict[str, Hca]:
    return {h.id: h for h in read_hcas(root)}


def test_hcas_carry_pci_ids_driver_address_link_layer_netdevs_and_numa(tree: tuple[str, str]) -> None:
    hcas = by_id(tree[0])
    assert list(hcas) == IB + ROCE  # natural order of the names
    ib = hcas["mlx5_4"]
    assert (ib.link_layer, ib.netdev, ib.netdevs, ib.pci, ib.vendor, ib.device_id, ib.driver, ib.numa) == (
        "InfiniBand",
        "ibs108",
        ("ibs108",),
        "0000:1b:00.0",
        "15b3",
        "101b",
        "mlx5_core",
        1,
    )
    assert (ib.uverbs, ib.umad, ib.issm) == ("uverbs4", ("umad4",), ("issm4",))
    roce = hcas["mlx5_bond_2"]
    assert (roce.link_layer, roce.netdev, roce.pci, roce.device_id, roce.numa) == (
        "Ethernet",
        "bond2",
        "0000:19:00.0",
        "101d",
        1,
    )


def test_an_ipoib_netdev_is_found_by_its_type_and_a_soft_roce_device_has_no_pci(tmp_path: Path) -> None:
    root = build_tree(str(tmp_path / "sys"), [SimBond("bond0", "rxe0")], gid_slots=2)  # no PCI parent
    add_ib_hca(root, SimIbHca("mlx5_7", None, pci_index=7, uverbs=7))
    hcas = by_id(root)
    assert (hcas["rxe0"].pci, hcas["rxe0"].vendor, hcas["rxe0"].netdevs) == (None, None, ("bond0",))
    assert (hcas["mlx5_7"].netdev, hcas["mlx5_7"].netdevs) == (None, ())  # IB without IPoIB


def test_roce_lag_matches_its_pf_netdevs_and_the_bond_that_carries_its_gids(tree: tuple[str, str]) -> None:
    root = tree[0]
    pf = os.path.join(pci_dir(root, 0), "net", "ens1f0np0")  # mlx5_bond_0's PF, a slave of bond0
    put(os.path.join(pf, "type"), "1\n")
    os.symlink(
        os.path.relpath(pf, os.path.join(root, "class", "net")),
        os.path.join(root, "class", "net", "ens1f0np0"),
    )
    os.symlink("../bond0", os.path.join(pf, "master"))
    hca = by_id(root)["mlx5_bond_0"]
    assert hca.netdevs == ("bond0", "ens1f0np0")
    for name in ("bond0", "ens1f0np0"):
        assert parse_selectors({"ifNames": [name]}, "s", "f").matches(hca)


SELECT = [
    ({"ifNames": ["ibs108"]}, ["mlx5_4"]),
    ({"ifNames": ["ibs108", "bond3"]}, ["mlx5_4", "mlx5_bond_3"]),
    ({"vendors": ["15b3"]}, IB + ROCE),
    ({"vendors": ["0x15B3"], "deviceIDs": ["0x101b"]}, IB),
    ({"deviceIDs": ["101D"]}, ROCE),
    ({"drivers": ["mlx5_core"], "linkTypes": ["IB"]}, IB),
    ({"linkTypes": ["infiniband"]}, IB),
    ({"linkTypes": ["Ether"]}, ROCE),
    ({"linkTypes": ["ethernet", "infiniband"]}, IB + ROCE),
    ({"rootDevices": ["0000:1c:00.0", "18:00.0"]}, ["mlx5_5", "mlx5_bond_1"]),
    ({"vendors": ["15b3"], "ifNames": ["ibs109"], "linkTypes": ["ib"]}, ["mlx5_5"]),  # every key must match
    ({"vendors": ["8086"]}, []),
    ({"ifNames": ["ibs108"], "linkTypes": ["ether"]}, []),
    ({}, IB + ROCE),  # no selector: every HCA, as in Mellanox's plugin
]


@pytest.mark.parametrize(("selectors", "want"), SELECT)
def test_selectors_match_as_mellanox_defines_them(
    tree: tuple[str, str], selectors: dict[str, list[str]], want: list[str]
) -> None:
    sel = parse_selectors(selectors, "configList[0].selectors", "config.json")
    assert [h.id for h in read_hcas(tree[0]) if sel.matches(h)] == want


def healthy(ids: list[str]) -> tuple[DeviceHealth, ...]:
    return tuple(DeviceHealth(i, True, "") for i in ids)


def pool_of(root: str, selectors: dict[str, list[str]], count: int = 1000) -> SharedSnapshot:
    spec = PoolSpec("rdma/a", SHARED, count, parse_selectors(selectors, "s", "f"))
    hcas = shared_members(spec, read_hcas(root), None, None)
    return SharedSnapshot(count, hcas, healthy([h.id for h in hcas]))


def test_a_shared_pool_lists_count_stable_ids_with_its_hcas_numa_nodes(tree: tuple[str, str]) -> None:
    snap = pool_of(tree[0], {"linkTypes": ["ib"]}, 1000)
    resp = device_list(snap)
    assert [d.ID for d in resp.devices] == virtual_ids(1000) == [str(i) for i in range(1000)]
    assert {d.health for d in resp.devices} == {"Healthy"}
    assert {tuple(n.ID for n in d.topology.nodes) for d in resp.devices} == {(0, 1)}
    assert virtual_ids(1000) == virtual_ids(1000)  # the same on every start: nothing random in them
    one_node = pool_of(tree[0], {"ifNames": ["ibs108"]}, 3)
    assert [tuple(n.ID for n in d.topology.nodes) for d in device_list(one_node).devices] == [(1,)] * 3


def test_allocate_of_any_ids_gives_every_hca_once_rdma_cm_once_and_no_gid_env(tree: tuple[str, str]) -> None:
    root, dev = tree
    cfg = PluginConfig(sysfs_root=root, dev_root=dev)
    snap = pool_of(root, {"linkTypes": ["ether"]})
    for ids in (["0"], ["999"], ["3", "17", "500"]):
        alloc = shared.allocate(snap, ids, cfg)
        paths = [d.container_path for d in alloc.devices]
        assert paths == [f"/dev/infiniband/{k}{i}" for i in range(4) for k in ("uverbs", "umad", "issm")] + [
            "/dev/infiniband/rdma_cm"
        ]
        assert all(
            d.host_path == os.path.join(dev, "infiniband", os.path.basename(d.container_path))
            for d in alloc.devices
        )
        assert dict(alloc.envs) == {
            "NCCL_IB_HCA": "=" + ",".join(ROCE),  # '=': exact names, not prefixes
            "UCX_NET_DEVICES": ",".join(f"{h}:1" for h in ROCE),
        }
    ib = shared.allocate(pool_of(root, {"ifNames": ["ibs108"]}), ["0"], cfg)
    assert [d.container_path for d in ib.devices] == [
        "/dev/infiniband/uverbs4",
        "/dev/infiniband/umad4",
        "/dev/infiniband/issm4",
        "/dev/infiniband/rdma_cm",
    ]
    assert dict(ib.envs) == {"NCCL_IB_HCA": "=mlx5_4", "UCX_NET_DEVICES": "mlx5_4:1"}


def test_allocate_refuses_an_unknown_id_and_a_pool_with_no_usable_hca(tree: tuple[str, str]) -> None:
    root, dev = tree
    cfg = PluginConfig(sysfs_root=root, dev_root=dev)
    snap = pool_of(root, {"linkTypes": ["ib"]}, 10)
    for bad in (["10"], ["-1"], ["01"], ["mlx5_4"], []):
        with pytest.raises(AllocationError):
            shared.allocate(snap, bad, cfg)
    dead = SharedSnapshot(10, snap.hcas, tuple(DeviceHealth(h.id, False, f"{h.id} down") for h in snap.hcas))
    with pytest.raises(AllocationError, match=r"no HCA of the pool is usable.*mlx5_4 down"):
        shared.allocate(dead, ["0"], cfg)
    half = SharedSnapshot(
        10, snap.hcas, (DeviceHealth("mlx5_4", False, "down"), DeviceHealth("mlx5_5", True, ""))
    )
    assert dict(shared.allocate(half, ["0"], cfg).envs)["NCCL_IB_HCA"] == "=mlx5_4,mlx5_5"


@pytest.mark.parametrize(
    ("available", "must", "size"),
    [
        (["0", "1", "2"], [], 2),
        (["5"], ["5"], 1),
        ([], [], 3),
        (["1", 2, None], ["x"], "3"),
        (None, None, None),
    ],
)
def test_shared_preferred_allocation_never_raises(available: object, must: object, size: object) -> None:
    picks = shared.preferred(available, must, size)  # type: ignore[arg-type]
    assert isinstance(picks, list)
    if isinstance(size, int) and isinstance(available, list):
        assert len(picks) <= max(size, len(must or []))  # type: ignore[arg-type]
        assert all(p in available or p in must for p in picks)  # type: ignore[operator]


def seen(state: str = "ACTIVE", up: bool = True, present: bool = True, uverbs: bool = True) -> HcaObservation:
    return HcaObservation(state, present, up, up, "/dev/infiniband/uverbs4", uverbs)


def test_hca_health_roce_needs_its_netdev_ib_the_port_and_its_ipoib_netdev_when_it_has_one(
    tree: tuple[str, str],
) -> None:
    hcas = by_id(tree[0])
    ib, roce = hcas["mlx5_4"], hcas["mlx5_bond_0"]
    assert evaluate_hca(ib, seen()).healthy and evaluate_hca(roce, seen()).healthy
    assert "not ACTIVE" in evaluate_hca(ib, seen("INIT")).reason  # no subnet manager yet
    assert "ibs108 of mlx5_4 is down" in evaluate_hca(ib, seen(up=False)).reason
    assert "missing" in evaluate_hca(roce, seen(present=False)).reason
    assert "uverbs" in evaluate_hca(ib, seen(uverbs=False)).reason
    assert "gone from sysfs" in evaluate_hca(roce, seen("GONE")).reason
    no_ipoib = Hca("mlx5_7", 1, "InfiniBand", None, (), None, None, None, None, None, "uverbs7")
    assert evaluate_hca(no_ipoib, seen(present=False, up=False)).healthy  # the port alone decides


def test_a_shared_pool_is_healthy_while_any_hca_is() -> None:
    hcas = tuple(Hca(i, 1, "InfiniBand", None, (), None, None, None, None, None, "uverbs0") for i in IB)
    down = tuple(DeviceHealth(i, False, "down") for i in IB)
    assert not SharedSnapshot(5, hcas, down).healthy
    assert SharedSnapshot(5, hcas, (down[0], DeviceHealth(IB[1], True, ""))).healthy
    assert not SharedSnapshot(5, (), ()).healthy  # selects nothing: registered, never allocatable
    assert list(device_list(SharedSnapshot(5, (), ())).devices) == []  # and lists no device, as Mellanox
    assert {d.health for d in device_list(SharedSnapshot(5, hcas, down)).devices} == {"Unhealthy"}


def test_an_hca_of_an_exclusive_pool_in_another_pool_is_a_conflict_naming_both() -> None:
    specs = [
        PoolSpec("tke.cloud.tencent.com/tke-shared-rdma", EXCLUSIVE),
        PoolSpec("rdma/a", SHARED, 10, Selectors(link_types=("Ethernet",))),
        PoolSpec("rdma/ib", SHARED, 10, Selectors(link_types=("InfiniBand",))),
    ]
    members = {
        "tke.cloud.tencent.com/tke-shared-rdma": ("mlx5_bond_0", "mlx5_bond_1"),
        "rdma/a": ("mlx5_bond_1",),
        "rdma/ib": ("mlx5_4",),
    }
    assert conflicts(specs, members) == [("mlx5_bond_1", "tke.cloud.tencent.com/tke-shared-rdma", "rdma/a")]
    members["rdma/ib"] = ("mlx5_4", "mlx5_bond_1")  # shared pools may share an HCA with each other
    assert len(conflicts(specs, members)) == 2
    assert conflicts(specs[1:], {"rdma/a": ("x",), "rdma/ib": ("x",)}) == []


def test_an_exclusive_pool_with_selectors_holds_its_bonds_and_keeps_a_vanished_one(
    tree: tuple[str, str],
) -> None:
    from rdma_cni.devices.model import RdmaBond, Snapshot
    from rdma_cni.devices.pools import exclusive_members

    bonds = Snapshot(
        tuple(RdmaBond(d, f"bond{i}", 1, i // 2, f"uverbs{i}") for i, d in enumerate(ROCE)), healthy(ROCE)
    )
    spec = PoolSpec(
        "example.com/numa1", EXCLUSIVE, 0, parse_selectors({"rootDevices": ["19:00.0", "1a:00.0"]}, "s", "f")
    )
    hcas = read_hcas(tree[0])
    mine = exclusive_members(spec, hcas, bonds, None)
    assert [b.id for b in mine.bonds] == [h.id for h in mine.health] == ["mlx5_bond_2", "mlx5_bond_3"]
    gone = [h for h in hcas if h.id != "mlx5_bond_3"]  # its RDMA device left sysfs: kept (Unhealthy upstream)
    assert [b.id for b in exclusive_members(spec, gone, bonds, mine).bonds] == ["mlx5_bond_2", "mlx5_bond_3"]
    assert [b.id for b in exclusive_members(spec, gone, bonds, None).bonds] == ["mlx5_bond_2"]
    assert exclusive_members(PoolSpec("x/y"), hcas, bonds, None) == bonds  # no selectors: today's pool


def test_a_pools_sockets_are_told_from_another_pools_whose_name_it_prefixes(tmp_path: Path) -> None:
    """Pools ``rdma/hca`` and ``rdma/hca-b``: the first must never take ``hca-b-<ns>.sock`` for one of
    its own (it would remove it as stale, or stand by for it as another instance)."""
    from rdma_cni.deviceplugin.daemon import socket_bases
    from rdma_cni.deviceplugin.registration import own_sockets

    for name in ("hca-17.sock", "hca-b-18.sock", "hca-x.sock", "hca-19.sock.tmp", "kubelet.sock"):
        (tmp_path / name).write_text("")
    assert own_sockets(str(tmp_path), "hca") == [str(tmp_path / "hca-17.sock")]
    assert own_sockets(str(tmp_path), "hca-b") == [str(tmp_path / "hca-b-18.sock")]
    specs = (PoolSpec("rdma/hca"), PoolSpec("example.com/hca"), PoolSpec("rdma/ib"))
    assert socket_bases(specs) == {
        "rdma/hca": "rdma_hca",
        "example.com/hca": "example.com_hca",
        "rdma/ib": "ib",
    }
