"""The DRA driver's ResourceSlices as a pure function of the device model: attributes, taints, shared
mode's capacity and the API's per-slice limits. No sockets, no netlink."""

from __future__ import annotations

from rdma_cni.devices.facts import BondFacts
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot
from rdma_cni.dra import names
from rdma_cni.dra.daemon import sticky
from rdma_cni.dra.slices import slice_specs


def bond(i: int, numa: int | None = 0, pci: bool = True) -> RdmaBond:
    return RdmaBond(id=f"mlx5_bond_{i}", netdev=f"bond{i}", port=1, numa=numa, uverbs=f"uverbs{i}",
                    pci=f"0000:{0x17 + i:02x}:00.0" if pci else None,
                    pcie_root=f"pci0000:{(i // 2) * 0x20:02x}" if pci else None)


def snap(bonds: list[RdmaBond], unhealthy: dict[str, str] | None = None) -> Snapshot:
    bad = unhealthy or {}
    return Snapshot(bonds=tuple(bonds), health=tuple(
        DeviceHealth(b.id, b.id not in bad, bad.get(b.id, "")) for b in bonds))


FACTS = {f"mlx5_bond_{i}": BondFacts("Ethernet", 3, f"198.51.100.{16 * i}/28") for i in range(300)}


def test_one_device_per_bond_with_standard_and_own_attributes() -> None:
    [spec] = slice_specs("node-a", snap([bond(0), bond(3, numa=1)]), FACTS, None)
    assert spec["driver"] == "rdma.tke.cloud.tencent.com" and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    dev0, dev3 = spec["devices"]
    assert dev0["name"] == "bond0" and dev3["name"] == "bond3"
    assert dev3["attributes"] == {
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:20"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:1a:00.0"},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "bond": {"string": "bond3"}, "hca": {"string": "mlx5_bond_3"}, "linkLayer": {"string": "Ethernet"},
        "gidIndex": {"int": 3}, "ipv4Subnet": {"string": "198.51.100.48/28"},
        "k8s.cni.cncf.io/deviceID": {"string": "mlx5_bond_3"},
        "k8s.cni.cncf.io/resourceName": {"string": "tke.cloud.tencent.com/tke-shared-rdma"},
    }
    assert "taints" not in dev0 and "allowMultipleAllocations" not in dev0 and "capacity" not in dev0


def test_every_device_names_its_resource_and_device_id_as_upstream_multus_dra_path_matches_them() -> None:
    """Multus (main, after v4.3.0) skips devices without both attributes, matches the NAD's
    resourceName against the second and passes the first as the delegate's deviceID: the config's
    own resourceName, and the bond's RDMA device name, which rdma-macvlan maps back to the bond."""
    bonds = [bond(i) for i in range(4)]
    for shared in (None, 1000):
        [spec] = slice_specs("n", snap(bonds, {"mlx5_bond_2": "down"}), FACTS, shared,
                             resource_name="example.com/roce")
        got = [(d["attributes"]["k8s.cni.cncf.io/resourceName"], d["attributes"]["k8s.cni.cncf.io/deviceID"])
               for d in spec["devices"]]
        assert got == [({"string": "example.com/roce"}, {"string": f"mlx5_bond_{i}"}) for i in range(4)]
    for dev in spec["devices"]:  # each a qualified name whose part after the domain the API takes (<= 32)
        for key in ("k8s.cni.cncf.io/deviceID", "k8s.cni.cncf.io/resourceName"):
            domain, ident = key.split("/")
            assert ident.isidentifier() and len(ident) <= 32 and domain == "k8s.cni.cncf.io"
            assert key in dev["attributes"]


def test_numa_minus_one_and_virtual_device_leave_numa_and_pci_out() -> None:
    [spec] = slice_specs("n", snap([bond(0, numa=None, pci=False)]),
                         {"mlx5_bond_0": BondFacts("Ethernet", None, None)}, None)
    attrs = spec["devices"][0]["attributes"]
    assert set(attrs) == {"bond", "hca", "linkLayer", "k8s.cni.cncf.io/deviceID",
                          "k8s.cni.cncf.io/resourceName"}


def test_unhealthy_bond_is_tainted_noschedule_and_healthy_one_is_not() -> None:
    reason = "bond bond1 is down (`ip link set bond1 up`)"
    [spec] = slice_specs("n", snap([bond(0), bond(1)], {"mlx5_bond_1": reason}), FACTS, None)
    assert "taints" not in spec["devices"][0]
    [taint] = spec["devices"][1]["taints"]
    assert taint["key"] == "rdma.tke.cloud.tencent.com/unhealthy" and taint["effect"] == "NoSchedule"
    value = taint["value"]
    assert len(value) <= 63 and value[0].isalnum() and value[-1].isalnum()
    assert all(c.isalnum() or c in "-_." for c in value)


def test_shared_mode_makes_every_bond_multi_allocatable_with_shares_capacity() -> None:
    [spec] = slice_specs("n", snap([bond(0), bond(1)]), FACTS, 1000)
    for dev in spec["devices"]:
        assert dev["allowMultipleAllocations"] is True
        assert dev["capacity"] == {"shares": {"value": "1000", "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "step": "1"}}}}


def test_at_most_128_devices_per_slice_and_64_once_tainted() -> None:
    many = [bond(i) for i in range(300)]
    specs = slice_specs("n", snap(many), FACTS, None)
    assert [len(s["devices"]) for s in specs] == [128, 128, 44]
    assert all(s["pool"]["resourceSliceCount"] == 3 for s in specs)
    tainted = slice_specs("n", snap(many[:200], {"mlx5_bond_150": "gone"}), FACTS, None)
    sizes = [len(s["devices"]) for s in tainted]
    assert sum(sizes) == 200 and sizes[0] == 128
    for s in tainted:
        if any("taints" in d for d in s["devices"]):
            assert len(s["devices"]) <= 64
    names_seen = [d["name"] for s in tainted for d in s["devices"]]
    assert names_seen == [f"bond{i}" for i in range(200)]


def test_node_without_bonds_publishes_one_empty_slice() -> None:
    [spec] = slice_specs("n", snap([]), {}, None)
    assert spec["devices"] == [] and spec["pool"]["resourceSliceCount"] == 1


def test_device_names_are_dns_labels_and_unique() -> None:
    got = names.device_names([("a", "Bond_A"), ("b", "bond-a"), ("c", "bond.a")])
    assert got == {"a": "bond-a", "b": "bond-a-2", "c": "bond-a-3"}


def test_a_bond_lent_to_a_pod_keeps_its_last_known_subnet() -> None:
    before = {"mlx5_bond_0": BondFacts("Ethernet", 3, "198.51.100.0/28")}
    lent = {"mlx5_bond_0": BondFacts("Ethernet", 3, None), "mlx5_bond_1": BondFacts("Ethernet", None, None)}
    assert sticky(before, lent) == {"mlx5_bond_0": BondFacts("Ethernet", 3, "198.51.100.0/28"),
                                    "mlx5_bond_1": BondFacts("Ethernet", None, None)}
    moved = {"mlx5_bond_0": BondFacts("Ethernet", 3, "203.0.113.0/24")}
    assert sticky(before, moved) == moved
