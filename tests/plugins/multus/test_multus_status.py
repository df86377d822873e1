"""network-status entries built by Multus's rules (NPWG client ``CreateNetworkStatuses``), field by field.

Each expected entry is what Multus writes for the same CNI result: the rule it follows is named in
the test. The RDMA ``device-info`` comes from a real GID record written by rdma_cni.rdma.records
and a sysfs ``device`` link, as rdma-macvlan leaves them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdma_cni.cni.errors import KUBE_API_FAILURE, CniError
from rdma_cni.cni.result import parse
from rdma_cni.plugins.multus import status as ms
from rdma_cni.rdma import records
from rdma_cni.rdma.sysfs import GidEntry


def no_device(_: str) -> None:
    return None


# ptp's answer (host veth without sandbox, then the pod's eth0): the two-interface path.
PTP = {
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "veth1a2b3c4d", "mac": "9a:1b:2c:3d:4e:5f"},
        {"name": "eth0", "mac": "6e:00:00:00:00:01", "sandbox": "/var/run/netns/p1"},
    ],
    "ips": [{"address": "198.51.100.5/26", "gateway": "198.51.100.1", "interface": 1}],
    "routes": [{"dst": "0.0.0.0/0"}],
    "dns": {"nameservers": ["198.51.100.53"], "search": ["svc.cluster.local"]},
}


def test_ptp_result_gives_one_default_entry_for_the_pod_interface() -> None:
    # Rules: only sandboxed interfaces; default = the interface of the first IP with a gateway;
    # a default route without a gateway prints as Go's "<nil>"; dns copied, empty fields omitted.
    got = ms.network_statuses("tke-route-eni", parse(PTP), True, no_device)
    assert got == [{
        "name": "tke-route-eni", "interface": "eth0", "ips": ["198.51.100.5"], "mac": "6e:00:00:00:00:01",
        "default": True, "dns": {"nameservers": ["198.51.100.53"], "search": ["svc.cluster.local"]},
        "gateway": ["<nil>"],
    }]  # fmt: skip


def test_single_interface_result_takes_every_ip_and_gateways_of_default_routes() -> None:
    # Rule (CreateNetworkStatus): one interface -> one entry with all IPs, whatever their index.
    result = parse({
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "net1", "mac": "6e:00:00:00:00:02", "mtu": 9000, "sandbox": "/p"}],
        "ips": [{"address": "203.0.113.7/24"}, {"address": "2001:db8::7/64", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "203.0.113.1"},
                   {"dst": "198.51.100.0/24", "gw": "203.0.113.1"}],
    })  # fmt: skip
    got = ms.network_statuses("default/rdma", result, False, no_device)
    assert got == [{
        "name": "default/rdma", "interface": "net1", "ips": ["203.0.113.7", "2001:db8::7"],
        "mac": "6e:00:00:00:00:02", "mtu": 9000, "dns": {}, "gateway": ["203.0.113.1"],
    }]  # fmt: skip


def test_several_pod_interfaces_get_their_own_ips_and_unindexed_ips_go_to_the_last() -> None:
    result = parse({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": f"bond{i}", "mac": f"6e:00:00:00:01:0{i}", "sandbox": "/p"}
                       for i in range(3)],
        "ips": [{"address": "198.51.100.2/28", "interface": 0},
                {"address": "198.51.100.18/28", "interface": 1},
                {"address": "198.51.100.3/28", "interface": 0}, {"address": "198.51.100.34/28"}],
    })  # fmt: skip
    got = ms.network_statuses("default/tke-rdma-macvlan", result, False, no_device)
    assert [e["interface"] for e in got] == ["bond0", "bond1", "bond2"]
    assert [e.get("ips") for e in got] == [
        ["198.51.100.2", "198.51.100.3"], ["198.51.100.18"], ["198.51.100.34"]
    ]  # fmt: skip
    assert not any("default" in e or "gateway" in e for e in got)


def test_default_network_without_a_gateway_marks_its_first_pod_interface() -> None:
    result = parse({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": "/p"}, {"name": "eth1", "sandbox": "/p"}],
        "ips": [{"address": "198.51.100.9/26", "interface": 1}],
    })  # fmt: skip
    got = ms.network_statuses("cluster", result, True, no_device)
    assert [e.get("default", False) for e in got] == [True, False]
    assert got[0] == {"name": "cluster", "interface": "eth0", "default": True, "dns": {}}


def test_a_result_without_interfaces_gives_no_entry() -> None:
    result = parse({"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.9/26"}]})
    assert ms.network_statuses("x", result, False, no_device) == []


def test_render_lays_entries_out_like_go_marshal_indent_joined_by_commas() -> None:
    entries = [{"name": "a", "ips": ["198.51.100.1"], "dns": {}}, {"name": "b", "dns": {}}]
    text = ms.render(entries)
    assert text == (
        '[{\n    "name": "a",\n    "ips": [\n        "198.51.100.1"\n    ],\n    "dns": {}\n},'
        '{\n    "name": "b",\n    "dns": {}\n}]'
    )
    assert json.loads(text) == entries


def test_rdma_bond_interfaces_carry_device_info_from_the_gid_record(tmp_path: Path) -> None:
    run_dir, sysfs = tmp_path / "run", tmp_path / "sys"
    pci = sysfs / "devices" / "pci0000:00" / "0000:3b:00.0"
    pci.mkdir(parents=True)
    (sysfs / "class" / "infiniband" / "mlx5_bond_0").mkdir(parents=True)
    (sysfs / "class" / "infiniband" / "mlx5_bond_0" / "device").symlink_to(pci)
    entry = GidEntry("mlx5_bond_0", 1, 3, "::ffff:198.51.100.2", "ROCE_V2", "bond0", "198.51.100.2")
    records.write_pod_record(str(run_dir), "c1", "bond0", entry, uverbs="uverbs0")
    config = json.dumps({"cniVersion": "1.0.0", "name": "tke-rdma-macvlan", "plugins": [
        {"type": "rdma-macvlan", "runDir": str(run_dir), "sysfsRoot": str(sysfs)}]}).encode()  # fmt: skip
    lookup = ms.rdma_device_info(config, "c1")
    assert lookup("bond0") == {
        "type": "pci", "version": "1.0.0",
        "pci": {"pci-address": "0000:3b:00.0", "rdma-device": "mlx5_bond_0"},
        "rdma": {"device": "mlx5_bond_0", "port": 1, "gid-index": 3, "gid": "::ffff:198.51.100.2"},
    }  # fmt: skip
    assert lookup("bond1") is None  # no record: not an RDMA bond of this attachment
    other = json.dumps({"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "ptp"}]}).encode()
    assert ms.rdma_device_info(other, "c1")("bond0") is None  # not an rdma-macvlan network


def test_shared_mode_interfaces_carry_the_pod_addresses_own_gid_index(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    entry = GidEntry("mlx5_bond_0", 1, 7, "::ffff:198.51.100.4", "ROCE_V2", "bond0", "198.51.100.4")
    records.write_pod_record(str(run_dir), "c2", "bond0", entry, uverbs="uverbs0", mode="shared")
    plugin = {"type": "rdma-ipvlan", "runDir": str(run_dir), "sysfsRoot": str(tmp_path / "sys")}
    config = json.dumps({"cniVersion": "1.0.0", "name": "tke-rdma-ipvlan", "plugins": [plugin]}).encode()
    info = ms.rdma_device_info(config, "c2")("bond0")
    assert info is not None and info["rdma"] == {"device": "mlx5_bond_0", "port": 1, "gid-index": 7,
                                                 "gid": "::ffff:198.51.100.4"}


def test_publish_counts_failures_and_never_raises(tmp_path: Path) -> None:
    calls: list[dict[str, str]] = []

    def refused(annotations: dict[str, str]) -> None:
        calls.append(annotations)
        raise CniError(KUBE_API_FAILURE, "Kubernetes API refused PATCH pod default/p/status with 403")

    assert ms.publish(refused, "[]", "default/p", str(tmp_path)) is False
    assert ms.publish(refused, "[]", "default/p", str(tmp_path)) is False
    assert calls == [{ms.ANNOTATION: "[]"}] * 2
    stats = ms.failures(str(tmp_path))
    assert stats["failures"] == 2 and "403" in stats["lastError"] and stats["lastPod"] == "default/p"
    assert ms.publish(lambda a: None, "[]", "default/p", str(tmp_path)) is True
    assert ms.failures(str(tmp_path))["failures"] == 2


@pytest.mark.parametrize("bad", [b"", b"{", b"[]", b'{"failures": "x"}'])
def test_unreadable_failure_counter_reads_as_zero(tmp_path: Path, bad: bytes) -> None:
    (tmp_path / "stats").mkdir()
    (tmp_path / ms.STATS_FILE).write_bytes(bad)
    assert ms.failures(str(tmp_path)) == {"failures": 0}

