"""The RDMA steps of an ADD/DEL, composed from the rdma_cni.rdma API the way rdma-macvlan uses it,
on a simulated node driven by real address moves (the daemon runs as its own process, like the
kernel, so nothing here calls it synchronously)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from simnode import sim_node

from rdma_cni.cni.errors import GID_MISMATCH, CniError
from rdma_cni.rdma import gid, mode, records, sysfs
from rdma_cni.sim.sync import barrier, wait_watched

pytestmark = pytest.mark.netns
BOND_IPS = ("198.51.100.2", "198.51.100.18")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(node netns name, sysfs root, pod prefix) with bond0/bond1 (veth) holding .2/28 and .18/28."""
    tag = f"{os.getpid()}{uuid.uuid4().hex[:4]}"
    name, prefix, root = f"h3-fnode-{tag}", f"h3-fpod-{tag}-", str(tmp_path / "sys")
    ip("netns", "add", name)
    try:
        for i, addr in enumerate(BOND_IPS):
            ip("-n", name, "link", "add", f"bond{i}", "type", "veth", "peer", "name", f"sw{i}")
            ip("-n", name, "link", "set", f"sw{i}", "up")
            ip("-n", name, "link", "set", f"bond{i}", "up")
            ip("-n", name, "addr", "add", f"{addr}/28", "dev", f"bond{i}")
        with sim_node(root, ["bond0", "bond1"], name, prefix, gid_slots=64):
            yield name, root, prefix
    finally:
        for p in os.listdir("/run/netns"):
            if p.startswith(prefix):
                subprocess.run(["ip", "netns", "del", p], check=False)
        subprocess.run(["ip", "netns", "del", name], check=False)


def add_pod(node: str, root: str, pod: str, bond: str, addr: str, add_first: bool = False) -> sysfs.GidEntry:
    """The RDMA half of ADD for one bond: host index first, the move in the kernel-safe order
    (unless ``add_first``), then wait for the pod's GID and check it sits at the host's index."""
    wait_watched(f"/run/netns/{node}", f"/run/netns/{pod}")  # the runtime made the netns well before
    mode.require_mode(root, "shared")
    port = sysfs.port_for_netdev(root, bond)
    assert port is not None
    host_index = gid.wait_for_gid(root, port.device, port.port, addr, 5000, ndev=bond).index
    ip("-n", node, "link", "add", "link", bond, "name", "mvtmp", "netns", pod, "type", "macvlan")
    ip("-n", pod, "link", "set", "mvtmp", "name", bond)  # podIfName: master
    ip("-n", pod, "link", "set", bond, "addrgenmode", "none")
    leave = ("-n", node, "addr", "del", f"{addr}/28", "dev", bond)
    arrive = ("-n", pod, "addr", "add", f"{addr}/28", "dev", bond)
    if add_first:
        ip(*arrive)
        ip(*leave)
    else:
        ip(*leave)
        # On a real kernel the GID is gone when `ip` returns; the simulated node lags a poll. Either
        # way, waiting for it before the pod address appears keeps the order the index depends on.
        assert gid.wait_for_gid_gone(root, port.device, port.port, addr, 5000)
        ip(*arrive)
    barrier(f"/run/netns/{node}", root, bond)  # the simulated node has applied every move above
    ip("-n", pod, "link", "set", bond, "up")
    entry = gid.wait_for_gid(root, port.device, port.port, addr, 5000)
    gid.check_gid_index(entry, host_index, "host", root)
    return entry


def test_two_pods_two_bonds_same_index_as_host_records_and_del(
    node: tuple[str, str, str], tmp_path: Path
) -> None:
    name, root, prefix = node
    run = str(tmp_path / "run")
    host = records.update_host_record(run, root)
    assert {p["device"]: p["gidIndex"] for p in host["ports"]} == {"mlx5_bond_0": 1, "mlx5_bond_1": 1}
    for i, addr in enumerate(BOND_IPS):
        pod = f"{prefix}{i}"
        ip("netns", "add", pod)
        entry = add_pod(name, root, pod, f"bond{i}", addr)
        assert (entry.device, entry.index, entry.ndev) == (f"mlx5_bond_{i}", 1, f"bond{i}")
        port = sysfs.port_for_netdev(root, f"bond{i}")
        assert port is not None
        records.write_pod_record(run, f"ctr{i}", "net1", entry, port.uverbs)
    rec = json.loads(Path(run, "gid", "ctr1", "net1.json").read_text())
    assert (rec["device"], rec["gidIndex"], rec["uverbs"]) == ("mlx5_bond_1", 1, "/dev/infiniband/uverbs1")
    # The IPs are in pods (named bond0/bond1 there): the host holds none, its index is kept.
    host = records.update_host_record(run, root, {"bond0": [], "bond1": []})
    assert [(p["gidIndex"], p["present"]) for p in host["ports"]] == [(1, False), (1, False)]

    # DEL of pod 0: pod interface first, then the address back on the bond -> same host index.
    ip("-n", f"{prefix}0", "link", "del", "bond0")
    ip("-n", name, "addr", "add", f"{BOND_IPS[0]}/28", "dev", "bond0")
    assert gid.wait_for_gid(root, "mlx5_bond_0", 1, BOND_IPS[0], 5000, ndev="bond0").index == 1
    records.remove_pod_records(run, "ctr0")
    assert records.list_pod_records(run) == {"ctr1": ["net1"]}
    # DEL of pod 1 after its netns was deleted: the macvlan and IP went with it; host gets index 1.
    ip("netns", "del", f"{prefix}1")
    assert gid.wait_for_gid_gone(root, "mlx5_bond_1", 1, BOND_IPS[1], 5000)
    ip("-n", name, "addr", "add", f"{BOND_IPS[1]}/28", "dev", "bond1")
    assert gid.wait_for_gid(root, "mlx5_bond_1", 1, BOND_IPS[1], 5000, ndev="bond1").index == 1
    host = records.update_host_record(run, root, {"bond0": [BOND_IPS[0]], "bond1": [BOND_IPS[1]]})
    assert [(p["gidIndex"], p["present"]) for p in host["ports"]] == [(1, True), (1, True)]


def test_adding_to_the_pod_before_leaving_the_host_is_caught_as_102(node: tuple[str, str, str]) -> None:
    name, root, prefix = node
    pod = f"{prefix}x"
    ip("netns", "add", pod)
    with pytest.raises(CniError) as e:
        add_pod(name, root, pod, "bond0", BOND_IPS[0], add_first=True)
    assert e.value.code == GID_MISMATCH
    assert "index 2" in e.value.msg and "host index is 1" in e.value.msg
