"""The real rdma-device-plugin process keeping its NPWG device-info files (tests/dpnode.py's node: the
plugin in a node netns against the test kubelet): one file per bond where Multus looks it up,
stale ones of ours gone at start, another device plugin's untouched, none with ``--device-info-dir ""``."""

from __future__ import annotations

import json
import os

import pytest
from dpnode import dp_node, wait_for
from netns import can_run

pytestmark = pytest.mark.netns

PREFIX = "tke.cloud.tencent.com-tke-shared-rdma-"


@pytest.fixture(autouse=True)
def _root() -> None:
    reason = can_run()
    if reason:
        pytest.skip(reason)


def test_the_plugin_writes_one_file_per_bond_and_removes_only_its_own_stale_ones() -> None:
    with dp_node(bonds=2) as d:
        os.makedirs(d.device_info_dir)
        stale = os.path.join(d.device_info_dir, f"{PREFIX}mlx5_bond_7-device.json")  # an earlier node's
        other = os.path.join(d.device_info_dir, "intel.com-sriov_netdevice-0000:3b:02.0-device.json")
        for path in (stale, other):
            with open(path, "w") as f:
                f.write('{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:3b:02.0"}}')
        d.start()
        want = {f"{PREFIX}mlx5_bond_{i}-device.json" for i in range(2)}
        wait_for(lambda: want <= set(os.listdir(d.device_info_dir)), 10, "both bonds' device-info files")
        wait_for(lambda: not os.path.exists(stale), 5, "the stale file removed")
        own = ".rdma-device-plugin.json"
        assert set(os.listdir(d.device_info_dir)) == want | {os.path.basename(other), own}
        for i in range(2):
            with open(os.path.join(d.device_info_dir, f"{PREFIX}mlx5_bond_{i}-device.json")) as f:
                doc = json.load(f)
            assert doc["type"] == "pci" and doc["version"] == "1.1.0"
            assert doc["pci"]["rdma-device"] == f"mlx5_bond_{i}"
        assert "device-info files in" in d.log_text()


def test_an_empty_device_info_dir_writes_no_file() -> None:
    with dp_node(bonds=1) as d:
        d.start("--device-info-dir", "")
        d.endpoint().wait_list(lambda devs: len(devs) == 1)
        assert not os.path.exists(d.device_info_dir)
