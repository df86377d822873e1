"""The device plugin's NPWG device-info files: which files, holding what (the device model, pure), and
how the directory is kept (written when different, ours removed when stale, others' left, a failure
logged and retried). The real plugin process writing them is in test_deviceplugin_devinfo.py."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from rdma_cni.deviceplugin.devinfo import DeviceInfoDir
from rdma_cni.devices import devinfo
from rdma_cni.devices.config import DEFAULT_DEVICE_INFO_DIR, PluginConfig, load_config
from rdma_cni.devices.errors import ConfigError
from rdma_cni.devices.hca import Hca
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot
from rdma_cni.devices.pools import SharedSnapshot

RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"


def bond(i: int, pci: bool = True) -> RdmaBond:
    return RdmaBond(id=f"mlx5_bond_{i}", netdev=f"bond{i}", port=1, numa=0, uverbs=f"uverbs{i}",
                    pci=f"0000:{0x17 + i:02x}:00.0" if pci else None)


def snap(*bonds: RdmaBond) -> Snapshot:
    return Snapshot(bonds=bonds, health=tuple(DeviceHealth(b.id, True, "") for b in bonds))


def hca(name: str, pci: str | None) -> Hca:
    return Hca(id=name, port=1, link_layer="InfiniBand", netdev=None, netdevs=(), pci=pci, vendor="15b3",
               device_id="101b", driver="mlx5_core", numa=1, uverbs="uverbs4")


def test_each_bond_gets_the_file_multus_looks_up_naming_its_pci_address_and_rdma_device() -> None:
    files = devinfo.wanted_files({RESOURCE: snap(bond(0), bond(3), bond(5, pci=False))})
    assert files == {
        "tke.cloud.tencent.com-tke-shared-rdma-mlx5_bond_0-device.json": {
            "type": "pci", "version": "1.1.0",
            "pci": {"pci-address": "0000:17:00.0", "rdma-device": "mlx5_bond_0"}},
        "tke.cloud.tencent.com-tke-shared-rdma-mlx5_bond_3-device.json": {
            "type": "pci", "version": "1.1.0",
            "pci": {"pci-address": "0000:1a:00.0", "rdma-device": "mlx5_bond_3"}},
        # Soft-RoCE and other virtual devices have no PCI address: only the RDMA device is named
        "tke.cloud.tencent.com-tke-shared-rdma-mlx5_bond_5-device.json": {
            "type": "pci", "version": "1.1.0", "pci": {"rdma-device": "mlx5_bond_5"}},
    }


def test_a_shared_pool_of_one_hca_describes_it_under_every_virtual_id_and_of_several_under_none() -> None:
    one = SharedSnapshot(3, (hca("mlx5_4", "0000:1b:00.0"),), (DeviceHealth("mlx5_4", True, ""),))
    files = devinfo.pool_files("rdma/hca_shared_devices_a", one)
    doc = {"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:1b:00.0", "rdma-device": "mlx5_4"}}
    assert files == {f"rdma-hca_shared_devices_a-{i}-device.json": doc for i in range(3)}
    two = SharedSnapshot(3, (hca("mlx5_4", "0000:1b:00.0"), hca("mlx5_5", "0000:1c:00.0")), ())
    assert devinfo.pool_files("rdma/hca_shared_devices_a", two) == {}  # a pci entry names one device


@pytest.mark.parametrize(("name", "ours"), [
    ("rdma-hca-mlx5_4-device.json", True),
    ("rdma-hca-17-device.json", True),
    ("rdma-hca-b-0-device.json", False),  # pool rdma/hca-b's (or another plugin's), not pool rdma/hca's
    ("intel.com-sriov-0000:3b:02.0-device.json", False),
    ("rdma-hca-mlx5_4.json", False),
    ("rdma-hca--device.json", False),
    (".tmp-rdma-hca-mlx5_4-device.json", False),
])
def test_only_files_of_our_resources_in_the_exact_shape_are_ours(name: str, ours: bool) -> None:
    assert devinfo.is_ours(name, ["rdma/hca"]) is ours


def test_sync_writes_what_differs_removes_our_stale_files_and_leaves_other_plugins_files(
    tmp_path: Path,
) -> None:
    d = tmp_path / "dp"
    d.mkdir()
    stale = d / "tke.cloud.tencent.com-tke-shared-rdma-mlx5_bond_7-device.json"
    stale.write_text("{}")
    other = d / "intel.com-sriov_netdevice-0000:3b:02.0-device.json"
    other.write_text('{"type":"pci"}')
    wrong = d / "tke.cloud.tencent.com-tke-shared-rdma-mlx5_bond_0-device.json"
    wrong.write_text('{"type":"vdpa"}')
    files = DeviceInfoDir(str(d), [RESOURCE])
    assert files.sync({RESOURCE: snap(bond(0), bond(1))}) == (2, 1)
    assert sorted(n for n in os.listdir(d) if not n.startswith(".")) == sorted(
        [other.name, wrong.name, "tke.cloud.tencent.com-tke-shared-rdma-mlx5_bond_1-device.json"])
    assert json.loads(wrong.read_text())["pci"]["rdma-device"] == "mlx5_bond_0"
    assert oct(wrong.stat().st_mode & 0o777) == oct(0o644)
    assert other.read_text() == '{"type":"pci"}'
    before = wrong.stat().st_ino
    assert files.sync({RESOURCE: snap(bond(0), bond(1))}) == (0, 0)  # nothing changed: nothing written
    assert wrong.stat().st_ino == before
    assert files.sync({RESOURCE: snap(bond(1))}) == (0, 1)  # a device no longer served: its file goes
    assert not wrong.exists()


def test_a_pool_dropped_from_the_config_loses_its_files_at_the_next_start(tmp_path: Path) -> None:
    """The new run serves other resources, so only the list the earlier run left says the old files
    were ours; another plugin's file of the same shape stays."""
    d = tmp_path / "dp"
    DeviceInfoDir(str(d), [RESOURCE]).sync({RESOURCE: snap(bond(0), bond(1))})
    other = d / "example.com-nic-mlx5_9-device.json"
    other.write_text("{}")
    one = SharedSnapshot(2, (hca("mlx5_4", None),), (DeviceHealth("mlx5_4", True, ""),))
    assert DeviceInfoDir(str(d), ["rdma/ib"]).sync({"rdma/ib": one}) == (2, 2)
    assert sorted(n for n in os.listdir(d) if not n.startswith(".")) == [
        other.name, "rdma-ib-0-device.json", "rdma-ib-1-device.json"]
    assert json.loads((d / ".rdma-device-plugin.json").read_text()) == [
        "rdma-ib-0-device.json", "rdma-ib-1-device.json"]


def test_a_directory_that_cannot_be_written_is_logged_once_and_the_next_sync_mends_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "dp"
    blocked.write_text("a file where the directory should be")
    files = DeviceInfoDir(str(blocked), [RESOURCE])
    with caplog.at_level(logging.INFO, "rdma_cni.deviceplugin.devinfo"):
        assert files.sync({RESOURCE: snap(bond(0))}) == (0, 0)
        assert files.sync({RESOURCE: snap(bond(0))}) == (0, 0)
        blocked.unlink()
        assert files.sync({RESOURCE: snap(bond(0))}) == (1, 0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "lacks device-info" in warnings[0].getMessage()
    assert any("current again" in r.getMessage() for r in caplog.records)


def test_the_directory_defaults_to_where_multus_reads_and_empty_turns_the_files_off(tmp_path: Path) -> None:
    assert PluginConfig().device_info_dir == DEFAULT_DEVICE_INFO_DIR == devinfo.DEFAULT_DIR
    cfg = load_config({"device_info_dir": "", "cni_conf": str(tmp_path / "none.conf")}, None)
    assert cfg.device_info_dir == ""
    with pytest.raises(ConfigError) as e:
        load_config({"device_info_dir": "relative/dp", "cni_conf": str(tmp_path / "none.conf")}, None)
    text = str(e.value)
    assert text.startswith("--device-info-dir") and "/var/run/k8s.cni.cncf.io/devinfo/dp" in text
