"""The seed's pod shape (8 bonds, one attachment) and its link group: the pod interfaces of an
attachment are made in a link group of their own, and DEL / rollback delete them with one request.

Real namespaces and the real plugin executable (in-process and through the agent). Another
plugin's interface in the pod netns (a veth, like a cluster network's ``eth0``) must survive every
batch delete, also when it sits in a link group of its own; a group number already taken in the pod
netns is skipped; a link someone puts into our group after ADD makes DEL go one by one.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
import zlib

import pytest
from netns import Node, Pod, sh

from rdma_cni.plugins.macvlan.tx import DEL_STEPS, LINK_GROUP_FIRST, LINK_GROUP_SPAN

pytestmark = [pytest.mark.netns, pytest.mark.both_modes]

BONDS = 8
BATCHED = "deleted with one request (link group"
ONE_BY_ONE = "deleted one by one"


def eight_bonds(n: Node) -> dict[str, object]:
    """bond0..bond7, 198.51.100.(16i+2)/28 each, a gateway route and a policy rule per bond."""
    for i in range(BONDS):
        base = 16 * i
        ip, peer = f"198.51.100.{base + 2}", f"198.51.100.{base + 1}"
        n.bond(f"bond{i}", f"{ip}/28", peer=f"{peer}/28")
        n.ip("route", "add", "default", "via", peer, "table", str(10 + i))
        n.ip("rule", "add", "from", ip, "lookup", str(10 + i), "pref", str(1000 + i))
    return n.config(masters=[f"bond{i}" for i in range(BONDS)], count=BONDS)


def cluster_eth0(n: Node, pod: Pod, group: int = 0, name: str = "eth0") -> int:
    """Another plugin's interface in the pod (a veth to the switch, with an address); its index."""
    peer = f"c{uuid.uuid4().hex[:10]}"
    sh("ip", "-n", pod.name, "link", "add", name, "group", str(group), "type", "veth", "peer", "name", peer,
       "netns", n.switch)
    sh("ip", "-n", pod.name, "addr", "add", "203.0.113.50/24", "dev", name)
    sh("ip", "-n", pod.name, "link", "set", name, "up")
    return int(n.pod_json(pod, "link", "show", name)[0]["ifindex"])


def pod_links(n: Node, pod: Pod) -> dict[str, tuple[int, int]]:
    """name -> (index, group) of every link in the pod netns."""
    out = {}
    for link in n.pod_json(pod, "link"):
        group = link.get("group", "default")
        out[link["ifname"]] = (link["ifindex"], 0 if group == "default" else int(group))
    return out


def recorded_group(n: Node) -> int:
    [name] = [f for f in n.state_files() if f.endswith(".json")]
    with open(os.path.join(n.data_dir, "attachments", name)) as f:
        return int(json.load(f)["link_group"])


def log_text(n: Node) -> str:
    path = os.path.join(n.tmp, "plugin.log")
    return open(path).read() if os.path.exists(path) else ""


def first_group(container_id: str, ifname: str = "net1") -> int:
    """Where the plugin starts looking for a free group for this attachment."""
    return LINK_GROUP_FIRST + zlib.crc32(f"{container_id}@{ifname}".encode()) % LINK_GROUP_SPAN


@pytest.mark.parametrize("other_group", [0, 7])
def test_eight_bonds_round_trip_in_one_link_group_and_another_plugins_interface_survives(
    node_ns: Node, other_group: int
) -> None:
    n = node_ns
    conf = eight_bonds(n)
    before = n.snapshot()
    pod = n.pod()
    eth0 = cluster_eth0(n, pod, other_group)
    res = n.plugin("ADD", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    group = recorded_group(n)
    assert group not in (0, other_group)
    have = pod_links(n, pod)
    assert {name: g for name, (_, g) in have.items()} == {
        "lo": 0, "eth0": other_group, **{f"bond{i}": group for i in range(BONDS)}}
    assert n.ping(pod, "198.51.100.113", "bond7")
    res = n.plugin("DEL", conf, pod)
    assert res.code == 0, res.stdout + res.stderr
    assert pod_links(n, pod) == {"lo": (1, 0), "eth0": (eth0, other_group)}
    [info] = n.pod_json(pod, "addr", "show", "eth0")
    assert [(a["local"], a["prefixlen"]) for a in info["addr_info"]] == [("203.0.113.50", 24)]
    assert n.snapshot() == before
    assert n.state_files() == []
    text = log_text(n)
    assert BATCHED in text and ONE_BY_ONE not in text, text[-2000:]


def test_a_group_number_taken_in_the_pod_netns_is_skipped(node_ns: Node) -> None:
    n = node_ns
    conf = eight_bonds(n)
    before = n.snapshot()
    pod = n.pod()
    start = first_group("c1")
    # The cluster network's interface happens to sit in exactly the group this attachment would
    # start from, and a second foreign link in the next one.
    eth0 = cluster_eth0(n, pod, start)
    eth1 = cluster_eth0(n, pod, start + 1, name="eth1")
    assert n.plugin("ADD", conf, pod).code == 0
    assert recorded_group(n) == start + 2
    assert {pod_links(n, pod)[f"bond{i}"][1] for i in range(BONDS)} == {start + 2}
    assert n.plugin("DEL", conf, pod).code == 0
    assert pod_links(n, pod) == {"lo": (1, 0), "eth0": (eth0, start), "eth1": (eth1, start + 1)}
    assert n.snapshot() == before
    assert BATCHED in log_text(n)


def test_two_attachments_in_one_pod_get_two_groups_and_del_takes_only_its_own(node_ns: Node) -> None:
    n = node_ns
    eight_bonds(n)
    before = n.snapshot()
    pod = n.pod()
    net1 = n.config(masters=[f"bond{i}" for i in range(4)], count=4)
    net2 = n.config(masters=[f"bond{i}" for i in range(4, BONDS)], count=4, name="rdma-net2")
    assert n.plugin("ADD", net1, pod, ifname="net1").code == 0
    assert n.plugin("ADD", net2, pod, ifname="net2").code == 0
    have = pod_links(n, pod)
    groups = {have[f"bond{i}"][1] for i in range(4)}, {have[f"bond{i}"][1] for i in range(4, BONDS)}
    assert len(groups[0]) == len(groups[1]) == 1 and groups[0] != groups[1], groups
    assert n.plugin("DEL", net1, pod, ifname="net1").code == 0
    assert sorted(pod_links(n, pod)) == sorted(["lo", "bond4", "bond5", "bond6", "bond7"])
    assert {k: v for k, v in pod_links(n, pod).items() if k != "lo"} == {
        k: v for k, v in have.items() if k in ("bond4", "bond5", "bond6", "bond7")}
    assert n.plugin("DEL", net2, pod, ifname="net2").code == 0
    assert sorted(pod_links(n, pod)) == ["lo"]
    assert n.snapshot() == before


def test_a_link_put_into_our_group_later_survives_and_ours_go_one_by_one(node_ns: Node) -> None:
    n = node_ns
    conf = eight_bonds(n)
    before = n.snapshot()
    pod = n.pod()
    eth0 = cluster_eth0(n, pod)
    assert n.plugin("ADD", conf, pod).code == 0
    group = recorded_group(n)
    sh("ip", "-n", pod.name, "link", "set", "eth0", "group", str(group))  # someone else's doing
    assert n.plugin("DEL", conf, pod).code == 0
    assert pod_links(n, pod) == {"lo": (1, 0), "eth0": (eth0, group)}
    assert n.snapshot() == before
    assert f"{ONE_BY_ONE}: link group {group} also holds eth0" in log_text(n)


@pytest.mark.parametrize("failpoint", ["link-created#8", "announced#8", "committed"])
def test_a_failed_eight_bond_add_is_rolled_back_by_group(node_ns: Node, failpoint: str) -> None:
    n = node_ns
    conf = eight_bonds(n)
    before = n.snapshot()
    pod = n.pod()
    eth0 = cluster_eth0(n, pod, 7)
    res = n.plugin("ADD", conf, pod, extra={"RDMA_CNI_FAILPOINT": f"{failpoint}:error"})
    assert res.code == 1 and "injected failure" in res.out["msg"], res.stdout + res.stderr
    assert pod_links(n, pod) == {"lo": (1, 0), "eth0": (eth0, 7)}
    assert n.snapshot() == before
    assert n.state_files() == []
    text = log_text(n)
    assert BATCHED in text and ONE_BY_ONE not in text, text[-2000:]


@pytest.mark.in_process_only
def test_kill_at_every_del_step_of_an_eight_bond_attachment_then_del_again(node_ns: Node) -> None:
    n = node_ns
    conf = eight_bonds(n)
    before = n.snapshot()
    points = [*DEL_STEPS, *(f"del-host-restored#{k}" for k in range(2, BONDS + 1))]
    for i, point in enumerate(points):
        pod = n.pod()
        eth0 = cluster_eth0(n, pod, 7)
        cid = f"k{i}"
        assert n.plugin("ADD", conf, pod, container_id=cid).code == 0
        res = n.plugin("DEL", conf, pod, container_id=cid, extra={"RDMA_CNI_FAILPOINT": point})
        assert res.code == -signal.SIGKILL, (point, res.code, res.stderr[-500:])
        again = n.plugin("DEL", conf, pod if i % 2 else "", container_id=cid)
        assert again.code == 0, (point, again.stdout + again.stderr)
        assert pod_links(n, pod) == {"lo": (1, 0), "eth0": (eth0, 7)}, point
        assert n.snapshot() == before, point
        assert n.state_files() == [], point
        n.delete_pod(pod)
