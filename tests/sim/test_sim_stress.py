"""The simulated node under load: 4 bonds moved into 4 pods at once, given back (half of them after
the pod netns was deleted), many cycles. The daemon must survive namespaces vanishing mid-read and
end every cycle with the host's table exactly as it started."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from simnode import sim_node

from rdma_cni.rdma import gid
from rdma_cni.sim.model import table_snapshot
from rdma_cni.sim.sync import barrier, wait_watched

pytestmark = [pytest.mark.netns, pytest.mark.slow]
BONDS = 4
CYCLES = 12


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def addr_of(i: int) -> str:
    return f"198.51.100.{16 * i + 2}"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[str, str, str, int]]:
    tag = f"{os.getpid()}{uuid.uuid4().hex[:4]}"
    name, prefix, root = f"h3-snode-{tag}", f"h3-spod-{tag}-", str(tmp_path / "sys")
    ip("netns", "add", name)
    try:
        for i in range(BONDS):
            ip("-n", name, "link", "add", f"bond{i}", "type", "veth", "peer", "name", f"sw{i}")
            ip("-n", name, "link", "set", f"sw{i}", "up")
            ip("-n", name, "link", "set", f"bond{i}", "up")
            ip("-n", name, "addr", "add", f"{addr_of(i)}/28", "dev", f"bond{i}")
        bonds = ",".join(f"bond{i}" for i in range(BONDS))
        with sim_node(root, bonds, name, prefix, gid_slots=32) as pid:
            yield name, root, prefix, pid
    finally:
        for p in os.listdir("/run/netns"):
            if p.startswith(prefix):
                subprocess.run(["ip", "netns", "del", p], check=False)
        subprocess.run(["ip", "netns", "del", name], check=False)


def move_in(node: str, root: str, pod: str, i: int) -> int:
    bond, addr = f"bond{i}", addr_of(i)
    ip("netns", "add", pod)
    wait_watched(f"/run/netns/{node}", f"/run/netns/{pod}")
    ip("-n", node, "link", "add", "link", bond, "name", f"mv{i}", "netns", pod, "type", "macvlan")
    ip("-n", pod, "link", "set", f"mv{i}", "name", bond)
    ip("-n", pod, "link", "set", bond, "addrgenmode", "none")
    ip("-n", node, "addr", "del", f"{addr}/28", "dev", bond)
    assert gid.wait_for_gid_gone(root, f"mlx5_bond_{i}", 1, addr, 5000)
    ip("-n", pod, "addr", "add", f"{addr}/28", "dev", bond)
    ip("-n", pod, "link", "set", bond, "up")
    return gid.wait_for_gid(root, f"mlx5_bond_{i}", 1, addr, 5000).index


def give_back(node: str, root: str, pod: str, i: int, netns_first: bool) -> int:
    bond, addr = f"bond{i}", addr_of(i)
    if netns_first:
        ip("netns", "del", pod)
    else:
        ip("-n", pod, "link", "del", bond)
    assert gid.wait_for_gid_gone(root, f"mlx5_bond_{i}", 1, addr, 5000)
    ip("-n", node, "addr", "add", f"{addr}/28", "dev", bond)
    index = gid.wait_for_gid(root, f"mlx5_bond_{i}", 1, addr, 5000, ndev=bond).index
    if not netns_first:
        ip("netns", "del", pod)
    return index


def test_concurrent_moves_and_returns_leave_the_tables_as_they_started(
    node: tuple[str, str, str, int],
) -> None:
    name, root, prefix, pid = node
    barrier(f"/run/netns/{name}", root)
    before = table_snapshot(root)
    with ThreadPoolExecutor(BONDS) as pool:
        for cycle in range(CYCLES):
            pods = [f"{prefix}{cycle}-{i}" for i in range(BONDS)]
            moved = pool.map(lambda i, pods=pods: move_in(name, root, pods[i], i), range(BONDS))
            assert list(moved) == [1] * BONDS
            back = pool.map(
                lambda i, p=pods, c=cycle: give_back(name, root, p[i], i, (c + i) % 2 == 0), range(BONDS)
            )
            assert list(back) == [1] * BONDS
    barrier(f"/run/netns/{name}", root)
    assert table_snapshot(root) == before
    assert os.path.exists(f"/proc/{pid}")  # the daemon survived
