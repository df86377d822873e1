"""The DRA driver on every config form the device plugin takes, without a socket: a simulated node of
4 RoCE bonds (NUMA 0,0,1,1; PCIe roots pci0000:00 and pci0000:20) and 2 InfiniBand HCAs (mlx5_4 on
ibs108, NUMA 1; mlx5_5 on ibs109, NUMA 0; both under pci0000:40) in a sysfs tree (rdma_cni.sim.tree)
with real char devices under a dev root, read by the device model's own scan; only the netlink look
at links and addresses is answered by the test (every bond up with an address, the IPoIB netdevs up).

Checked: the device table and ResourceSlices for seed 002's Mellanox config.json alone and with more
pools, ``pools:`` with an exclusive and a shared pool, an HCA two pools select, a pool of count 0;
the refusal of an HCA in an exclusive and another pool (as the device plugin's); health per device,
and kubelet's health stream following a rescan (the one test here on a unix socket); a pool change
on rescan; and NodePrepareResources of an InfiniBand HCA, a bond of a shared pool and one HCA through
two pools."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import seed002

from rdma_cni.devices import inventory
from rdma_cni.devices.config import ConfigError, PluginConfig, load_config
from rdma_cni.devices.facts import BondFacts
from rdma_cni.devices.inventory import NodeScan
from rdma_cni.dra import health, names
from rdma_cni.dra.daemon import start_scan
from rdma_cni.dra.driver import ClaimError, ClaimRef, Driver
from rdma_cni.dra.prepared import PreparedDevice
from rdma_cni.dra.service import serve_dra
from rdma_cni.dra.slices import slice_specs, table_specs
from rdma_cni.dra.table import DeviceBoard, DeviceTable, of_bonds, table_for
from rdma_cni.dra.watch import NodeWatch
from rdma_cni.proto import drahealth_v1_pb2, drahealth_v1_pb2_grpc
from rdma_cni.sim.devnodes import make_dev_nodes
from rdma_cni.sim.tree import SimBond, SimIbHca, add_ib_hca, build_tree, set_port_state

NODE = "node-a"
POOL_A = "rdma/hca_shared_devices_a"
POOL_B = "rdma/hca_shared_devices_b"
SECOND = {"resourceName": "hca_shared_devices_b", "rdmaHcaMax": 100,
          "selectors": {"vendors": ["15b3"], "linkTypes": ["ether"]}}
EXCLUSIVE = "tke.cloud.tencent.com/tke-shared-rdma"
POOLS_BOTH = f"""
pools:
  - resourceName: {EXCLUSIVE}
  - resourceName: rdma/ib
    mode: shared
    count: 10
    selectors: {{linkTypes: [infiniband]}}
"""
IFF_UP, IFF_LOWER_UP = 0x1, 0x10000
FACTS = {f"mlx5_bond_{i}": BondFacts("Ethernet", 3, f"198.51.100.{16 * i}/28") for i in range(4)}


@dataclass
class SimNode:
    sysfs: str
    dev: str
    tmp: Path
    links: dict[str, tuple[int, int]]  # netdev -> (ifindex, flags), what netlink answers
    ipv4: dict[int, list[str]]

    def config(self, text: str | None) -> PluginConfig:
        path = None
        if text is not None:
            path = self.tmp / ("config.json" if text.lstrip().startswith("{") else "dp.yaml")
            path.write_text(text)
        flags = {"sysfs_root": self.sysfs, "dev_root": self.dev, "cni_conf": str(self.tmp / "absent.conf"),
                 "data_dir": str(self.tmp / "data"), "run_dir": str(self.tmp / "run")}
        return load_config(flags, str(path) if path else None)

    def table(self, text: str | None) -> tuple[PluginConfig, NodeScan, DeviceTable]:
        cfg = self.config(text)
        scan = start_scan(cfg)
        return cfg, scan, table_for(cfg, scan)

    def down(self, netdev: str) -> None:
        index, _ = self.links[netdev]
        self.links[netdev] = (index, 0)


@pytest.fixture
def sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimNode]:
    bonds = [SimBond(f"bond{i}", f"mlx5_bond_{i}", numa_node=i // 2, mad=True) for i in range(4)]
    sysfs = build_tree(str(tmp_path / "sys"), bonds, gid_slots=4, rdma_cm=True)
    add_ib_hca(sysfs, SimIbHca("mlx5_4", "ibs108", pci_index=4, uverbs=4, numa_node=1))
    add_ib_hca(sysfs, SimIbHca("mlx5_5", "ibs109", pci_index=5, uverbs=5, numa_node=0))
    dev = str(tmp_path / "dev")
    make_dev_nodes(sysfs, dev)  # mknod: the health check wants character devices
    up = IFF_UP | IFF_LOWER_UP
    links = {**{f"bond{i}": (10 + i, up) for i in range(4)}, "ibs108": (20, up), "ibs109": (21, up)}
    ipv4 = {10 + i: [f"198.51.100.{16 * i + 2}"] for i in range(4)}
    node = SimNode(sysfs, dev, tmp_path, links, ipv4)

    def links_and_addresses(netdevs: Iterable[str]) -> tuple[dict[str, tuple[int, int]], dict[int, list[str]],
                                                              dict[int, list[str]]]:
        wanted = {n: node.links[n] for n in netdevs if n in node.links}
        return wanted, dict(node.ipv4), {}

    monkeypatch.setattr(inventory, "_links_and_addresses", links_and_addresses)
    gid = tmp_path / "run" / "gid"
    gid.mkdir(parents=True)
    # The host GID index rdma-macvlan records: what Allocate reads when the GID table has no entry
    # for the bond's address (the simulated tables here hold only the default GID).
    (gid / "host.json").write_text(json.dumps({"ports": [{"netdev": f"bond{i}", "gidIndex": 3}
                                                        for i in range(4)]}))
    yield node


def devices(table: DeviceTable, facts: dict[str, BondFacts] | None = None) -> dict[str, dict[str, Any]]:
    [spec] = table_specs(NODE, table, FACTS if facts is None else facts)
    return {d["name"]: d for d in spec["devices"]}


def shares(count: int) -> dict[str, Any]:
    policy = {"default": "1", "validRange": {"min": "1", "step": "1"}}
    return {"shares": {"value": str(count), "requestPolicy": policy}}


def test_seed_002s_config_json_publishes_its_infiniband_hca_as_a_shared_device_of_its_pool(
    sim: SimNode,
) -> None:
    _, _, table = sim.table(seed002.config_text())
    devs = devices(table)
    assert list(devs) == ["mlx5-4"]
    assert devs["mlx5-4"] == {
        "name": "mlx5-4",
        "attributes": {
            "hca": {"string": "mlx5_4"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:40"},
            "resource.kubernetes.io/pciBusID": {"string": "0000:1b:00.0"},
            "resource.kubernetes.io/numaNode": {"int": 1},
            "linkLayer": {"string": "InfiniBand"},
            "pool": {"string": POOL_A},
            "k8s.cni.cncf.io/deviceID": {"string": "mlx5_4"},
            "k8s.cni.cncf.io/resourceName": {"string": POOL_A},
        },
        "allowMultipleAllocations": True,
        "capacity": shares(200),
    }


def test_a_second_mellanox_pool_of_roce_hcas_publishes_the_bonds_by_their_netdev_with_bond_attributes(
    sim: SimNode,
) -> None:
    _, _, table = sim.table(seed002.with_second_pool(SECOND))
    devs = devices(table)
    assert list(devs) == ["mlx5-4", "bond0", "bond1", "bond2", "bond3"]  # pool by pool, in the config's order
    assert devs["bond2"]["attributes"] == {
        "bond": {"string": "bond2"}, "hca": {"string": "mlx5_bond_2"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:20"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:19:00.0"},
        "resource.kubernetes.io/numaNode": {"int": 1},
        "linkLayer": {"string": "Ethernet"}, "gidIndex": {"int": 3},
        "ipv4Subnet": {"string": "198.51.100.32/28"},
        "pool": {"string": POOL_B},
        "k8s.cni.cncf.io/deviceID": {"string": "mlx5_bond_2"},
        "k8s.cni.cncf.io/resourceName": {"string": POOL_B},
    }
    assert all(devs[f"bond{i}"]["capacity"] == shares(100) for i in range(4))
    assert devs["mlx5-4"]["capacity"] == shares(200)
    assert not any("taints" in d for d in devs.values())


def test_pools_with_an_exclusive_and_a_shared_pool_publish_exclusive_bonds_and_shared_hcas(
    sim: SimNode,
) -> None:
    _, _, table = sim.table(POOLS_BOTH)
    devs = devices(table)
    assert list(devs) == ["bond0", "bond1", "bond2", "bond3", "mlx5-4", "mlx5-5"]
    for i in range(4):
        assert "capacity" not in devs[f"bond{i}"] and "allowMultipleAllocations" not in devs[f"bond{i}"]
        assert devs[f"bond{i}"]["attributes"]["pool"] == {"string": EXCLUSIVE}
    for name, numa in (("mlx5-4", 1), ("mlx5-5", 0)):
        assert devs[name]["capacity"] == shares(10)
        attrs = devs[name]["attributes"]
        assert attrs["pool"] == {"string": "rdma/ib"}
        assert attrs["resource.kubernetes.io/numaNode"] == {"int": numa}
        assert not {"bond", "gidIndex", "ipv4Subnet"} & set(attrs)


def test_an_hca_two_shared_pools_select_is_a_device_of_each_with_a_name_of_its_own(sim: SimNode) -> None:
    text = json.dumps({"configList": [
        {"resourceName": "all", "rdmaHcaMax": 5},  # Mellanox's default: every HCA
        {"resourceName": "ib", "rdmaHcaMax": 7, "selectors": {"linkTypes": ["infiniband"]}},
    ]})
    _, _, table = sim.table(text)
    devs = devices(table)
    assert list(devs) == ["mlx5-4", "mlx5-5", "bond0", "bond1", "bond2", "bond3", "mlx5-4-ib", "mlx5-5-ib"]
    assert [(n, d["attributes"]["pool"]["string"], d["capacity"]["shares"]["value"]) for n, d in devs.items()
            if d["attributes"]["hca"] == {"string": "mlx5_4"}] == [("mlx5-4", "rdma/all", "5"),
                                                                  ("mlx5-4-ib", "rdma/ib", "7")]
    # Upstream Multus's DRA path keys its resource map by resourceName and hands over deviceID: the
    # same HCA in two pools is one deviceID under each pool's name, so a NAD of either pool finds it.
    multus = [(d["attributes"]["k8s.cni.cncf.io/resourceName"]["string"],
               d["attributes"]["k8s.cni.cncf.io/deviceID"]["string"]) for n, d in devs.items()
              if d["attributes"]["hca"] == {"string": "mlx5_4"}]
    assert multus == [("rdma/all", "mlx5_4"), ("rdma/ib", "mlx5_4")]


def test_a_pool_of_count_0_has_no_device_as_the_device_plugin_lists_none(sim: SimNode) -> None:
    _, _, table = sim.table(seed002.with_second_pool({**SECOND, "rdmaHcaMax": 0}))
    assert list(devices(table)) == ["mlx5-4"]


def test_an_hca_in_an_exclusive_and_another_pool_stops_the_start_naming_both(sim: SimNode) -> None:
    with pytest.raises(ConfigError) as e:
        sim.table(POOLS_BOTH.replace("[infiniband]", "[ether]"))
    text = str(e.value)
    assert text.startswith("pools[1].selectors") and "narrow the selectors" in text
    assert f"mlx5_bond_0 is in exclusive pool {EXCLUSIVE} and in pool rdma/ib" in text


def test_the_default_form_through_the_table_is_the_bond_slices_as_before(sim: SimNode) -> None:
    for text, count in ((None, None), ("mode: shared\nsharedCount: 64\n", 64)):
        _, scan, table = sim.table(text)
        assert table == of_bonds(scan.bonds, count)
        [spec] = table_specs(NODE, table, FACTS)
        assert [spec] == slice_specs(NODE, scan.bonds, FACTS, count)
        assert [d["name"] for d in spec["devices"]] == [f"bond{i}" for i in range(4)]
        assert all("pool" not in d["attributes"] for d in spec["devices"])
    _, scan, table = sim.table("resourceName: example.com/roce\n")  # Multus matches a NAD by this name
    [spec] = table_specs(NODE, table, FACTS)
    assert {d["attributes"]["k8s.cni.cncf.io/resourceName"]["string"] for d in spec["devices"]} == {
        "example.com/roce"}


def test_health_is_each_devices_own_and_a_shared_bond_needs_no_address(sim: SimNode) -> None:
    set_port_state(sim.sysfs, "mlx5_4", 1, active=False)
    sim.ipv4.pop(11)  # bond1 lost its address: a shared pool's HCA does not need it
    _, _, table = sim.table(seed002.with_second_pool(SECOND))
    devs = devices(table)
    [taint] = devs["mlx5-4"]["taints"]
    assert taint["key"] == "rdma.tke.cloud.tencent.com/unhealthy" and "DOWN" in taint["value"]
    assert [n for n, d in devs.items() if "taints" in d] == ["mlx5-4"]
    _, _, exclusive = sim.table(POOLS_BOTH)
    assert [n for n, d in devices(exclusive).items() if "taints" in d] == ["bond1", "mlx5-4"]
    response = health.health_response(table, NODE, drahealth_v1_pb2, 1.0)
    assert [(d.device.device_name, d.health) for d in response.devices][:2] == [
        ("mlx5-4", drahealth_v1_pb2.UNHEALTHY), ("bond0", drahealth_v1_pb2.HEALTHY)]


def test_a_pool_change_on_rescan_is_a_new_table_and_wakes_the_publisher(sim: SimNode) -> None:
    text = json.dumps({"configList": [{"resourceName": "ib", "rdmaHcaMax": 7,
                                       "selectors": {"linkTypes": ["infiniband"]}}]})
    cfg, first, table = sim.table(text)
    board = DeviceBoard(table)
    woken: list[bool] = []
    watch = NodeWatch(cfg, board, first, on_change=lambda: woken.append(True))
    assert watch.rescan() is False and woken == []  # nothing changed
    add_ib_hca(sim.sysfs, SimIbHca("mlx5_6", "ibs110", pci_index=6, uverbs=6, numa_node=0))
    make_dev_nodes(sim.sysfs, sim.dev)
    sim.links["ibs110"] = (22, IFF_UP | IFF_LOWER_UP)
    assert watch.rescan() is True and woken == [True]
    _, now = board.current()
    assert [d.name for d in now.devices] == ["mlx5-4", "mlx5-5", "mlx5-6"]
    sim.down("ibs110")
    assert watch.rescan() is True
    assert [d.name for d in board.current()[1].devices if not d.health.healthy] == ["mlx5-6"]


def test_the_health_stream_names_every_pool_device_and_follows_a_rescan(sim: SimNode) -> None:
    cfg, first, table = sim.table(seed002.with_second_pool(SECOND))
    board = DeviceBoard(table)
    watch = NodeWatch(cfg, board, first)
    short = tempfile.mkdtemp(prefix="dra-")  # a unix socket path has 107 bytes at most
    driver = Driver(cfg, NODE, board, Claims(), str(sim.tmp / "claims"), str(sim.tmp / "cdi"))
    server = serve_dra(driver, f"{short}/dra.sock", board)
    try:
        with grpc.insecure_channel(f"unix:{short}/dra.sock") as ch:
            stream = drahealth_v1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
                drahealth_v1_pb2.NodeWatchResourcesRequest(), timeout=30)
            assert [(d.device.pool_name, d.device.device_name, d.health) for d in next(stream).devices] == [
                (NODE, n, drahealth_v1_pb2.HEALTHY) for n in ("mlx5-4", "bond0", "bond1", "bond2", "bond3")]
            set_port_state(sim.sysfs, "mlx5_4", 1, active=False)
            assert watch.rescan() is True
            bad = [(d.device.device_name, d.message) for d in next(stream).devices
                   if d.health == drahealth_v1_pb2.UNHEALTHY]
            assert [n for n, _ in bad] == ["mlx5-4"] and "RDMA port mlx5_4/1 is DOWN" in bad[0][1]
            stream.cancel()
    finally:
        server.stop(grace=0).wait(2)
        shutil.rmtree(short, ignore_errors=True)


# --- NodePrepareResources -----------------------------------------------------------------------------


class Claims:
    """The API server's ResourceClaims, as the driver reads them (``get_claim``)."""

    def __init__(self) -> None:
        self.objs: dict[tuple[str, str], dict[str, Any]] = {}

    def add(self, name: str, devices: list[str]) -> ClaimRef:
        uid = str(uuid.uuid4())
        self.objs[("default", name)] = {"metadata": {"name": name, "namespace": "default", "uid": uid},
                                        "status": {"allocation": {"devices": {"results": [
                                            {"request": "nic", "driver": names.DRIVER, "pool": NODE,
                                             "device": d} for d in devices]}}}}
        return ClaimRef("default", uid, name)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.objs.get((namespace, name))


def driver_for(sim: SimNode, text: str) -> tuple[Driver, Claims]:
    cfg, _, table = sim.table(text)
    api = Claims()
    return Driver(cfg, NODE, DeviceBoard(table), api, str(sim.tmp / "claims"), str(sim.tmp / "cdi")), api


def spec_of(sim: SimNode, uid: str) -> dict[str, Any]:
    path = sim.tmp / "cdi" / f"rdma.tke.cloud.tencent.com-bond_{uid}.json"
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def env_of(doc: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in doc["containerEdits"]["env"])


def test_prepare_of_an_infiniband_hca_gives_its_nodes_rdma_cm_and_its_name_without_a_gid_index(
    sim: SimNode,
) -> None:
    driver, api = driver_for(sim, seed002.config_text())
    ref = api.add("ib", ["mlx5-4"])
    [dev] = driver.prepare([ref])[ref.uid]  # type: ignore[misc]
    assert dev == PreparedDevice("nic", NODE, "mlx5-4", (f"{names.CDI_KIND}={ref.uid}-mlx5_4",))
    doc = spec_of(sim, ref.uid)
    assert [n["path"] for n in doc["devices"][0]["containerEdits"]["deviceNodes"]] == [
        "/dev/infiniband/uverbs4", "/dev/infiniband/umad4", "/dev/infiniband/issm4"]
    assert [n["path"] for n in doc["containerEdits"]["deviceNodes"]] == ["/dev/infiniband/rdma_cm"]
    assert env_of(doc) == {"NCCL_IB_HCA": "=mlx5_4", "UCX_NET_DEVICES": "mlx5_4:1"}


def test_prepare_gives_the_gid_index_only_when_every_device_is_of_an_exclusive_pool(sim: SimNode) -> None:
    driver, api = driver_for(sim, POOLS_BOTH)
    bonds = api.add("bonds", ["bond0", "bond1"])
    mixed = api.add("mixed", ["bond2", "mlx5-5"])
    results = driver.prepare([bonds, mixed])
    assert not any(isinstance(r, ClaimError) for r in results.values())
    assert env_of(spec_of(sim, bonds.uid)) == {"NCCL_IB_HCA": "=mlx5_bond_0,mlx5_bond_1",
                                               "UCX_NET_DEVICES": "mlx5_bond_0:1,mlx5_bond_1:1",
                                               "NCCL_IB_GID_INDEX": "3", "UCX_IB_GID_INDEX": "3"}
    assert env_of(spec_of(sim, mixed.uid)) == {"NCCL_IB_HCA": "=mlx5_5,mlx5_bond_2",
                                               "UCX_NET_DEVICES": "mlx5_5:1,mlx5_bond_2:1"}
    # The same bonds as members of a shared pool: each pod gets a GID index of its own (its ipvlan's).
    shared_driver, shared_api = driver_for(sim, seed002.with_second_pool(SECOND))
    shared = shared_api.add("shared", ["bond0", "bond1"])
    assert shared_driver.prepare([shared])[shared.uid] != []
    assert env_of(spec_of(sim, shared.uid)) == {"NCCL_IB_HCA": "=mlx5_bond_0,mlx5_bond_1",
                                                "UCX_NET_DEVICES": "mlx5_bond_0:1,mlx5_bond_1:1"}


def test_prepare_of_one_hca_through_two_pools_hands_it_out_once(sim: SimNode) -> None:
    text = json.dumps({"configList": [
        {"resourceName": "all", "rdmaHcaMax": 5},
        {"resourceName": "ib", "rdmaHcaMax": 7, "selectors": {"linkTypes": ["infiniband"]}},
    ]})
    driver, api = driver_for(sim, text)
    ref = api.add("both", ["mlx5-4", "mlx5-4-ib", "bond3"])
    result = driver.prepare([ref])[ref.uid]
    assert not isinstance(result, ClaimError)
    assert [d.cdi_ids for d in result] == [(f"{names.CDI_KIND}={ref.uid}-mlx5_4",)] * 2 + [
        (f"{names.CDI_KIND}={ref.uid}-mlx5_bond_3",)]
    doc = spec_of(sim, ref.uid)
    assert [d["name"] for d in doc["devices"]] == [f"{ref.uid}-mlx5_4", f"{ref.uid}-mlx5_bond_3"]
    assert env_of(doc)["NCCL_IB_HCA"] == "=mlx5_4,mlx5_bond_3"


def test_prepare_refuses_an_unhealthy_hca_and_a_name_the_table_does_not_hold(sim: SimNode) -> None:
    set_port_state(sim.sysfs, "mlx5_4", 1, active=False)
    driver, api = driver_for(sim, seed002.config_text())
    dead, unknown = api.add("dead", ["mlx5-4"]), api.add("unknown", ["mlx5-5"])
    results = driver.prepare([dead, unknown])
    for ref, words in ((dead, "unhealthy"), (unknown, "not on node")):
        err = results[ref.uid]
        assert isinstance(err, ClaimError) and err.code.name == "FAILED_PRECONDITION" and words in err.message
    assert not (sim.tmp / "cdi").exists() or list((sim.tmp / "cdi").iterdir()) == []
