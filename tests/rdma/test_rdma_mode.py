"""netns mode: the ib_core parameter seen on the real kernel, the fallbacks, and the error with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdma_cni.cni.errors import NO_RDMA_DEVICE, RDMA_MODE_MISMATCH, CniError
from rdma_cni.rdma import mode, nldev, sysfs
from rdma_cni.sim.tree import SimBond, build_tree, set_netns_mode

FIXTURES = Path("/work/shared/fixtures/sysfs-rxe-6.1")
if not FIXTURES.is_dir():
    FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "sysfs-rxe-6.1"


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="captured sysfs fixtures not present")
@pytest.mark.parametrize("state", ["host", "pod", "exclusive"])
def test_mode_from_captured_sysfs_agrees_with_rdma_system_show(state: str) -> None:
    """The module parameter must say what `rdma system show` printed in the same state."""
    shown = nldev.parse_system_show((FIXTURES / state / "netlink" / "system-show.stdout").read_text())
    assert mode.current_netns_mode(str(FIXTURES / state / "sys")) == shown.netns_mode
    assert shown.netns_mode == ("exclusive" if state == "exclusive" else "shared")


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="captured sysfs fixtures not present")
def test_parameter_went_back_to_y_after_set_shared() -> None:
    assert (
        mode.mode_from_param((FIXTURES / "exclusive" / "netns_mode_after_set_shared").read_text()) == "shared"
    )


def test_require_mode_passes_when_equal(tmp_path: Path) -> None:
    set_netns_mode(str(tmp_path), "shared")
    assert mode.require_mode(str(tmp_path), "shared") == "shared"
    set_netns_mode(str(tmp_path), "exclusive")
    assert mode.require_mode(str(tmp_path), "exclusive") == "exclusive"


def test_exclusive_node_fails_shared_config_with_the_fix(tmp_path: Path) -> None:
    set_netns_mode(str(tmp_path), "exclusive")
    with pytest.raises(CniError) as e:
        mode.require_mode(str(tmp_path), "shared")
    assert e.value.code == RDMA_MODE_MISMATCH == 101
    assert "exclusive" in e.value.msg and "shared" in e.value.msg
    assert "rdma system set netns shared" in e.value.details
    assert "no network namespace other than the host's" in e.value.details


def test_shared_node_fails_exclusive_config_with_the_fix(tmp_path: Path) -> None:
    set_netns_mode(str(tmp_path), "shared")
    with pytest.raises(CniError) as e:
        mode.require_mode(str(tmp_path), "exclusive")
    assert e.value.code == 101 and "rdma system set netns exclusive" in e.value.details


def test_garbage_parameter_and_no_kernel_fallback_is_101_naming_the_file(tmp_path: Path) -> None:
    p = tmp_path / "module" / "ib_core" / "parameters" / "netns_mode"
    p.parent.mkdir(parents=True)
    p.write_text("maybe\n")
    with pytest.raises(CniError) as e:
        mode.current_netns_mode(str(tmp_path))
    assert e.value.code == 101 and "unexpected value 'maybe'" in e.value.details


def test_no_ib_core_here_all_sources_fail_with_101(tmp_path: Path) -> None:
    """This machine's kernel has no ib_core: the sysfs file is missing and the socket is refused
    (EPROTONOSUPPORT), the rdma tool fails the same way — one clear error naming the sources."""
    if Path("/sys/module/ib_core").exists():
        pytest.skip("this kernel has ib_core")
    with pytest.raises(CniError) as e:
        mode.current_netns_mode(str(tmp_path), ask_kernel=True)
    assert e.value.code == 101
    assert "ib_core" in e.value.msg
    assert "No such file or directory" in e.value.details and "RDMA netlink" in e.value.details


def test_fake_tree_is_never_answered_by_the_running_kernel(tmp_path: Path) -> None:
    with pytest.raises(CniError) as e:
        mode.current_netns_mode(str(tmp_path))
    assert "RDMA netlink" not in e.value.details


def test_param_values() -> None:
    assert [mode.mode_from_param(v) for v in ("Y\n", "N\n", "1", "0", "x")] == [
        "shared",
        "exclusive",
        "shared",
        "exclusive",
        None,
    ]


def _one_bond_node(root: Path, netns_mode: str) -> str:
    return build_tree(str(root), [SimBond("bond0", "mlx5_bond_0")], gid_slots=2, netns_mode=netns_mode)


def test_bond_ports_finds_each_bonds_port_and_leaves_out_a_bond_without_one(tmp_path: Path) -> None:
    root = _one_bond_node(tmp_path, "shared")
    ports = sysfs.list_ports(root)
    found = mode.bond_ports(root, ["bond0", "eth9"], ports, required=False, netns_mode="shared")
    assert [(bond, p.device, p.port) for bond, p in found.items()] == [("bond0", "mlx5_bond_0", 1)]


def test_bond_ports_refuses_a_required_bond_without_rdma_naming_it_then_checks_the_mode(
    tmp_path: Path,
) -> None:
    root = _one_bond_node(tmp_path, "exclusive")
    with pytest.raises(CniError) as missing:
        mode.bond_ports(root, ["eth9"], sysfs.list_ports(root), required=True, netns_mode="shared")
    assert missing.value.code == NO_RDMA_DEVICE and "eth9 has no RDMA device" in missing.value.msg
    with pytest.raises(CniError) as wrong_mode:
        mode.bond_ports(root, ["bond0"], sysfs.list_ports(root), required=True, netns_mode="shared")
    assert wrong_mode.value.code == RDMA_MODE_MISMATCH
