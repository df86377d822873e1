"""``cni-tool gids``: the show_gids table from captured sysfs, and from inside a real netns."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from rdma_cni.cli.tool_gids import gids
from rdma_cni.rdma.podview import read_in_netns
from rdma_cni.sim.fixture import materialise

FIXTURES = Path("/work/shared/fixtures/sysfs-rxe-6.1")
if not FIXTURES.is_dir():
    FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "sysfs-rxe-6.1"


@pytest.fixture(scope="module")
def host_tree(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not FIXTURES.is_dir():
        pytest.skip("captured sysfs fixtures not present")
    return materialise(str(FIXTURES / "host" / "sys"), str(tmp_path_factory.mktemp("gids") / "sys"))


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"h3-gids-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield f"/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_table_like_show_gids(host_tree: str) -> None:
    out = CliRunner().invoke(gids, ["--sysfs-root", host_tree])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split() == ["DEV", "PORT", "INDEX", "GID", "IPv4", "VER", "DEV"]
    assert lines[3].split() == [
        "mlx5_bond_0",
        "1",
        "1",
        "0000:0000:0000:0000:0000:ffff:c633:6402",
        "198.51.100.2",
        "v2",
        "bond0",
    ]
    assert lines[2].split() == [
        "mlx5_bond_0",
        "1",
        "0",
        "fe80:0000:0000:0000:6477:54ff:fe36:5669",
        "v2",
        "bond0",
    ]
    assert lines[-1] == "n_gids_found=4"


def test_one_device_as_json(host_tree: str) -> None:
    out = CliRunner().invoke(gids, ["mlx5_bond_1", "--sysfs-root", host_tree, "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert [(r["device"], r["index"], r["ipv4"]) for r in rows] == [
        ("mlx5_bond_1", 0, None),
        ("mlx5_bond_1", 1, "198.51.100.18"),
    ]


def test_unknown_device_is_an_error(host_tree: str) -> None:
    out = CliRunner().invoke(gids, ["mlx5_0", "--sysfs-root", host_tree])
    assert out.exit_code == 1 and "no RDMA device mlx5_0" in out.output


def test_netns_that_does_not_exist_is_one_sentence(tmp_path: Path) -> None:
    out = CliRunner().invoke(gids, ["--netns", str(tmp_path / "nope")])
    assert out.exit_code == 1 and "does not exist" in out.output
    assert not (tmp_path / "nope").exists()  # never created by accident


@pytest.mark.netns
def test_pod_view_mounts_sysfs_inside_the_netns(netns: str) -> None:
    """The child's fresh sysfs shows the netns's own interfaces (only lo), not the host's."""
    names = read_in_netns(netns, lambda root: sorted(os.listdir(os.path.join(root, "class", "net"))))
    assert names == ["lo"]
    assert sorted(os.listdir("/sys/class/net")) != ["lo"]  # and the caller's view is untouched


@pytest.mark.netns
def test_gids_in_a_netns_with_a_simulated_tree(netns: str, host_tree: str) -> None:
    out = CliRunner().invoke(gids, ["mlx5_bond_0", "--sysfs-root", host_tree, "--netns", netns])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[-1] == "n_gids_found=2"
