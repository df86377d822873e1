"""The simulated RDMA node against real links in real namespaces.

Expected behaviour comes from the real kernel (``shared/lab/vm/FINDINGS.md``): the ordering variants
V1/V3/V6/V7 must give the pod IP index 1/2/2/1, as Soft-RoCE did. Veth ends in a node netns stand in
for bonds. Addresses: 198.51.100.0/24 only; every netns carries the prefix ``h3-`` and is deleted.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rdma_cni.rdma import gid, sysfs
from rdma_cni.sim.daemon import daemon
from rdma_cni.sim.model import MLX5_TYPES, table_snapshot
from rdma_cni.sim.node import SimNode
from rdma_cni.sim.tree import SimBond

pytestmark = pytest.mark.netns

HOST_IP = "198.51.100.10"
HOST_IP1 = "198.51.100.11"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@dataclass
class Lab:
    tag: str
    node: str
    root: str
    pods: list[str] = field(default_factory=list)

    @property
    def node_path(self) -> str:
        return f"/run/netns/{self.node}"

    @property
    def pod_prefix(self) -> str:
        return f"h3-pod-{self.tag}-"

    def pod(self, n: int) -> str:
        name = f"{self.pod_prefix}{n}"
        ip("netns", "add", name)
        self.pods.append(name)
        return name

    def macvlan(self, pod: str, bond: str = "bond0", name: str = "net1") -> None:
        """Created directly in the pod netns with a temporary name, then renamed (as the plugin does)."""
        ip(
            "-n",
            self.node,
            "link",
            "add",
            "link",
            bond,
            "name",
            "mvtmp",
            "netns",
            pod,
            "type",
            "macvlan",
            "mode",
            "bridge",
        )
        ip("-n", pod, "link", "set", "mvtmp", "name", name)

    def sim(self, bonds: int = 1, **kw: object) -> SimNode:
        devs = [SimBond(f"bond{i}", f"mlx5_bond_{i}") for i in range(bonds)]
        return SimNode(self.root, devs, self.node_path, "/run/netns", self.pod_prefix, gid_slots=16, **kw)  # type: ignore[arg-type]

    def index(self, addr: str, dev: str = "mlx5_bond_0", ndev: str | None = None) -> int | None:
        return sysfs.roce_v2_index(self.root, dev, 1, addr, ndev)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    tag = f"{os.getpid()}{uuid.uuid4().hex[:4]}"
    node = f"h3-node-{tag}"
    lab = Lab(tag, node, str(tmp_path / "sys"))
    ip("netns", "add", node)
    try:
        for i, addr in ((0, HOST_IP), (1, HOST_IP1)):
            ip("-n", node, "link", "add", f"bond{i}", "type", "veth", "peer", "name", f"peer{i}")
            ip("-n", node, "link", "set", f"peer{i}", "up")
            ip("-n", node, "link", "set", f"bond{i}", "up")
            ip("-n", node, "addr", "add", f"{addr}/24", "dev", f"bond{i}")
        yield lab
    finally:
        for p in lab.pods:
            subprocess.run(["ip", "netns", "del", p], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", node], check=False, capture_output=True)


def test_tree_starts_like_the_captured_host_state(lab: Lab) -> None:
    """Slot 0: the bond's default GID (= its link-local), slot 1: the bond's IPv4, ndev bond0."""
    with lab.sim(bonds=2) as node:
        node.process()
        snap = table_snapshot(lab.root)
    assert list(snap) == ["mlx5_bond_0/1", "mlx5_bond_1/1"]
    rows = snap["mlx5_bond_0/1"]
    assert [(r["index"], r["type"], r["ndev"]) for r in rows] == [
        (0, "RoCE v2", "bond0"),
        (1, "RoCE v2", "bond0"),
    ]
    assert rows[0]["gid"].startswith("fe80::") and rows[1]["gid"] == f"::ffff:{HOST_IP}"
    assert lab.index(HOST_IP1, "mlx5_bond_1") == 1
    port = sysfs.port_for_netdev(lab.root, "bond1")
    assert port is not None and (port.device, port.uverbs) == ("mlx5_bond_1", "uverbs1")


def test_v1_del_host_then_add_pod_then_up_keeps_index_1(lab: Lab) -> None:
    with lab.sim() as node:
        pod = lab.pod(1)
        lab.macvlan(pod)
        node.process()
        ip("-n", lab.node, "addr", "del", f"{HOST_IP}/24", "dev", "bond0")
        node.process()
        assert lab.index(HOST_IP) is None
        ip("-n", pod, "addr", "add", f"{HOST_IP}/24", "dev", "net1")  # link still down
        node.process()
        assert lab.index(HOST_IP, ndev="net1") == 1
        ip("-n", pod, "link", "set", "net1", "up")
        node.process()
        entries = sysfs.read_gids(lab.root, "mlx5_bond_0", 1)
    assert lab.index(HOST_IP) == 1
    assert [(e.index, e.ndev) for e in entries] == [(0, "bond0"), (1, "net1"), (2, "net1")]
    assert entries[2].gid.startswith("fe80::")  # the pod's link-local took the next slot


def test_v3_add_pod_before_del_host_gives_index_2(lab: Lab) -> None:
    with lab.sim() as node:
        pod = lab.pod(1)
        lab.macvlan(pod)
        node.process()
        ip("-n", pod, "addr", "add", f"{HOST_IP}/24", "dev", "net1")
        node.process()
        # the GID is duplicated: [1] ndev=bond0, [2] ndev=net1
        assert (lab.index(HOST_IP, ndev="bond0"), lab.index(HOST_IP, ndev="net1")) == (1, 2)
        ip("-n", lab.node, "addr", "del", f"{HOST_IP}/24", "dev", "bond0")
        ip("-n", pod, "link", "set", "net1", "up")
        node.process()  # both events queued: applied in kernel order, the link-local takes the freed 1
    assert lab.index(HOST_IP) == 2
    assert [e.gid.startswith("fe80::") for e in sysfs.read_gids(lab.root, "mlx5_bond_0", 1)] == [
        True,
        True,
        False,
    ]


@pytest.mark.parametrize(("addrgenmode", "expected"), [("eui64", 2), ("none", 1)])
def test_v6_up_before_add_lets_the_link_local_take_the_slot_unless_addrgenmode_none(
    lab: Lab, addrgenmode: str, expected: int
) -> None:
    with lab.sim() as node:
        pod = lab.pod(1)
        node.process()  # the daemon finds a new pod netns within one poll (20 ms)
        lab.macvlan(pod)
        ip("-n", pod, "link", "set", "net1", "addrgenmode", addrgenmode)
        ip("-n", lab.node, "addr", "del", f"{HOST_IP}/24", "dev", "bond0")
        ip("-n", pod, "link", "set", "net1", "up")
        ip("-n", pod, "addr", "add", f"{HOST_IP}/24", "dev", "net1")
        node.process()
    assert lab.index(HOST_IP) == expected


def test_two_pods_on_two_bonds_both_get_index_1_and_netns_delete_frees_the_slot(lab: Lab) -> None:
    with lab.sim(bonds=2) as node:
        pods = [lab.pod(0), lab.pod(1)]
        node.process()
        for i, (pod, addr) in enumerate(zip(pods, (HOST_IP, HOST_IP1), strict=True)):
            lab.macvlan(pod, f"bond{i}", f"bond{i}")  # podIfName=master: same name inside the pod
            ip("-n", pod, "link", "set", f"bond{i}", "addrgenmode", "none")
            ip("-n", lab.node, "addr", "del", f"{addr}/24", "dev", f"bond{i}")
            ip("-n", pod, "addr", "add", f"{addr}/24", "dev", f"bond{i}")
            ip("-n", pod, "link", "set", f"bond{i}", "up")
        node.process()
        assert (lab.index(HOST_IP), lab.index(HOST_IP1, "mlx5_bond_1")) == (1, 1)
        ip("netns", "del", pods[0])
        lab.pods.remove(pods[0])
        node.process()
        assert lab.index(HOST_IP) is None  # the macvlan and its IP went with the netns
        ip("-n", lab.node, "addr", "add", f"{HOST_IP}/24", "dev", "bond0")
        node.process()
        assert lab.index(HOST_IP, ndev="bond0") == 1  # DEL after the netns was gone: back at 1
        assert lab.index(HOST_IP1, "mlx5_bond_1", ndev="bond1") == 1  # the other pod is untouched


def test_rename_in_the_pod_updates_ndev(lab: Lab) -> None:
    with lab.sim() as node:
        pod = lab.pod(1)
        lab.macvlan(pod)
        ip("-n", lab.node, "addr", "del", f"{HOST_IP}/24", "dev", "bond0")
        ip("-n", pod, "addr", "add", f"{HOST_IP}/24", "dev", "net1")
        node.process()
        ip("-n", pod, "link", "set", "net1", "name", "rdma0")
        node.process()
    entry = sysfs.find_gid(lab.root, "mlx5_bond_0", 1, HOST_IP)
    assert entry is not None and (entry.index, entry.ndev) == (1, "rdma0")


def test_deleting_the_primary_takes_its_secondary_along(lab: Lab) -> None:
    with lab.sim() as node:
        ip("-n", lab.node, "addr", "add", "198.51.100.20/24", "dev", "bond0")
        node.process()
        assert lab.index("198.51.100.20") == 2
        ip("-n", lab.node, "addr", "del", f"{HOST_IP}/24", "dev", "bond0")  # promote_secondaries=0
        node.process()
    assert (lab.index(HOST_IP), lab.index("198.51.100.20")) == (None, None)


def test_a_netns_found_late_is_read_whole(lab: Lab) -> None:
    pod = lab.pod(1)
    lab.macvlan(pod)
    ip("-n", lab.node, "addr", "del", f"{HOST_IP}/24", "dev", "bond0")
    ip("-n", pod, "addr", "add", f"{HOST_IP}/24", "dev", "net1")
    with lab.sim() as node:
        node.process()
    assert lab.index(HOST_IP, ndev="net1") == 1


def test_mlx5_layout_puts_the_ipv4_roce_v2_gid_at_3(lab: Lab) -> None:
    with lab.sim(gid_types=MLX5_TYPES) as node:
        node.process()
    rows = table_snapshot(lab.root)["mlx5_bond_0/1"]
    assert [(r["index"], r["type"]) for r in rows] == [
        (0, "RoCE v1"),
        (1, "RoCE v2"),
        (2, "RoCE v1"),
        (3, "RoCE v2"),
    ]
    assert lab.index(HOST_IP) == 3


def test_daemon_process_follows_a_move_and_stops_by_pid(lab: Lab) -> None:
    pidfile = os.path.join(os.path.dirname(lab.root), "sim.pid")
    args = ["--sysfs-root", lab.root, "--bonds", "bond0:mlx5_bond_0", "--node-netns", lab.node_path]
    args += [
        "--pods-dir",
        "/run/netns",
        "--pods-prefix",
        lab.pod_prefix,
        "--gid-slots",
        "16",
        "--pidfile",
        pidfile,
    ]
    pod = lab.pod(1)
    with daemon(args) as pid:
        assert Path(pidfile).read_text().strip() == str(pid)
        assert gid.wait_for_gid(lab.root, "mlx5_bond_0", 1, HOST_IP, 5000).index == 1
        lab.macvlan(pod)
        ip("-n", pod, "link", "set", "net1", "addrgenmode", "none")
        ip("-n", lab.node, "addr", "del", f"{HOST_IP}/24", "dev", "bond0")
        ip("-n", pod, "addr", "add", f"{HOST_IP}/24", "dev", "net1")
        ip("-n", pod, "link", "set", "net1", "up")
        entry = gid.wait_for_gid(lab.root, "mlx5_bond_0", 1, HOST_IP, 5000, ndev="net1")
        assert entry.index == 1
    assert not os.path.exists(f"/proc/{pid}") or Path(f"/proc/{pid}/status").read_text().find("zombie") >= 0
    assert not os.path.exists(pidfile)


def test_the_watcher_never_keeps_a_deleted_pod_netns_alive(lab: Lab) -> None:
    """A held fd or socket would keep the netns (and its macvlan, and its GID) alive after
    ``ip netns del``, unlike on a real node. A veth pair across node and pod shows whether the pod
    netns really died: its node end vanishes with it."""
    with lab.sim() as node:
        pod = lab.pod(1)
        node.process()
        lab.macvlan(pod)
        ip("-n", lab.node, "link", "add", "probe", "type", "veth", "peer", "name", "probe", "netns", pod)
        ip("-n", pod, "addr", "add", "198.51.100.50/24", "dev", "net1")
        node.process()
        assert lab.index("198.51.100.50") == 2
        ip("netns", "del", pod)
        lab.pods.remove(pod)
        node.process()
        assert lab.index("198.51.100.50") is None
        for _ in range(200):
            node.process(0.01)
            links = subprocess.run(
                ["ip", "-n", lab.node, "-o", "link"], capture_output=True, text=True
            ).stdout
            if "probe" not in links:
                break
        assert "probe" not in links


def test_netns_teardown_is_seen_in_the_event_stream(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    """RTM_DELNSID marks the pod's death in kernel order, without waiting for the directory scan."""
    with lab.sim() as node:
        pod = lab.pod(1)
        node.process()
        lab.macvlan(pod)
        ip("-n", pod, "addr", "add", "198.51.100.60/24", "dev", "net1")
        node.process()
        assert lab.index("198.51.100.60") == 2
        monkeypatch.setattr(node, "scan_pods", lambda: None)
        ip("netns", "del", pod)
        lab.pods.remove(pod)
        for _ in range(200):
            node.process(0.01)
            if lab.index("198.51.100.60") is None:
                break
        assert lab.index("198.51.100.60") is None
        assert node.pods == {}


def test_daemon_mlx5_layout_gives_the_seed_index_3(lab: Lab) -> None:
    args = ["--sysfs-root", lab.root, "--bonds", "bond0", "--node-netns", lab.node_path, "--layout", "mlx5"]
    with daemon([*args, "--gid-slots", "16"]):
        entry = gid.wait_for_gid(lab.root, "mlx5_bond_0", 1, HOST_IP, 5000)
    assert entry.index == 3 and entry.type == "RoCE v2"
    assert sysfs.find_gid(lab.root, "mlx5_bond_0", 1, HOST_IP, "RoCE v1") is not None


def test_background_thread_follows_moves_and_barrier_waits_for_it(lab: Lab) -> None:
    from rdma_cni.sim.daemon import running
    from rdma_cni.sim.sync import barrier, wait_watched

    with running(lab.sim()) as node:
        pod = lab.pod(1)
        wait_watched(lab.node_path, f"/run/netns/{pod}")
        lab.macvlan(pod)
        ip("-n", lab.node, "addr", "del", f"{HOST_IP}/24", "dev", "bond0")
        ip("-n", pod, "addr", "add", f"{HOST_IP}/24", "dev", "net1")
        barrier(lab.node_path, lab.root)
        assert lab.index(HOST_IP, ndev="net1") == 1
        assert Path(lab.root, "class/net/bond0/ifalias").read_text().startswith("sim-barrier-")
    assert node.errors == 0


@pytest.mark.parametrize("event", ["carrier-up", "new-veth"])
def test_background_thread_keeps_the_tables_at_link_events(lab: Lab, event: str) -> None:
    """Regression: the thread once used a netlink client made in the caller's thread; pyroute2 then
    opened a fresh socket in the thread's own netns (the host's), found no bonds there, and emptied
    every GID table at the first link event. The tables must look exactly as they did before."""
    from rdma_cni.sim.daemon import running
    from rdma_cni.sim.sync import barrier

    with running(lab.sim(bonds=2)) as node:
        barrier(lab.node_path, lab.root)
        before = table_snapshot(lab.root)
        if event == "carrier-up":
            ip("-n", lab.node, "link", "set", "peer0", "down")
            barrier(lab.node_path, lab.root)
            ip("-n", lab.node, "link", "set", "peer0", "up")
        else:
            ip("-n", lab.node, "link", "add", "h11x0", "type", "veth", "peer", "name", "h11x1")
        barrier(lab.node_path, lab.root)
        after = table_snapshot(lab.root)
    assert [len(rows) for rows in before.values()] == [2, 2]
    assert after == before
    assert node.errors == 0


def test_a_node_opened_in_one_thread_refuses_to_process_in_another(lab: Lab) -> None:
    """pyroute2's sync client is per thread: used from another thread it silently talks to that
    thread's netns. The node says so instead of reading the wrong namespace."""
    import threading

    seen: list[BaseException] = []

    def other() -> None:
        for call in (node.process, lambda: node.serve(threading.Event())):
            try:
                call()
            except BaseException as e:  # noqa: BLE001 - inspected below
                seen.append(e)

    with lab.sim() as node:
        node.process()
        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        assert not t.is_alive()  # serve() did not loop on a failure that repeats every round
        ip("-n", lab.node, "link", "set", "peer0", "down")
        node.process()
        assert lab.index(HOST_IP) == 1
    assert [type(e) for e in seen] == [RuntimeError, RuntimeError]
    assert all("thread that did not open it" in str(e) for e in seen)
    assert node.errors == 0


# --- a pod netns read whole while events that happened before the read are still queued ----------
# rdma-macvlan's ADD (plugins/macvlan/tx.py add_bond) in its order: macvlan created in the pod netns
# under a temp name, renamed with addrgen off (link down), the bond's address deleted, then added to
# the pod interface. On a kernel the pod's GID takes the slot the bond's just freed: 2/3 on mlx5.
MOVED_V2 = 3  # the RoCE v2 index of the bond's IPv4 on the mlx5 layout, before and after the move


def plug(lab: Lab, pod: str) -> None:
    """The ADD's first two steps: ``link-created`` and ``link-configured``."""
    lab.macvlan(pod)
    ip("-n", pod, "link", "set", "net1", "addrgenmode", "none")


def move(lab: Lab, pod: str) -> None:
    """The ADD's ``addresses-removed`` and ``addresses-added``."""
    ip("-n", lab.node, "addr", "del", f"{HOST_IP}/24", "dev", "bond0")
    ip("-n", pod, "addr", "add", f"{HOST_IP}/24", "dev", "net1")


def v2_rows(lab: Lab) -> list[tuple[int, str, str]]:
    rows = table_snapshot(lab.root)["mlx5_bond_0/1"]
    return [(r["index"], r["gid"], r["ndev"]) for r in rows if r["type"] == "RoCE v2"]


def test_a_pod_netns_read_whole_before_the_bonds_deladdr_is_drained_gets_the_freed_slot(lab: Lab) -> None:
    """The chaos runs' bond IP at 4/5 (once per ~200 pods): process() had drained its queue, the ADD
    moved the address, then process()'s scan_pods() found the pod netns and read it whole while the
    bond's RTM_DELADDR was still queued, so the pod's GID went past the bond's still-held 2/3."""
    with lab.sim(gid_types=MLX5_TYPES) as node:
        node.process()
        assert lab.index(HOST_IP) == MOVED_V2
        pod = lab.pod(1)  # the runtime made it; the ADD runs before the node's next scan
        plug(lab, pod)
        move(lab, pod)
        node.scan_pods()  # the scan at the end of a process() whose drain ended just before the move
        assert lab.index(HOST_IP, ndev="net1") == MOVED_V2
        node.process()  # the queued DELADDR of the bond: already applied, changes nothing
        assert lab.index(HOST_IP, ndev="net1") == MOVED_V2
        ip("-n", pod, "link", "set", "net1", "up")
        node.process()
    assert [(i, n) for i, _, n in v2_rows(lab)] == [(1, "bond0"), (MOVED_V2, "net1")]


def test_a_move_between_the_scans_drain_and_its_read_still_gives_the_freed_slot(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same move made after the scan applied the queue (and gave the netns its nsid) but before
    it read the netns: the bond's DELADDR and the pod's NEWADDR are queued, the read shows the
    address in the pod. The bond's entry whose address is gone is removed before the read is added."""
    with lab.sim(gid_types=MLX5_TYPES) as node:
        node.process()
        pod = lab.pod(1)
        plug(lab, pod)
        links = node._links
        moved: list[int | None] = []

        def links_after_the_move(nsid: int | None) -> object:
            if nsid is not None and not moved:
                move(lab, pod)
                moved.append(nsid)
            return links(nsid)

        monkeypatch.setattr(node, "_links", links_after_the_move)
        node.scan_pods()
        assert moved and lab.index(HOST_IP, ndev="net1") == MOVED_V2
        node.process()  # the queued DELADDR (a no-op now) and the pod's NEWADDR (already there)
    assert [(i, n) for i, _, n in v2_rows(lab)] == [(1, "bond0"), (MOVED_V2, "net1")]


def test_an_event_from_an_unknown_nsid_mid_drain_does_not_read_the_netns_before_the_rest(lab: Lab) -> None:
    """The pod netns already has an nsid the node has not registered (given by someone else, or a
    netns the node forgot): its first event used to trigger a scan in the middle of the drain, which
    read it whole while the bond's DELADDR queued behind that event was not applied yet."""
    with lab.sim(gid_types=MLX5_TYPES) as node:
        node.process()
        pod = lab.pod(1)
        ip("-n", lab.node, "netns", "set", pod, "77")
        plug(lab, pod)  # RTM_NEWLINK from nsid 77, queued before the bond's DELADDR
        move(lab, pod)
        node.process()
        assert 77 in node.pods
    assert [(i, n) for i, _, n in v2_rows(lab)] == [(1, "bond0"), (MOVED_V2, "net1")]


def test_a_pod_netns_gone_from_the_scan_is_forgotten_before_a_new_one_is_read(lab: Lab) -> None:
    """One scan sees a pod netns's path gone and a new pod netns: the old one's GIDs leave first (its
    deletion was seen before the new one was read), so the new pod's address takes the freed slot.
    The test holds the old netns open so that its RTM_DELNSID does not come first by itself."""
    with lab.sim(gid_types=MLX5_TYPES) as node:
        old = lab.pod(1)
        node.process()
        lab.macvlan(old)
        ip("-n", old, "addr", "add", "198.51.100.70/24", "dev", "net1")
        node.process()
        assert lab.index("198.51.100.70") == 5
        fd = os.open(f"/run/netns/{old}", os.O_RDONLY)
        try:
            ip("netns", "del", old)
            lab.pods.remove(old)
            new = lab.pod(2)
            lab.macvlan(new)
            ip("-n", new, "addr", "add", "198.51.100.71/24", "dev", "net1")
            node.process()
            assert (lab.index("198.51.100.70"), lab.index("198.51.100.71")) == (None, 5)
        finally:
            os.close(fd)


def test_a_pod_netns_that_cannot_be_opened_for_one_scan_keeps_its_gids(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its path is still there (the same netns): a failed open (EMFILE, ENOMEM) is no deletion. Once
    forgotten, the pod's GIDs were dropped and the netns read whole again later, at a new slot."""
    from rdma_cni.net.netns import NetnsUnavailable, open_netns

    with lab.sim(gid_types=MLX5_TYPES) as node:
        node.process()
        pod = lab.pod(1)
        node.process()
        plug(lab, pod)
        move(lab, pod)
        node.process()
        before = v2_rows(lab)
        assert (lab.index(HOST_IP, ndev="net1"), len(node.pods)) == (MOVED_V2, 1)
        def busy(path: str) -> object:
            if path == f"/run/netns/{pod}":
                raise NetnsUnavailable(path, "cannot be opened: Too many open files", gone=True)
            return open_netns(path)

        monkeypatch.setattr("rdma_cni.sim.node.open_netns", busy)
        node.scan_pods()
        monkeypatch.setattr("rdma_cni.sim.node.open_netns", open_netns)
        assert len(node.pods) == 1 and v2_rows(lab) == before
        node.process()
    assert v2_rows(lab) == before
