"""cni-tool doctor and cni-tool state against sysfs trees captured from a real kernel
(shared/fixtures/sysfs-rxe-6.1: host, pod, exclusive) and H3's simulated node, with the bonds as veth
ends in a node netns holding the fixture's addresses, and the plugin's state written by its own
NodeState class.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netns
import pytest

from rdma_cni.attachments import PHASE_ADDED, AttachmentRecord, BondRecord
from rdma_cni.cni.cache import CacheEntry, ResultCache
from rdma_cni.doctor.diagnose import diagnose_until, run_checks
from rdma_cni.doctor.findings import FAIL, OK, SKIP, WARN, Finding, exit_code
from rdma_cni.doctor.inventory import inventory, render_inventory
from rdma_cni.doctor.node import NodePaths, observe
from rdma_cni.rdma.sysfs import gid_for_ip
from rdma_cni.sim import tree
from rdma_cni.sim.fixture import materialise
from rdma_cni.state import NodeState

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(os.environ.get("RDMA_CNI_FIXTURES", REPO.parent / "shared" / "fixtures")) / "sysfs-rxe-6.1"
if not FIXTURES.is_dir():
    FIXTURES = Path("/work/shared/fixtures/sysfs-rxe-6.1")
# The fixture's bonds and addresses (fixtures/README.md).
FIXTURE_BONDS = {"bond0": "198.51.100.2/28", "bond1": "198.51.100.18/28"}


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[netns.Node]:
    reason = netns.can_run()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(netns, "PREFIX", "h6-")
    with netns.node() as n:
        yield n


def installed(tmp: Path, default_network: bool = True) -> tuple[str, str]:
    """A bin dir with the two plugins and a conf dir laid out as install.sh --mode vpc-cni makes it."""
    bin_dir, conf_dir = tmp / "bin", tmp / "net.d"
    bin_dir.mkdir()
    for name in ("rdma-macvlan", "rdma-multus"):
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o755)
    shutil.copytree(REPO / "conf" / "vpc-cni", conf_dir)
    if default_network:
        (conf_dir / "rdma-multus.d" / "tke-route-eni.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "tke-route-eni",
                    "plugins": [
                        {"type": "bridge", "ipam": {"type": "host-local", "subnet": "203.0.113.0/24"}}
                    ],
                }
            )
        )
    return str(bin_dir), str(conf_dir)


def paths(n: netns.Node, sysfs_root: str, tmp: Path, **kw: Any) -> NodePaths:
    bin_dir, conf_dir = installed(tmp)
    (tmp / "kubelet").mkdir()
    (tmp / "kubelet" / "config.yaml").write_text(
        "kind: KubeletConfiguration\ntopologyManagerPolicy: best-effort\n"
    )
    base: dict[str, Any] = {
        "sysfs_root": sysfs_root,
        "netns": f"/run/netns/{n.name}",
        "cni_bin_dir": bin_dir,
        "conf_dir": conf_dir,
        "kubelet_root_dir": str(tmp / "kubelet"),
        "data_dir": n.data_dir,
        "run_dir": n.run_dir,
        "proc_root": str(tmp / "proc"),
        "results_dirs": (str(tmp / "cache"),),
    }
    base.update(kw)
    return NodePaths(**base)


def fixture_tree(state: str, tmp: Path) -> str:
    return materialise(str(FIXTURES / state / "sys"), str(tmp / f"sys-{state}"))


def by_check(findings: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in findings:
        out.setdefault(f.check, []).append(f)
    return out


def statuses(findings: list[Finding]) -> dict[str, str]:
    return {f.check: f.status for f in findings}


def bonds_as_fixture(n: netns.Node, with_ips: dict[str, str]) -> None:
    for bond in FIXTURE_BONDS:
        ips = [with_ips[bond]] if bond in with_ips else []
        n.bond(bond, *ips)


def pin(n: netns.Node, container_id: str, bond: str, cidr: str, pod_path: str) -> None:
    """What rdma-macvlan's ADD records for a bond it moved into a pod (H2's NodeState)."""
    ip, prefix = cidr.split("/")
    addr = {
        "family": 2,
        "prefixlen": int(prefix),
        "flags": 128,
        "scope": 0,
        "index": 2,
        "attrs": [["IFA_ADDRESS", ip], ["IFA_LOCAL", ip]],
    }
    inode = os.stat(pod_path).st_ino if os.path.exists(pod_path) else 4026531999
    rec = AttachmentRecord(
        container_id=container_id,
        ifname="net1",
        netns=pod_path,
        netns_inode=inode,
        phase=PHASE_ADDED,
        network="tke-rdma-macvlan",
        bonds=[
            BondRecord(
                bond=bond,
                bond_index=2,
                pod_ifname=bond,
                temp_name="mvtmp",
                addresses=[addr],
                rdma={
                    "device": "mlx5_bond_0",
                    "port": 1,
                    "uverbs": "uverbs0",
                    "ip": ip,
                    "hostGidIndex": 1,
                    "podGidIndex": 1,
                },
            )
        ],
    )
    NodeState(n.data_dir).put(rec)


# ---- the captured real-kernel trees ------------------------------------------------------------


def test_healthy_node_from_the_real_kernel_capture_is_all_ok(node: netns.Node, tmp_path: Path) -> None:
    bonds_as_fixture(node, FIXTURE_BONDS)
    findings = run_checks(observe(paths(node, fixture_tree("host", tmp_path), tmp_path)))
    bad = [f for f in findings if f.status not in (OK, SKIP)]
    assert bad == [], bad
    checks = by_check(findings)
    # Soft-RoCE publishes v2 GIDs only: the IPv4 GID sits at index 1 on both devices.
    gids = checks["roce-v2-gid mlx5_bond_0/1"] + checks["roce-v2-gid mlx5_bond_1/1"]
    assert [g.detail.split(":")[0] for g in gids] == ["index 1", "index 1"]
    assert "198.51.100.2 on bond0" in gids[0].detail
    assert "NCCL_IB_GID_INDEX=1" in checks["gid-index-unified"][0].detail
    assert {"rdma-device mlx5_bond_0/1", "rdma-device mlx5_bond_1/1", "bond bond0", "bond bond1"} <= set(
        checks
    )
    assert exit_code(findings) == 0


def test_ip_lent_to_a_live_pod_is_ok_and_shows_where(node: netns.Node, tmp_path: Path) -> None:
    bonds_as_fixture(node, {"bond1": FIXTURE_BONDS["bond1"]})
    pod = node.pod()
    pin(node, "c0ffee", "bond0", FIXTURE_BONDS["bond0"], pod.path)
    findings = run_checks(observe(paths(node, fixture_tree("pod", tmp_path), tmp_path)))
    s = statuses(findings)
    assert s["bond bond0"] == OK and s["roce-v2-gid mlx5_bond_0/1"] == OK and s["state"] == OK, findings
    detail = {f.check: f.detail for f in findings}
    assert "198.51.100.2/28 lent to container c0ffee" in detail["bond bond0"]
    assert (
        "index 1" in detail["roce-v2-gid mlx5_bond_0/1"]
        and "lent to a pod" in detail["roce-v2-gid mlx5_bond_0/1"]
    )
    assert exit_code(findings) == 0


def test_ip_pinned_to_a_dead_netns_fails_with_the_gc_fix(node: netns.Node, tmp_path: Path) -> None:
    bonds_as_fixture(node, {"bond1": FIXTURE_BONDS["bond1"]})
    pin(node, "deadbeef", "bond0", FIXTURE_BONDS["bond0"], "/run/netns/h6-gone-for-good")
    snap = observe(paths(node, fixture_tree("pod", tmp_path), tmp_path))
    findings = run_checks(snap)
    checks = by_check(findings)
    assert checks["bond bond0"][0].status == FAIL and "netns is gone" in checks["bond bond0"][0].detail
    assert "cni-tool gc" in checks["bond bond0"][0].fix
    assert checks["state"][0].status == FAIL and "pins bond0" in checks["state"][0].detail
    assert exit_code(findings) == 1
    inv = inventory(snap)
    assert inv["missing"] == [
        {"bond": "bond0", "addresses": ["198.51.100.2/28"], "reason": inv["missing"][0]["reason"]}
    ]
    assert "MISSING bond0: 198.51.100.2/28" in render_inventory(inv)


def test_bond_without_ip_and_without_pod_fails(node: netns.Node, tmp_path: Path) -> None:
    bonds_as_fixture(node, {"bond1": FIXTURE_BONDS["bond1"]})
    findings = run_checks(observe(paths(node, fixture_tree("pod", tmp_path), tmp_path)))
    checks = by_check(findings)
    assert checks["bond bond0"][0].status == FAIL
    assert "no pod holds it" in checks["bond bond0"][0].detail
    assert checks["bond bond1"][0].status == OK


def test_exclusive_mode_fails_with_the_command_that_fixes_it(node: netns.Node, tmp_path: Path) -> None:
    bonds_as_fixture(node, FIXTURE_BONDS)
    findings = run_checks(observe(paths(node, fixture_tree("exclusive", tmp_path), tmp_path)))
    mode = by_check(findings)["rdma-netns-mode"][0]
    assert mode.status == FAIL and "exclusive" in mode.detail
    assert "rdma system set netns shared" in mode.fix
    assert exit_code(findings) == 1


# ---- H3's simulated node ------------------------------------------------------------------------


def sim_node(tmp: Path, n: netns.Node, count: int = 4, index: int = 3) -> str:
    """bond0..N-1 with mlx5-like tables (IPv4 RoCE v2 GID at ``index``), bonds in the node netns."""
    bonds = [tree.SimBond(f"bond{i}", f"mlx5_bond_{i}") for i in range(count)]
    root = tree.build_tree(str(tmp / "sim-sys"), bonds, gid_slots=16)
    for i, b in enumerate(bonds):
        ip = f"198.51.100.{16 * i + 2}"
        tree.write_slot(root, b.device, 1, index, gid_for_ip(ip), b.name)
        n.bond(b.name, f"{ip}/28")
    return root


def test_simulated_eight_gpu_style_node_reports_the_unified_index(node: netns.Node, tmp_path: Path) -> None:
    root = sim_node(tmp_path, node, count=4, index=3)
    findings = run_checks(observe(paths(node, root, tmp_path)))
    assert [f for f in findings if f.status not in (OK, SKIP)] == []
    assert "NCCL_IB_GID_INDEX=3" in by_check(findings)["gid-index-unified"][0].detail
    assert len([f for f in findings if f.check.startswith("roce-v2-gid")]) == 4


def test_down_port_and_split_gid_indices_are_reported(node: netns.Node, tmp_path: Path) -> None:
    root = sim_node(tmp_path, node, count=2, index=3)
    tree.set_port_state(root, "mlx5_bond_1", 1, active=False)
    tree.clear_slot(root, "mlx5_bond_1", 1, 3)
    tree.write_slot(root, "mlx5_bond_1", 1, 5, gid_for_ip("198.51.100.18"), "bond1")
    findings = run_checks(observe(paths(node, root, tmp_path)))
    checks = by_check(findings)
    assert checks["rdma-device mlx5_bond_1/1"][0].status == FAIL
    assert "DOWN" in checks["rdma-device mlx5_bond_1/1"][0].detail
    unified = checks["gid-index-unified"][0]
    assert (
        unified.status == WARN and "mlx5_bond_0/1=3" in unified.detail and "mlx5_bond_1/1=5" in unified.detail
    )


def test_bond_ip_without_its_gid_fails(node: netns.Node, tmp_path: Path) -> None:
    root = sim_node(tmp_path, node, count=1, index=3)
    tree.clear_slot(root, "mlx5_bond_0", 1, 3)
    finding = by_check(run_checks(observe(paths(node, root, tmp_path))))["roce-v2-gid mlx5_bond_0/1"][0]
    assert finding.status == FAIL and "no RoCE v2 GID" in finding.detail


# ---- installation and kubelet -------------------------------------------------------------------


def test_missing_binaries_configs_and_default_network_fail(node: netns.Node, tmp_path: Path) -> None:
    root = sim_node(tmp_path, node, count=1)
    p = paths(node, root, tmp_path)
    os.unlink(os.path.join(p.cni_bin_dir, "rdma-macvlan"))
    os.unlink(os.path.join(p.conf_dir, "rdma-multus.d", "tke-route-eni.conflist"))
    findings = run_checks(observe(p))
    checks = by_check(findings)
    assert (
        checks["binary rdma-macvlan"][0].status == FAIL
        and "install.sh" in checks["binary rdma-macvlan"][0].fix
    )
    assert checks["binary rdma-multus"][0].status == OK
    default = checks["default-network tke-route-eni"][0]
    assert default.status == FAIL and "tke-route-eni" in default.fix


def test_foreign_first_config_warns_and_bad_delegate_key_fails(node: netns.Node, tmp_path: Path) -> None:
    root = sim_node(tmp_path, node, count=1)
    p = paths(node, root, tmp_path)
    Path(p.conf_dir, "00-aaa.conflist").write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "x", "plugins": [{"type": "flannel"}]})
    )
    delegate = Path(p.conf_dir, "rdma-multus.d", "tke-rdma-macvlan.conf")
    raw = json.loads(delegate.read_text())
    raw["rdma"]["netnsMode"] = "sometimes"
    delegate.write_text(json.dumps(raw))
    checks = by_check(run_checks(observe(p)))
    runtime = checks["runtime-config"][0]
    assert runtime.status == WARN and "00-aaa.conflist (flannel)" in runtime.detail
    bad = checks["config tke-rdma-macvlan"][0]
    assert bad.status == FAIL and "rdma.netnsMode" in bad.detail


@pytest.mark.parametrize(
    ("setup", "want"),
    [
        ({"config.yaml": "topologyManagerPolicy: best-effort\n"}, (OK, "best-effort")),
        ({"config.yaml": "kind: KubeletConfiguration\n"}, (WARN, "none")),
        (
            {"cmdline": ["/usr/bin/kubelet", "--topology-manager-policy=single-numa-node"]},
            (OK, "single-numa"),
        ),
        (
            {
                "cmdline": ["kubelet", "--config", "KUBELET_CONFIG"],
                "other.yaml": "topologyManagerPolicy: none\n",
            },
            (WARN, "other.yaml"),
        ),
        ({}, (SKIP, "not readable")),
        (
            # kubelet in a mount namespace of its own: its --config read through /proc/<pid>/root
            {
                "cmdline": ["kubelet", "--config=/etc/kubelet-ns.yaml"],
                "root/etc/kubelet-ns.yaml": "topologyManagerPolicy: best-effort\n",
            },
            (OK, "4242/root/etc/kubelet-ns.yaml"),
        ),
    ],
)
def test_topology_manager_policy(tmp_path: Path, setup: dict[str, Any], want: tuple[str, str]) -> None:
    from rdma_cni.doctor.host_checks import check_topology_manager
    from rdma_cni.doctor.node import NodeSnapshot

    kubelet, proc = tmp_path / "kubelet", tmp_path / "proc"
    kubelet.mkdir()
    proc.mkdir()
    for name, content in setup.items():
        if name == "cmdline":
            (proc / "4242").mkdir()
            argv = [a.replace("KUBELET_CONFIG", str(kubelet / "other.yaml")) for a in content]
            (proc / "4242" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        elif name.startswith("root/"):
            (proc / "4242" / name).parent.mkdir(parents=True)
            (proc / "4242" / name).write_text(content)
        else:
            (kubelet / name).write_text(content)
    snap = NodeSnapshot(
        NodePaths(kubelet_root_dir=str(kubelet), proc_root=str(proc)), "", "", [], {}, {}, [], [], {}
    )
    finding = check_topology_manager(snap)[0]
    assert finding.status == want[0] and want[1] in finding.detail, finding


# ---- the commands -----------------------------------------------------------------------------


def cni_tool(p: NodePaths, *args: str) -> subprocess.CompletedProcess[str]:
    opts = [
        "--sysfs-root",
        p.sysfs_root,
        "--netns",
        p.netns,
        "--cni-bin-dir",
        p.cni_bin_dir,
        "--conf-dir",
        p.conf_dir,
        "--kubelet-root-dir",
        p.kubelet_root_dir,
        "--data-dir",
        p.data_dir,
        "--run-dir",
        p.run_dir,
        *[a for d in p.results_dirs for a in ("--cache-dir", d)],
    ]
    return subprocess.run(
        [sys.executable, "-m", "rdma_cni.cli.tool", *args, *opts],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_doctor_command_text_json_and_exit_codes(node: netns.Node, tmp_path: Path) -> None:
    bonds_as_fixture(node, FIXTURE_BONDS)
    p = paths(node, fixture_tree("host", tmp_path), tmp_path)
    ok = cni_tool(p, "doctor")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert all(line.split()[0] in (OK, WARN, FAIL, SKIP) for line in lines[:-1]), lines
    assert lines[-1].endswith("0 failures")
    node.ip("addr", "flush", "dev", "bond1")
    bad = cni_tool(p, "doctor", "--json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert report["ok"] is False
    failed = [f for f in report["findings"] if f["status"] == FAIL]
    assert {f["check"] for f in failed} == {"bond bond1"}
    assert all(f["fix"] for f in failed)
    # The captured GID table still holds bond1's GID (a file tree does not follow the flush): the doctor
    # sees it outside the node netns with no attachment holding bond1, and says so.
    gid = next(f for f in report["findings"] if f["check"] == "roce-v2-gid mlx5_bond_1/1")
    assert gid["status"] == WARN and "no attachment holds bond1" in gid["detail"]


def test_doctor_wait_looks_again_while_something_fails_and_answers_once_it_passes(
    node: netns.Node, tmp_path: Path
) -> None:
    """The DaemonSet's readiness probe (``--wait``): a node that comes right between two looks is
    Ready at the next look, not a probe period later; one that stays broken FAILs when the wait is
    up, with what the last look saw."""
    bonds_as_fixture(node, FIXTURE_BONDS)
    p = paths(node, fixture_tree("host", tmp_path), tmp_path)
    node.ip("addr", "flush", "dev", "bond1")
    naps: list[float] = []

    def bond1_comes_back(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 1:
            node.ip("addr", "add", FIXTURE_BONDS["bond1"], "dev", "bond1")

    assert exit_code(diagnose_until(p, 30, sleep=bond1_comes_back)) == 0
    assert naps == [1.0], "one more look, at once after the node was ready"

    node.ip("addr", "flush", "dev", "bond1")
    now = [0.0]

    def tick(seconds: float) -> None:
        now[0] += seconds

    findings = diagnose_until(p, 3.5, clock=lambda: now[0], sleep=tick)
    assert now[0] == 3.0, "looked at 0, 1, 2 and 3 s, not past the wait"
    assert [f.check for f in findings if f.status == FAIL] == ["bond bond1"]
    out = cni_tool(p, "doctor", "--wait", "1")
    assert out.returncode == 1 and out.stdout.splitlines()[-1].endswith("1 failures"), out.stdout
    bad = cni_tool(p, "doctor", "--wait", "-1")
    assert bad.returncode == 2 and "--wait" in bad.stderr, bad.stderr


def test_state_command_names_the_pod_and_what_the_host_misses(node: netns.Node, tmp_path: Path) -> None:
    bonds_as_fixture(node, {"bond1": FIXTURE_BONDS["bond1"]})
    p = paths(node, fixture_tree("pod", tmp_path), tmp_path)
    live = node.pod()
    pin(node, "abc123live", "bond0", FIXTURE_BONDS["bond0"], live.path)
    args = [("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", "ibv-app-0")]
    ResultCache(p.results_dirs[0]).write(
        CacheEntry("rdma-multus", "abc123live", "eth0", b"{}", cni_args=args)
    )
    out = cni_tool(p, "state")
    assert out.returncode == 0, out.stderr
    assert "container abc123live (default/ibv-app-0) net1: added, netns alive" in out.stdout
    assert "bond0 -> bond0: 198.51.100.2/28, mlx5_bond_0 GID index 1, /dev/infiniband/uverbs0" in out.stdout
    assert "the host is missing nothing" in out.stdout
    node.delete_pod(live)
    gone = cni_tool(p, "state", "--json")
    assert gone.returncode == 1
    inv = json.loads(gone.stdout)
    assert inv["attachments"][0]["netnsAlive"] is False
    assert inv["missing"][0]["bond"] == "bond0" and inv["missing"][0]["addresses"] == ["198.51.100.2/28"]


def test_state_shows_the_pod_table_and_rules_of_a_bond_whose_routes_clashed(
    node: netns.Node, tmp_path: Path
) -> None:
    """A real ADD into a pod whose eth0 already routes bond0's prefix puts bond0's routes in pod table
    100 behind a ``from`` rule; state shows that table and rule as the pod's ``ip rule`` has them, and
    nothing of the kind for bond1, whose pod had no clash (its routes are in the pod's main table)."""
    node.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
    node.bond("bond1", "198.51.100.18/28", peer="198.51.100.17/28")
    node.ip("route", "add", "203.0.113.0/28", "via", "198.51.100.1")
    before = node.snapshot()
    p = paths(node, fixture_tree("pod", tmp_path), tmp_path)
    clashing, plain = node.pod(), node.pod()
    for cmd in (["link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"],
                ["addr", "add", "203.0.113.129/25", "dev", "eth0"], ["link", "set", "eth0", "up"],
                ["route", "add", "203.0.113.0/28", "via", "203.0.113.130", "dev", "eth0"]):
        node.pod_exec(clashing, "ip", *cmd)
    attached = ((clashing, "bond0", "clash1"), (plain, "bond1", "plain1"))
    for pod, bond, cid in attached:
        res = node.plugin("ADD", node.config(masters=[bond], cniVersion="1.1.0"), pod, container_id=cid)
        assert res.code == 0, res.stdout + res.stderr
    live = [r for r in node.pod_json(clashing, "rule") if r.get("src", "all") != "all"]
    assert [(r["priority"], r["src"], r["table"]) for r in live] == [(100, "198.51.100.2", "100")], live

    text = cni_tool(p, "state")
    assert text.returncode == 0, text.stderr
    assert "    bond0 routes in pod table 100, rules: 100: from 198.51.100.2 lookup 100\n" in text.stdout
    assert "bond1 routes in pod table" not in text.stdout
    inv = json.loads(cni_tool(p, "state", "--json").stdout)
    bonds = {b["bond"]: b for a in inv["attachments"] for b in a["bonds"]}
    assert bonds["bond0"]["podTable"] == 100
    assert bonds["bond0"]["podRules"] == [{"priority": 100, "from": "198.51.100.2", "table": 100}]
    assert bonds["bond1"]["podTable"] is None and bonds["bond1"]["podRules"] == []

    for pod, bond, cid in attached:
        res = node.plugin("DEL", node.config(masters=[bond], cniVersion="1.1.0"), pod, container_id=cid)
        assert res.code == 0, res.stdout + res.stderr
    assert "no attachments: nothing is pinned" in cni_tool(p, "state").stdout
    assert node.snapshot() == before


def test_a_deleted_attachment_waiting_for_its_ipam_release_is_a_warning(tmp_path: Path) -> None:
    """A DEL that gave the bond back but could not release the IPAM lease leaves an ipam-pending
    record without bonds: doctor says what it waits for, not that a bond is pinned."""
    from rdma_cni.attachments import PHASE_IPAM_PENDING
    from rdma_cni.doctor.node import NodeSnapshot
    from rdma_cni.doctor.state_checks import check_state

    rec = AttachmentRecord(container_id="c0ffee", ifname="net1", netns="/run/netns/h15-gone",
                           netns_inode=4026531999, phase=PHASE_IPAM_PENDING, ipam={"type": "host-local"})
    snap = NodeSnapshot(paths=NodePaths(), data_dir=str(tmp_path), run_dir=str(tmp_path), ports=[], gids={},
                        host_addrs={}, attachments=[rec], unreadable_state=[], netns_alive={"c0ffee": False})
    (finding,) = check_state(snap)
    assert finding.status == WARN
    assert "IPAM lease (host-local) is not released yet" in finding.detail and "pins" not in finding.detail
