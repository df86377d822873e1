"""rdma-ipvlan's GID step on a simulated RDMA node (:mod:`rdma_cni.sim.node` keeps a sysfs tree's GID
tables in step with the real addresses of the veth bonds and of the pods' children, as the kernel's
RoCE GID management does for upper devices): each pod address gets a RoCE v2 GID of its own in the
one shared table, at an index the plugin records (``mode: shared``); the host's index stays."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from ipvlan_support import Shared
from netns import Node, Pod
from simnode import sim_node

from rdma_cni.cli.tool_gids import gids
from rdma_cni.rdma import sysfs
from rdma_cni.sim.sync import wait_watched

pytestmark = [pytest.mark.netns, pytest.mark.both_modes]


@pytest.fixture
def rdma_node(node_ns: Node) -> Iterator[tuple[Shared, str]]:
    n = node_ns
    s = Shared(n)
    s.bonds(3)
    root = os.path.join(n.tmp, "sys")
    with sim_node(root, ["bond0", "bond1"], n.name, f"h2-{n.tag}-pod-"):
        yield s, root


def watched_pod(n: Node) -> Pod:
    pod = n.pod()
    wait_watched(f"/run/netns/{n.name}", pod.path)
    return pod


def record(s: Shared, cid: str, ifname: str) -> dict[str, object]:
    with open(os.path.join(s.n.run_dir, "gid", cid, f"{ifname}.json")) as f:
        data: dict[str, object] = json.load(f)
    return data


def pod_gid_rows(root: str, pod: Pod) -> dict[tuple[str, str], int]:
    """What a user in the pod reads for NCCL_IB_GID_INDEX: ``cni-tool gids --netns`` (RoCE v2 rows
    of this pod's own addresses only: the shared table also lists the host's and the other pods')."""
    out = CliRunner().invoke(gids, ["--sysfs-root", root, "--netns", pod.path, "--json"])
    assert out.exit_code == 0, out.output
    mine = set(pod_ipv4(pod))
    return {
        (r["device"], r["ipv4"]): r["index"]
        for r in json.loads(out.output)
        if r["type"] == sysfs.ROCE_V2 and r["ipv4"] in mine
    }


def pod_ipv4(pod: Pod) -> list[str]:
    links = json.loads(
        subprocess.run(
            ["ip", "-n", pod.name, "-j", "-4", "addr"], capture_output=True, text=True, check=True
        ).stdout
    )
    return [a["local"] for link in links for a in link.get("addr_info", [])]


def test_each_pod_address_gets_its_own_gid_recorded_as_shared_and_the_host_keeps_its_index(
    rdma_node: tuple[Shared, str],
) -> None:
    s, root = rdma_node
    n = s.n
    host = {
        0: sysfs.roce_v2_index(root, "mlx5_bond_0", 1, "198.51.100.2"),
        1: sysfs.roce_v2_index(root, "mlx5_bond_1", 1, "198.51.100.18"),
    }
    assert None not in host.values()
    conf = s.config(sysfsRoot=root, rdma={"required": True, "gidTimeoutMs": 3000})  # masters: RDMA netdevs
    pods = [watched_pod(n), watched_pod(n)]
    seen: dict[int, set[int]] = {0: set(), 1: set()}
    for i, pod in enumerate(pods):
        res = s.plugin("ADD", conf, pod, container_id=f"c{i}")
        assert res.code == 0, res.stdout + res.stderr[-2000:]
        assert [x["name"] for x in res.out["interfaces"]] == ["bond0", "bond1"]
        for b in range(2):
            rec = record(s, f"c{i}", f"bond{b}")
            ip = f"198.51.100.{16 * b + 3 + i}"
            assert rec["mode"] == "shared" and rec["ipv4"] == ip and rec["device"] == f"mlx5_bond_{b}"
            assert rec["gidIndex"] == sysfs.roce_v2_index(root, f"mlx5_bond_{b}", 1, ip)
            seen[b].add(int(rec["gidIndex"]))  # type: ignore[call-overload]
        assert pod_gid_rows(root, pod) == {
            (f"mlx5_bond_{b}", f"198.51.100.{16 * b + 3 + i}"): record(s, f"c{i}", f"bond{b}")["gidIndex"]
            for b in range(2)
        }
    for b in range(2):
        assert len(seen[b]) == 2 and host[b] not in seen[b]  # each pod its own, none the host's
        assert sysfs.roce_v2_index(root, f"mlx5_bond_{b}", 1, f"198.51.100.{16 * b + 2}") == host[b]
    for i, pod in enumerate(pods):
        assert s.plugin("DEL", conf, pod, container_id=f"c{i}").code == 0
        assert not os.path.exists(os.path.join(n.run_dir, "gid", f"c{i}"))


def test_required_rdma_and_a_bond_without_a_device_is_error_104_and_changes_nothing(
    rdma_node: tuple[Shared, str],
) -> None:
    s, root = rdma_node
    before = s.n.snapshot()
    pod = watched_pod(s.n)
    conf = s.config(masters=["bond0", "bond2"], sysfsRoot=root, rdma={"required": True})
    res = s.plugin("ADD", conf, pod, container_id="c1")
    assert res.code == 1 and res.out["code"] == 104 and "bond2" in res.out["msg"], res.stdout
    assert s.state_files() == [] and s.pod_links(pod) == ["lo"] and s.n.snapshot() == before


def test_required_rdma_and_no_gid_within_the_bound_fails_clearly_and_rolls_back(
    rdma_node: tuple[Shared, str],
) -> None:
    s, root = rdma_node
    pod = Pod(f"h2-{s.n.tag}-unwatched-{uuid.uuid4().hex[:6]}")  # outside the simulator's prefix: no GID
    subprocess.run(["ip", "netns", "add", pod.name], check=True)
    s.n.pods.append(pod)  # removed with the node
    conf = s.config(masters=["bond0"], sysfsRoot=root, rdma={"required": True, "gidTimeoutMs": 200})
    res = s.plugin("ADD", conf, pod, container_id="c1")
    assert res.code == 1 and res.out["code"] == 103, res.stdout
    assert "198.51.100.3" in res.out["msg"] and "200 ms" in res.out["msg"]
    assert s.state_files() == [] and s.pod_links(pod) == ["lo"] and s.held() == {}
    assert not os.path.exists(os.path.join(s.n.run_dir, "gid", "c1"))
