"""cni-tool doctor on a shared-mode node: rdma-ipvlan's network installed in place of
tke-rdma-macvlan's (what ``scripts/demo --mode shared`` builds). Its config is checked as the plugin
reads it, not reported missing as tke-rdma-macvlan's; its binary is checked; and the GID records its
pods leave in the runDir both plugins share are theirs, not stale. An exclusive-mode node's findings
stay as they were, and the host's unified GID index is not offered as a shared-mode pod's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rdma_cni.attachments import PHASE_ADDED, AttachmentRecord
from rdma_cni.doctor.findings import FAIL, OK, WARN, Finding
from rdma_cni.doctor.install_checks import check_binaries, check_configs
from rdma_cni.doctor.node import NodePaths, NodeSnapshot
from rdma_cni.doctor.rdma_checks import check_gids
from rdma_cni.doctor.state_checks import check_state
from rdma_cni.rdma import records
from rdma_cni.rdma.sysfs import ROCE_V2, GidEntry, RdmaPort
from rdma_cni.state import NodeState

REPO = Path(__file__).resolve().parents[2]


def node(tmp: Path, shared: bool = True, macvlan: bool = False, **ipvlan_keys: Any) -> NodeSnapshot:
    """A bin dir with the plugins and a conf dir as install.sh --mode vpc-cni lays it out, with
    rdma-ipvlan's delegate config (``shared``) and/or rdma-macvlan's (``macvlan``)."""
    bin_dir, conf_dir = tmp / "bin", tmp / "net.d"
    bin_dir.mkdir(parents=True)
    for name in ("rdma-macvlan", "rdma-multus"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    shutil.copytree(REPO / "conf" / "vpc-cni", conf_dir)
    delegates = conf_dir / "rdma-multus.d"
    if not macvlan:
        (delegates / "tke-rdma-macvlan.conf").unlink()
    if shared:
        conf = json.loads(
            (REPO / "conf" / "shared-mode" / "rdma-multus.d" / "tke-rdma-ipvlan.conf").read_text()
        )
        conf.update(dataDir=str(tmp / "ipvlan-state"), runDir=str(tmp / "run"), **ipvlan_keys)
        (delegates / "tke-rdma-ipvlan.conf").write_text(json.dumps(conf))
    paths = NodePaths(cni_bin_dir=str(bin_dir), conf_dir=str(conf_dir), results_dirs=())
    return NodeSnapshot(paths, str(tmp / "macvlan-state"), str(tmp / "run"), [], {}, {}, [], [], {})


def by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


def test_a_shared_mode_node_has_its_rdma_ipvlan_config_checked_not_a_missing_macvlan_one(
    tmp_path: Path,
) -> None:
    checks = by_check(check_configs(node(tmp_path)))
    assert "config tke-rdma-macvlan" not in checks, checks
    found = checks["config tke-rdma-ipvlan"]
    assert found.status == OK and "shared mode, link ipvlan" in found.detail, found


def test_a_bad_key_of_the_rdma_ipvlan_config_fails_naming_it(tmp_path: Path) -> None:
    found = by_check(check_configs(node(tmp_path, link="vxlan")))["config tke-rdma-ipvlan"]
    assert found.status == FAIL and "link" in found.detail and "tke-rdma-ipvlan.conf" in found.detail, found


def test_without_any_rdma_network_the_missing_macvlan_config_still_fails(tmp_path: Path) -> None:
    found = by_check(check_configs(node(tmp_path, shared=False)))["config tke-rdma-macvlan"]
    assert found.status == FAIL and "is missing" in found.detail


def test_with_both_configs_the_macvlan_one_is_checked_as_before(tmp_path: Path) -> None:
    checks = by_check(check_configs(node(tmp_path, macvlan=True)))
    assert checks["config tke-rdma-macvlan"].status == OK
    assert "config tke-rdma-ipvlan" not in checks


def test_the_rdma_ipvlan_binary_is_checked_only_where_its_network_is_installed(tmp_path: Path) -> None:
    shared = by_check(check_binaries(node(tmp_path / "a")))
    assert (
        shared["binary rdma-ipvlan"].status == FAIL and "rdma-ipvlan" in shared["binary rdma-ipvlan"].detail
    )
    exclusive = by_check(check_binaries(node(tmp_path / "b", shared=False, macvlan=True)))
    assert set(exclusive) == {"binary rdma-macvlan", "binary rdma-multus"}


def _gid_record(run_dir: Path, container_id: str) -> None:
    entry = GidEntry("mlx5_bond_0", 1, 5, "::ffff:198.51.100.3", ROCE_V2, "bond0", "198.51.100.3")
    records.write_pod_record(str(run_dir), container_id, "bond0", entry, mode="shared")


def test_gid_records_of_rdma_ipvlan_pods_are_theirs_and_only_orphans_warn(tmp_path: Path) -> None:
    snap = node(tmp_path)
    rec = AttachmentRecord("c-live", "net1", "/run/netns/p", 1, phase=PHASE_ADDED, network="tke-rdma-ipvlan")
    NodeState(str(tmp_path / "ipvlan-state")).put(rec)
    _gid_record(tmp_path / "run", "c-live")
    _gid_record(tmp_path / "run", "c-gone")
    findings = check_state(snap)
    warned = [f.detail for f in findings if f.status == WARN]
    assert warned == ["GID record of container c-gone (bond0) has no attachment"], findings


def _gid_snapshot(tmp: Path, shared: bool) -> NodeSnapshot:
    snap = node(tmp, shared=shared, macvlan=not shared)
    port = RdmaPort("mlx5_bond_0", 1, "bond0", "uverbs0", "Ethernet", "ACTIVE")
    host = GidEntry("mlx5_bond_0", 1, 3, "::ffff:198.51.100.2", ROCE_V2, "bond0", "198.51.100.2")
    snap.ports, snap.gids, snap.host_addrs = (
        [port],
        {("mlx5_bond_0", 1): [host]},
        {"bond0": ["198.51.100.2/28"]},
    )
    return snap


def test_the_unified_host_gid_index_is_not_offered_as_the_index_of_shared_mode_pods(tmp_path: Path) -> None:
    shared = by_check(check_gids(_gid_snapshot(tmp_path / "a", shared=True)))["gid-index-unified"]
    assert shared.status == OK and "NCCL_IB_GID_INDEX=3 for rdma-macvlan pods" in shared.detail
    assert "rdma-ipvlan pod's addresses have indexes of their own" in shared.detail
    exclusive = by_check(check_gids(_gid_snapshot(tmp_path / "b", shared=False)))["gid-index-unified"]
    assert exclusive.detail == "every device has its RoCE v2 IPv4 GID at index 3 (NCCL_IB_GID_INDEX=3)"


def test_a_pool_with_room_for_more_pods_than_a_node_runs_and_no_ranges_is_a_warning() -> None:
    """Several nodes on one RDMA subnet keep apart only by per-node 'ranges': a pool bigger than one
    node's pods (kubelet's maxPods, 110) without them is the sign of a shared subnet left unsplit."""
    from rdma_cni.doctor.shared_pools import MAX_PODS_PER_NODE, BondPool, SharedPools, findings

    def warned(pool: BondPool) -> list[str]:
        found = findings(SharedPools(config="c", data_dir="d", bonds=[pool]))
        return [f.detail for f in found if f.status == WARN and "ranges" in f.detail]

    wide = BondPool(bond="bond0", subnet="198.51.100.0/24", prefixlen=24, free=252, size=252, ranges=[])
    assert warned(wide) == [
        f"bond0's subnet 198.51.100.0/24 has room for 252 pods, more than one node runs "
        f"(kubelet's maxPods: {MAX_PODS_PER_NODE}), and no 'ranges'"
    ]
    split = BondPool(bond="bond0", subnet="198.51.100.0/24", prefixlen=24, free=11, size=11,
                     ranges=["198.51.100.4-198.51.100.14"])
    assert warned(split) == []  # this node's own share of the subnet
    one_node = BondPool(bond="bond0", subnet="198.51.100.0/26", prefixlen=26, free=61, size=61, ranges=[])
    assert warned(one_node) == []  # a /26 fits one node's pods: no sign of sharing
