"""The shipped CNI configs under a real client: upstream cnitool (built from Debian's source by
scripts/build-cnitool) loads conf/<mode>'s rdma-multus conflist and tke-rdma-macvlan delegate config
(paths pointed at a test node, nothing else changed) and runs the pod ADD/CHECK/DEL through them,
with the pod annotation handed over as containerd does (the pod-annotations capability)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdma_cni.cli.demo.installed import Demo
from rdma_cni.cli.demo.node import bond_addr

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.netns


@pytest.fixture(scope="module")
def cnitool() -> str:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1)")
    if not os.access("/usr/lib/cni/ptp", os.X_OK):
        pytest.skip("reference CNI plugins missing (scripts/setup)")
    proc = subprocess.run(
        [str(REPO / "scripts" / "build-cnitool")], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        pytest.skip(f"upstream cnitool cannot be built here: {proc.stderr.strip()[-400:]}")
    return proc.stdout.strip()


@pytest.fixture(params=["vpc-cni", "global-router"])
def demo_node(request: pytest.FixtureRequest) -> Iterator[Demo]:
    """The demo's simulated node (2 bonds, RDMA sim, installed Python entry points, shipped configs
    of one cluster mode; its default network played by ptp or bridge)."""
    d = Demo(bonds=2, pod_bonds=2, bundle="", mode=request.param)
    try:
        d.build_node()
        d.wait_for("carrier", d.bonds_settled)
        with d.rdma():
            d.install_plugins()
            d.write_configs()
            yield d
    finally:
        d.cleanup()


def upstream(d: Demo, tool: str, verb: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cache = d.tmp / "libcni"
    cache.mkdir(exist_ok=True)
    script = 'mount --bind "$1" /var/lib/cni && shift && exec "$@"'
    cmd = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "sh",
        str(cache),
        "ip",
        "netns",
        "exec",
        d.node,
        tool,
        verb,
        "rdma-multus",
        f"/run/netns/{d.pod}",
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_upstream_cnitool_runs_a_pod_through_the_shipped_configs(cnitool: str, demo_node: Demo) -> None:
    d = demo_node
    os.makedirs("/var/lib/cni", exist_ok=True)  # the bind-mount target
    shipped = json.loads((REPO / "conf" / d.mode / "00-rdma-multus.conflist").read_text())
    installed = json.loads((d.conf_dir / "00-rdma-multus.conflist").read_text())
    assert installed["plugins"][0]["capabilities"] == shipped["plugins"][0]["capabilities"]
    assert installed["plugins"][0]["defaultDelegates"] == d.default_network
    pod_uid = str(uuid.uuid4())
    d.write_device_checkpoint(pod_uid)
    d.netns(d.pod)
    env = d.tool_env(pod_uid)
    add = upstream(d, cnitool, "add", env)
    assert add.returncode == 0, add.stderr + add.stdout
    result = json.loads(add.stdout)
    assert [i["name"] for i in result["interfaces"] if i.get("sandbox")] == ["eth0", "bond0", "bond1"]
    pod_ips = {
        a["ifname"]: [x["local"] for x in a["addr_info"] if x["family"] == "inet"]
        for a in json.loads(
            subprocess.run(
                ["ip", "-n", d.pod, "-j", "addr"], capture_output=True, text=True, check=True
            ).stdout
        )
    }
    assert pod_ips["bond0"] == [bond_addr(0)[0].split("/")[0]] and pod_ips["bond1"] == [
        bond_addr(1)[0].split("/")[0]
    ]
    check = upstream(d, cnitool, "check", env)
    assert check.returncode == 0, check.stderr + check.stdout
    delete = upstream(d, cnitool, "del", env)
    assert delete.returncode == 0, delete.stderr + delete.stdout
    assert d.host_has("bond0") and d.host_has("bond1")
