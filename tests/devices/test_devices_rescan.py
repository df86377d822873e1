"""The front ends' rescan pacer (:mod:`rdma_cni.devices.rescan`): on the timer it only looks at what
has no netlink event, and asks for a full scan when that changed, when an event came, or when the
last full scan is a minute old. On a simulated sysfs tree and real /dev nodes (mknod)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdma_cni.devices import inventory
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.rescan import RescanPacer, quiet_facts
from rdma_cni.sim import devnodes, tree


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(tmp_path: Path) -> tuple[PluginConfig, str, str]:
    root, dev = str(tmp_path / "sys"), str(tmp_path / "dev")
    tree.build_tree(root, [tree.SimBond(f"bond{i}", f"mlx5_bond_{i}") for i in range(2)], gid_slots=4)
    if os.geteuid() != 0:
        pytest.skip("mknod of the uverbs nodes needs root")
    devnodes.make_dev_nodes(root, dev)
    cfg = PluginConfig(sysfs_root=root, dev_root=dev, cni_conf="/nonexistent/rdma.conf",
                       data_dir=str(tmp_path / "state"))  # fmt: skip
    return cfg, root, dev


def test_the_timer_scans_only_when_what_has_no_event_changed(node: tuple[PluginConfig, str, str]) -> None:
    cfg, root, dev = node
    clock = Clock()
    first = inventory.first_scan(cfg)
    pacer = RescanPacer(cfg, first, full_every=60, clock=clock)
    assert not pacer.due(False) and not pacer.due(False) and pacer.looks == 2
    tree.set_port_state(root, "mlx5_bond_1", 1, active=False)  # an InfiniBand-like port going down
    assert pacer.due(False)
    scan = inventory.scan_pools(cfg, cfg.pool_specs(), previous=first)
    assert not next(h for h in scan.bonds.health if h.id == "mlx5_bond_1").healthy
    pacer.scanned(scan)
    assert not pacer.due(False)
    devnodes.remove_dev_node(dev, "uverbs0")  # a uverbs node gone from /dev
    assert pacer.due(False)


def test_an_event_or_a_minute_without_a_full_scan_always_scans(node: tuple[PluginConfig, str, str]) -> None:
    cfg, _, _ = node
    clock = Clock()
    pacer = RescanPacer(cfg, inventory.first_scan(cfg), full_every=60, clock=clock)
    assert pacer.due(True)
    clock.now += 59
    assert not pacer.due(False)
    clock.now += 1
    assert pacer.due(False)


def test_a_device_leaving_sysfs_is_a_change(node: tuple[PluginConfig, str, str]) -> None:
    cfg, root, _ = node
    first = inventory.first_scan(cfg)
    before = quiet_facts(cfg, first)
    os.rename(os.path.join(root, "class/infiniband/mlx5_bond_0"), os.path.join(root, "gone"))
    assert quiet_facts(cfg, first) != before


def test_a_change_during_the_scan_is_scanned_at_the_next_look(node: tuple[PluginConfig, str, str]) -> None:
    """The look that asked for a scan is its baseline, not one taken after it: a port that goes down
    after the scan read it and before the watch says it scanned is not taken as already seen."""
    cfg, root, _ = node
    first = inventory.first_scan(cfg)
    pacer = RescanPacer(cfg, first, full_every=60, clock=Clock())
    assert pacer.due(True)
    scan = inventory.scan_pools(cfg, cfg.pool_specs(), previous=first)  # reads the port ACTIVE
    tree.set_port_state(root, "mlx5_bond_0", 1, active=False)  # then it goes down
    pacer.scanned(scan)
    assert pacer.due(False)
