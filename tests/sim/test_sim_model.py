"""The GID table rules of the model (no netns needed), and the simulated tree against the capture."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdma_cni.rdma import sysfs
from rdma_cni.sim import model
from rdma_cni.sim.fixture import materialise
from rdma_cni.sim.model import MLX5_TYPES, Owner, PortTable
from rdma_cni.sim.tree import SimBond, build_tree, default_gid

FIXTURES = Path("/work/shared/fixtures/sysfs-rxe-6.1")
if not FIXTURES.is_dir():
    FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "sysfs-rxe-6.1"

MAC = "66:77:54:36:56:69"  # bond0's MAC in the capture (its default GID fe80::6477:54ff:fe36:5669)
BOND, POD = Owner(None, 7), Owner(3, 2)
V4 = sysfs.gid_for_ip("198.51.100.2")
POD_LL = sysfs.gid_for_ip("fe80::4cdb:5dff:fe96:de62")


def host_table(size: int = 16) -> PortTable:
    t = PortTable("mlx5_bond_0", 1, size)
    t.set_default(default_gid(MAC), BOND)
    t.add(sysfs.gid_for_ip("fe80::6477:54ff:fe36:5669"), BOND)  # the bond's own link-local = default
    t.add(V4, BOND)
    return t


def index_of(t: PortTable, gid: bytes, owner: Owner) -> int | None:
    return next(
        (i for i, s in t.entries() if s.gid == gid and s.owner == owner and s.type == "RoCE v2"), None
    )


def test_default_gid_is_the_eui64_of_the_mac_as_captured() -> None:
    assert sysfs.gid_text(default_gid(MAC)) == "fe80::6477:54ff:fe36:5669"


def test_host_layout_matches_the_capture() -> None:
    t = host_table()
    assert [(i, sysfs.gid_text(s.gid), s.default) for i, s in t.entries()] == [
        (0, "fe80::6477:54ff:fe36:5669", True),
        (1, "::ffff:198.51.100.2", False),
    ]


def test_v1_del_add_up_keeps_1() -> None:
    t = host_table()
    t.remove(V4, BOND)
    t.add(V4, POD)
    t.add(POD_LL, POD)
    assert index_of(t, V4, POD) == 1 and index_of(t, POD_LL, POD) == 2


def test_v2_up_first_then_del_add_keeps_1() -> None:
    t = host_table()
    t.add(POD_LL, POD)
    t.remove(V4, BOND)
    t.add(V4, POD)
    assert index_of(t, V4, POD) == 1


def test_v3_add_before_del_gives_2() -> None:
    t = host_table()
    assert t.add(V4, POD) == [2]  # duplicated: [1] bond0, [2] net1
    t.remove(V4, BOND)
    t.add(POD_LL, POD)
    assert index_of(t, V4, POD) == 2 and index_of(t, POD_LL, POD) == 1


def test_v6_del_up_add_gives_2_and_v7_without_link_local_1() -> None:
    t = host_table()
    t.remove(V4, BOND)
    t.add(POD_LL, POD)
    t.add(V4, POD)
    assert index_of(t, V4, POD) == 2
    t7 = host_table()
    t7.remove(V4, BOND)
    t7.add(V4, POD)  # addrgenmode none: no link-local
    assert index_of(t7, V4, POD) == 1


def test_second_pod_on_the_same_bond_gets_the_next_slot() -> None:
    t = host_table()
    t.remove(V4, BOND)
    t.add(V4, POD)
    t.add(sysfs.gid_for_ip("198.51.100.12"), Owner(4, 2))
    assert index_of(t, sysfs.gid_for_ip("198.51.100.12"), Owner(4, 2)) == 2


def test_netns_gone_drops_every_entry_of_its_netdev_and_the_host_gets_1_back() -> None:
    t = host_table()
    t.remove(V4, BOND)
    t.add(V4, POD)
    t.add(POD_LL, POD)
    assert t.drop_owner(POD) == [1, 2]
    t.add(V4, BOND)
    assert index_of(t, V4, BOND) == 1


def test_removing_an_address_never_removes_the_default_gid() -> None:
    t = host_table()
    assert t.remove(sysfs.gid_for_ip("fe80::6477:54ff:fe36:5669"), BOND) == []
    assert t.slots[0] is not None


def test_mac_change_rewrites_slot_0_and_the_old_link_local_gets_its_own_slot() -> None:
    """The captured exclusive state: a new default GID at 0, the bond's old link-local at 2."""
    t = host_table()
    t.set_default(default_gid("12:44:d4:fb:a0:a3"), BOND)
    t.add(sysfs.gid_for_ip("fe80::6477:54ff:fe36:5669"), BOND)
    assert [(i, sysfs.gid_text(s.gid)) for i, s in t.entries()] == [
        (0, "fe80::1044:d4ff:fefb:a0a3"),
        (1, "::ffff:198.51.100.2"),
        (2, "fe80::6477:54ff:fe36:5669"),
    ]


def test_mlx5_v1_and_v2_per_address_puts_ipv4_v2_at_3() -> None:
    t = PortTable("mlx5_bond_0", 1, 16, MLX5_TYPES)
    t.set_default(default_gid(MAC), BOND)
    assert t.add(V4, BOND) == [2, 3]
    assert [(i, s.type) for i, s in t.entries()] == [
        (0, "RoCE v1"),
        (1, "RoCE v2"),
        (2, "RoCE v1"),
        (3, "RoCE v2"),
    ]


def test_full_table_drops_new_gids() -> None:
    t = PortTable("d", 1, 2)
    t.set_default(default_gid(MAC), BOND)
    assert t.add(V4, BOND) == [1]
    assert t.add(sysfs.gid_for_ip("198.51.100.3"), BOND) == []


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="captured sysfs fixtures not present")
def test_simulated_tree_has_every_file_of_the_captured_one(tmp_path: Path) -> None:
    """Same paths (gid slot files, counters aside) and the same static values as the real kernel."""
    cap = materialise(str(FIXTURES / "host" / "sys"), str(tmp_path / "cap"))
    sim = build_tree(str(tmp_path / "sim"), [SimBond("bond0", "mlx5_bond_0", mac=MAC)], gid_slots=1024)

    def files(root: str, rel: str) -> set[str]:
        out = set()
        for top, _dirs, names in os.walk(os.path.join(root, rel)):
            for n in names:
                p = os.path.relpath(os.path.join(top, n), root)
                if "/hw_counters/" not in p and "/gid_attrs/" not in p:
                    out.add(p)
        return out

    dev = "devices/virtual/infiniband/mlx5_bond_0"
    captured = files(cap, dev)
    assert captured <= files(sim, dev)
    for rel in captured:
        if not rel.endswith(("node_guid", "sys_image_guid", "rate")) and "/gids/" not in rel:
            assert Path(sim, rel).read_text() == Path(cap, rel).read_text(), rel
    assert os.readlink(os.path.join(sim, "class/infiniband/mlx5_bond_0")) == os.readlink(
        os.path.join(cap, "class/infiniband/mlx5_bond_0")
    )
    assert model.table_snapshot(sim) == model.table_snapshot(cap, ["mlx5_bond_0"]) | {
        "mlx5_bond_0/1": model.table_snapshot(cap)["mlx5_bond_0/1"][:1]
    }
    assert Path(sim, "module/ib_core/parameters/netns_mode").read_text() == "Y\n"
    assert sysfs.port_for_netdev(sim, "bond0") == sysfs.RdmaPort(
        "mlx5_bond_0", 1, "bond0", "uverbs0", "Ethernet", "ACTIVE"
    )


def test_comparable_form_hides_link_local_values() -> None:
    snap = {"d/1": [{"index": 0, "gid": "fe80::1", "type": "RoCE v2", "ndev": "bond0"}]}
    snap["d/1"].append({"index": 1, "gid": "::ffff:198.51.100.2", "type": "RoCE v2", "ndev": "net1"})
    assert model.comparable(snap) == {
        "d/1": [(0, "ipv6 link-local", "RoCE v2", "bond0"), (1, "ipv4 198.51.100.2", "RoCE v2", "net1")]
    }


def test_removing_an_absent_entry_changes_nothing() -> None:
    """A queued RTM_DELADDR whose entry the node already removed (sim.node settles a netns read
    whole against deletions still queued) is a no-op, and never touches the same GID's other owner."""
    t = host_table()
    t.add(V4, POD)
    before = t.entries()
    assert t.remove(sysfs.gid_for_ip("198.51.100.99"), BOND) == []
    assert t.remove(V4, Owner(9, 9)) == []
    assert t.remove(V4, BOND) == [1]
    assert t.remove(V4, BOND) == []
    assert t.entries() == [e for e in before if e[0] != 1]
    assert t.remove(default_gid(MAC), BOND) == []  # the default GID is not an address's entry
    assert index_of(t, V4, POD) == 2
