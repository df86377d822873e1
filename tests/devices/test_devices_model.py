"""The device plugin's device model on a simulated node: discovery, NUMA packing, health and its
recovery, Allocate's device nodes and env — no gRPC, no socket but netlink.

The node is real where it can be: veth "bonds" with real addresses in a node netns (tests/netns.py),
a sysfs tree from :mod:`rdma_cni.sim` (kept in step with the live addresses by the simulated node
daemon, a process of its own like the kernel), and ``/dev/infiniband`` made of real char devices
(``mknod``, the kernel's major/minor numbers). Addresses: 198.51.100.0/24 only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from netns import Node, sh
from simnode import sim_node

from rdma_cni.devices import allocation, inventory
from rdma_cni.devices.allocation import AllocationError, allocate, preferred
from rdma_cni.devices.config import PluginConfig, load_config
from rdma_cni.devices.health import Holder
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot
from rdma_cni.net.netns import entered, open_netns
from rdma_cni.sim import devnodes, tree
from rdma_cni.sim.fixture import materialise
from rdma_cni.sim.sync import barrier, wait_watched

pytestmark = pytest.mark.netns

NUMA8 = (0, 0, 0, 0, 1, 1, 1, 1)


def bond_ip(i: int) -> str:
    return f"198.51.100.{16 * i + 2}"


@dataclass
class Rig:
    """A node with ``count`` bonds, their RDMA devices in a sysfs tree and nodes under a dev root."""

    n: Node
    sys: str
    dev: str
    count: int
    cfg: PluginConfig
    watched: bool  # a simulated node daemon keeps the GID tables in step with the addresses

    @property
    def netns(self) -> str:
        return f"/run/netns/{self.n.name}"

    def scan(self, previous: Snapshot | None = None) -> Snapshot:
        if self.watched:
            barrier(self.netns, self.sys, "bond0")
        with open_netns(self.netns) as ns, entered(ns):
            return inventory.scan(self.cfg, previous)

    def allocate(
        self, snap: Snapshot, ids: Sequence[str], **switches: bool
    ) -> allocation.ContainerAllocation:
        with open_netns(self.netns) as ns, entered(ns):
            return allocate(snap, ids, replace(self.cfg, **switches))

    def health(self, device: str, previous: Snapshot | None = None) -> DeviceHealth:
        h = self.scan(previous).health_of(device)
        assert h is not None
        return h

    def node_exec(self, *args: str) -> None:
        self.n.ip(*args)

    def switch_exec(self, *args: str) -> None:
        sh("ip", "-n", self.n.switch, *args)

    @property
    def peer1(self) -> str:
        return f"p1-{self.n.tag[:6]}"  # bond1's peer in the switch (tests/netns.py names it so)


@pytest.fixture
def make_rig(node_ns: Node) -> Iterator[Callable[..., Rig]]:
    stack = contextlib.ExitStack()

    def make(count: int = 2, numa: Sequence[int | None] | None = None, watched: bool = False,
             mad: bool = True, rdma_cm: bool = True) -> Rig:
        sys_root, dev_root = os.path.join(node_ns.tmp, "sys"), os.path.join(node_ns.tmp, "dev")
        os.makedirs(dev_root)
        for i in range(count):
            node_ns.bond(f"bond{i}", f"{bond_ip(i)}/28", peer=f"198.51.100.{16 * i + 1}/28")
        numa = list(numa) if numa is not None else [None] * count
        if watched:
            spec = ",".join("none" if x is None else str(x) for x in numa)
            extra = ["--layout", "mlx5", "--numa", spec, "--dev-root", dev_root,
                     *(["--mad"] if mad else []), *(["--rdma-cm"] if rdma_cm else [])]
            names = [f"bond{i}" for i in range(count)]
            prefix = f"h2-{node_ns.tag}-pod-"
            stack.enter_context(sim_node(sys_root, names, node_ns.name, prefix, extra=extra))
        else:
            bonds = [tree.SimBond(f"bond{i}", f"mlx5_bond_{i}", numa_node=numa[i], mad=mad)
                     for i in range(count)]
            tree.build_tree(sys_root, bonds, gid_slots=16, rdma_cm=rdma_cm)
            devnodes.make_dev_nodes(sys_root, dev_root)
        cfg = PluginConfig(sysfs_root=sys_root, dev_root=dev_root, data_dir=node_ns.data_dir,
                           run_dir=node_ns.run_dir, cni_conf=os.path.join(node_ns.tmp, "absent.conf"))
        return Rig(node_ns, sys_root, dev_root, count, cfg, watched)

    with stack:
        yield make


def ids(n: int, *which: int) -> list[str]:
    return [f"mlx5_bond_{i}" for i in (which or range(n))]


# --- discovery ---------------------------------------------------------------------------------------


def test_discovery_gives_one_device_per_bond_with_numa_and_char_devices(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(8, NUMA8)
    snap = rig.scan()
    assert [b.id for b in snap.bonds] == ids(8)
    assert snap.bonds[5] == RdmaBond("mlx5_bond_5", "bond5", 1, 1, "uverbs5", ("umad5",), ("issm5",),
                                     "0000:1c:00.0", "pci0000:40")
    assert [b.numa for b in snap.bonds] == list(NUMA8)
    assert all(h.healthy for h in snap.health), snap.health


def test_discovery_honours_masters_of_the_cni_conf(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(4)
    conf = os.path.join(rig.n.tmp, "tke-rdma-macvlan.conf")
    with open(conf, "w") as f:
        json.dump(rig.n.config(masters=["bond3", "bond1"]), f)
    cfg = load_config({"sysfs_root": rig.sys, "dev_root": rig.dev, "cni_conf": conf}, None)
    assert (cfg.masters, cfg.data_dir, cfg.run_dir) == (("bond3", "bond1"), rig.n.data_dir, rig.n.run_dir)
    rig.cfg = cfg
    found = [(b.id, b.netdev) for b in rig.scan().bonds]
    assert found == [("mlx5_bond_1", "bond1"), ("mlx5_bond_3", "bond3")]


FIXTURES = "/work/shared/fixtures/sysfs-rxe-6.1"


@pytest.mark.skipif(not os.path.isdir(FIXTURES), reason="captured sysfs fixtures not present")
def test_discovery_reads_the_tree_captured_from_a_real_kernel(tmp_path: Path) -> None:
    """Soft-RoCE on bonds (Debian 12, 6.1): virtual devices, so no PCI parent and no NUMA node; the
    capture holds no infiniband_verbs class, so no uverbs either (such a device is never healthy)."""
    root = materialise(os.path.join(FIXTURES, "host", "sys"), str(tmp_path / "sys"))
    found = inventory.discover(PluginConfig(sysfs_root=root))
    assert found == (RdmaBond("mlx5_bond_0", "bond0", 1, None, None),
                     RdmaBond("mlx5_bond_1", "bond1", 1, None, None))
    masters = inventory.discover(PluginConfig(sysfs_root=root, masters=("bond1", "bond7")))
    assert [b.id for b in masters] == ["mlx5_bond_1"]


def test_numa_node_minus_one_or_absent_gives_no_topology(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(3, [-1, None, 1])
    assert [b.numa for b in rig.scan().bonds] == [None, None, 1]
    link = os.path.join(rig.sys, "class", "infiniband", "mlx5_bond_1", "device")
    assert not os.path.exists(link)  # absent: no PCI parent at all, as for Soft-RoCE


# --- GetPreferredAllocation --------------------------------------------------------------------------


def test_request_of_4_on_8_bonds_over_2_numa_nodes_gets_4_on_one_node(make_rig: Callable[..., Rig]) -> None:
    snap = make_rig(8, NUMA8).scan()
    assert preferred(snap, ids(8), [], 4) == ids(8, 0, 1, 2, 3)
    # Node 0 has only 3 left: all 4 come from node 1 rather than splitting.
    assert preferred(snap, ids(8, 1, 2, 3, 4, 5, 6, 7), [], 4) == ids(8, 4, 5, 6, 7)
    # 5 cannot fit one node: the fewest nodes (2), node 0 filled first.
    assert preferred(snap, ids(8), [], 5) == ids(8, 0, 1, 2, 3, 4)


def test_must_include_is_kept_and_its_numa_node_filled_first(make_rig: Callable[..., Rig]) -> None:
    snap = make_rig(8, NUMA8).scan()
    assert preferred(snap, ids(8), ids(8, 5), 4) == ids(8, 5, 4, 6, 7)
    # must_include across both nodes: no third node exists; the rest is filled from its nodes, lowest first.
    assert preferred(snap, ids(8), ids(8, 6, 1), 4) == ids(8, 6, 1, 0, 2)
    assert preferred(snap, ids(8), ids(8, 6, 1), 2) == ids(8, 6, 1)


def test_unhealthy_devices_are_preferred_last(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(8, NUMA8)
    tree.set_port_state(rig.sys, "mlx5_bond_0", 1, active=False)
    snap = rig.scan()
    assert preferred(snap, ids(8), [], 4) == ids(8, 4, 5, 6, 7)


def test_bond_numbers_sort_naturally() -> None:
    bonds = tuple(RdmaBond(f"mlx5_bond_{i}", f"bond{i}", 1, None, f"uverbs{i}") for i in (10, 2, 1))
    snap = Snapshot(bonds, tuple(DeviceHealth(b.id, True, "") for b in bonds))
    got = preferred(snap, ["mlx5_bond_10", "mlx5_bond_2", "mlx5_bond_1"], [], 2)
    assert got == ["mlx5_bond_1", "mlx5_bond_2"]


@pytest.mark.parametrize(
    ("available", "must", "size", "expected"),
    [
        (["mlx5_bond_0", "mlx5_bond_1"], [], -1, []),
        (["mlx5_bond_0", "mlx5_bond_1"], [], 9, ["mlx5_bond_0", "mlx5_bond_1"]),
        (["mlx5_bond_1", None, 3], [], 1, ["mlx5_bond_1"]),
        (["mlx5_bond_0", "mlx5_bond_0", "ghost"], ["ghost"], 2, ["ghost", "mlx5_bond_0"]),
        (["mlx5_bond_0"], [], "two", []),  # no count at all: kubelet fills the request itself
        (None, [], 2, []),
    ],
)
def test_preferred_never_raises_on_garbage(available: object, must: object, size: object,
                                           expected: list[str], caplog: pytest.LogCaptureFixture) -> None:
    bonds = tuple(RdmaBond(f"mlx5_bond_{i}", f"bond{i}", 1, 0, f"uverbs{i}") for i in range(2))
    snap = Snapshot(bonds, tuple(DeviceHealth(b.id, True, "") for b in bonds))
    assert preferred(snap, available, must, size) == expected  # type: ignore[arg-type]


# --- health ------------------------------------------------------------------------------------------


def _port_down(rig: Rig) -> Callable[[], None]:
    tree.set_port_state(rig.sys, "mlx5_bond_1", 1, active=False)
    return lambda: tree.set_port_state(rig.sys, "mlx5_bond_1", 1, active=True)


def _bond_down(rig: Rig) -> Callable[[], None]:
    rig.node_exec("link", "set", "bond1", "down")
    return lambda: rig.node_exec("link", "set", "bond1", "up")


def _no_carrier(rig: Rig) -> Callable[[], None]:
    rig.switch_exec("link", "set", rig.peer1, "down")
    return lambda: rig.switch_exec("link", "set", rig.peer1, "up")


def _bond_missing(rig: Rig) -> Callable[[], None]:
    rig.node_exec("link", "del", "bond1")  # its switch-side peer goes with it

    def back() -> None:
        rig.node_exec("link", "add", "bond1", "type", "veth", "peer", "name", rig.peer1,
                      "netns", rig.n.switch)
        rig.switch_exec("link", "set", rig.peer1, "up")
        rig.node_exec("addr", "add", f"{bond_ip(1)}/28", "dev", "bond1")
        rig.node_exec("link", "set", "bond1", "up")
    return back


def _uverbs_missing(rig: Rig) -> Callable[[], None]:
    assert devnodes.remove_dev_node(rig.dev, "uverbs1")
    return lambda: devnodes.make_dev_node(rig.dev, "uverbs1", 231, 193) and None


def _address_lost(rig: Rig) -> Callable[[], None]:
    rig.node_exec("addr", "del", f"{bond_ip(1)}/28", "dev", "bond1")
    return lambda: rig.node_exec("addr", "add", f"{bond_ip(1)}/28", "dev", "bond1")


def _device_gone(rig: Rig) -> Callable[[], None]:
    link = os.path.join(rig.sys, "class", "infiniband", "mlx5_bond_1")
    target = os.readlink(link)
    os.unlink(link)
    return lambda: os.symlink(target, link)


CAUSES = {
    "port-down": (_port_down, "RDMA port mlx5_bond_1/1 is DOWN, not ACTIVE"),
    "bond-down": (_bond_down, "bond bond1 is down"),
    "no-carrier": (_no_carrier, "bond bond1 has no carrier"),
    "bond-missing": (_bond_missing, "bond bond1 is missing"),
    "uverbs-missing": (_uverbs_missing, "/dev/infiniband/uverbs1 is missing"),
    "address-lost": (_address_lost, "bond bond1 has no IPv4 (nor global IPv6) address and no pod holds it"),
    "rdma-device-gone": (_device_gone, "RDMA device mlx5_bond_1 is gone from sysfs"),
}


@pytest.mark.parametrize("cause", list(CAUSES))
def test_each_health_cause_flips_the_device_unhealthy_and_back(
    make_rig: Callable[..., Rig], cause: str
) -> None:
    rig = make_rig(2)
    before = rig.scan()
    assert [h.healthy for h in before.health] == [True, True]
    make_cause, reason = CAUSES[cause]
    undo = make_cause(rig)
    sick = rig.scan(previous=before)
    assert [b.id for b in sick.bonds] == ids(2), "a vanished device stays listed, as unhealthy"
    h0, h1 = sick.health
    assert h0 == DeviceHealth("mlx5_bond_0", True, "")
    assert not h1.healthy and reason in h1.reason, h1.reason
    assert inventory.health_changes(before, sick) == {"mlx5_bond_1": h1}
    with pytest.raises(AllocationError) as err:
        rig.allocate(sick, ["mlx5_bond_1"])
    assert err.value.device_id == "mlx5_bond_1" and reason in str(err.value)
    undo()
    well = rig.scan(previous=sick)
    assert well.health == before.health, "the same function says Healthy once the cause is gone"


def test_a_bond_with_only_a_global_ipv6_address_is_healthy(make_rig: Callable[..., Rig]) -> None:
    """IPv6 on the bonds moves like IPv4 (issue 12): an IPv6-only RoCE network is a network; a
    link-local alone (every up link has one) is not."""
    rig = make_rig(1)
    rig.node_exec("addr", "del", f"{bond_ip(0)}/28", "dev", "bond0")
    h = rig.health("mlx5_bond_0")
    assert not h.healthy and "no IPv4 (nor global IPv6) address" in h.reason
    rig.node_exec("addr", "add", "2001:db8:1::2/64", "dev", "bond0", "nodad")
    assert rig.health("mlx5_bond_0") == DeviceHealth("mlx5_bond_0", True, "")
    env = rig.allocate(rig.scan(), ["mlx5_bond_0"]).envs
    assert "NCCL_IB_GID_INDEX" not in env  # no RoCE v2 IPv4 GID: NCCL picks by itself


def test_a_bond_lent_to_a_live_pod_is_healthy_and_a_dead_pods_is_not(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(2, watched=True)
    pod = rig.n.pod()
    wait_watched(rig.netns, pod.path)
    conf = rig.n.config(masters=["bond0", "bond1"], count=1, sysfsRoot=rig.sys,
                        rdma={"required": True, "gidTimeoutMs": 10000})
    res = rig.n.plugin("ADD", conf, pod, container_id="c1")
    assert res.code == 0, res.stderr
    assert rig.n.pins() == {"bond0": "c1"}
    lent = rig.scan()
    assert lent.health_of("mlx5_bond_0") == DeviceHealth("mlx5_bond_0", True, "")
    # The bond holds no address now: Allocate takes the index rdma-macvlan recorded before the move.
    env = rig.allocate(lent, ["mlx5_bond_0", "mlx5_bond_1"]).envs
    assert env["NCCL_IB_GID_INDEX"] == env["UCX_IB_GID_INDEX"] == "3"

    rig.n.delete_pod(pod)  # the pod died and the runtime never sent DEL: the address is lost
    dead = rig.health("mlx5_bond_0")
    assert not dead.healthy and "netns" in dead.reason and "cni-tool gc" in dead.reason, dead.reason
    rig.node_exec("addr", "add", "198.51.100.9/28", "dev", "bond0")  # re-addressed by the node (issue 12)
    assert rig.health("mlx5_bond_0").healthy
    rig.node_exec("addr", "del", "198.51.100.9/28", "dev", "bond0")
    res = rig.n.plugin("DEL", conf, None, container_id="c1")  # containerd's DEL after the netns went
    assert res.code == 0, res.stderr
    assert rig.health("mlx5_bond_0").healthy


def test_a_del_that_ends_between_the_dump_and_the_records_read_leaves_the_bond_healthy(
    make_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DEL gives the addresses back, then removes the record; a scan dumps the addresses, then
    reads the records. A DEL that ends between the two left the bond with neither in that look,
    and kubelet took it as Unhealthy for one scan (seen under churn: a pod rejected at admission).
    Here a real DEL runs exactly there: the scan must still say Healthy, and a bond whose address
    is really gone must still say why."""
    rig = make_rig(2, watched=True)
    pod = rig.n.pod()
    wait_watched(rig.netns, pod.path)
    conf = rig.n.config(masters=["bond0", "bond1"], count=1, sysfsRoot=rig.sys,
                        rdma={"required": True, "gidTimeoutMs": 10000})
    assert rig.n.plugin("ADD", conf, pod, container_id="c1").code == 0
    assert rig.n.pins() == {"bond0": "c1"}
    real_holders = inventory.holders
    dels: list[int] = []

    def del_then_read(data_dir: str) -> dict[str, tuple[Holder, ...]]:
        if not dels:  # the first look only: its dump has run, its records read has not
            res = rig.n.plugin("DEL", conf, pod, container_id="c1")
            dels.append(res.code)
            assert res.code == 0, res.stderr
        return real_holders(data_dir)

    monkeypatch.setattr(inventory, "holders", del_then_read)
    snap = rig.scan()
    assert dels == [0], "the DEL ran inside the scan"
    assert rig.n.pins() == {}
    assert snap.health_of("mlx5_bond_0") == DeviceHealth("mlx5_bond_0", True, "")

    rig.node_exec("addr", "del", f"{bond_ip(1)}/28", "dev", "bond1")  # really lost: every look says so
    lost = rig.health("mlx5_bond_1")
    assert not lost.healthy and "no pod holds it" in lost.reason, lost.reason


# --- Allocate -----------------------------------------------------------------------------------------


def test_allocate_gives_each_bonds_nodes_rdma_cm_once_and_the_env(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(4, watched=True)
    snap = rig.scan()
    alloc = rig.allocate(snap, ["mlx5_bond_3", "mlx5_bond_0"])
    got = [(d.container_path, d.host_path, d.permissions) for d in alloc.devices]
    names = ["uverbs0", "umad0", "issm0", "uverbs3", "umad3", "issm3", "rdma_cm"]
    assert got == [(f"/dev/infiniband/{n}", os.path.join(rig.dev, "infiniband", n), "rw") for n in names]
    for d in alloc.devices:  # what kubelet hands the runtime exists and is the kernel's char device
        st = os.stat(d.host_path)
        assert stat.S_ISCHR(st.st_mode)
    assert os.major(os.stat(os.path.join(rig.dev, "infiniband", "uverbs3")).st_rdev) == 231
    assert os.minor(os.stat(os.path.join(rig.dev, "infiniband", "uverbs3")).st_rdev) == 195
    assert dict(alloc.envs) == {
        "NCCL_IB_HCA": "=mlx5_bond_0,mlx5_bond_3",
        "UCX_NET_DEVICES": "mlx5_bond_0:1,mlx5_bond_3:1",
        "NCCL_IB_GID_INDEX": "3",
        "UCX_IB_GID_INDEX": "3",
    }
    off = rig.allocate(snap, ["mlx5_bond_0"], env_nccl_ib_hca=False, env_ucx_ib_gid_index=False)
    assert dict(off.envs) == {"UCX_NET_DEVICES": "mlx5_bond_0:1", "NCCL_IB_GID_INDEX": "3"}
    none = rig.allocate(snap, ["mlx5_bond_0"], env_nccl_ib_hca=False, env_ucx_ib_gid_index=False,
                        env_ucx_net_devices=False, env_nccl_ib_gid_index=False)
    assert dict(none.envs) == {}


def test_allocate_of_an_unknown_id_names_it(make_rig: Callable[..., Rig]) -> None:
    rig = make_rig(2)
    snap = rig.scan()
    for bad in (["mlx5_bond_7"], ["mlx5_bond_0", "0"], []):
        with pytest.raises(AllocationError) as err:
            rig.allocate(snap, bad)
        name = bad[-1] if bad else ""
        assert err.value.device_id == name
        assert "no such device" in err.value.why or not bad


def test_allocate_leaves_out_host_nodes_that_do_not_exist(make_rig: Callable[..., Rig],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    rig = make_rig(1, mad=False, rdma_cm=False)
    with caplog.at_level(logging.WARNING, logger="rdma_cni.deviceplugin"):
        alloc = rig.allocate(rig.scan(), ["mlx5_bond_0"])
    assert [d.container_path for d in alloc.devices] == ["/dev/infiniband/uverbs0"]
    assert "rdma_cm is missing" in caplog.text


def test_gid_index_env_is_read_at_allocate_time_and_unset_when_bonds_disagree(
    make_rig: Callable[..., Rig], caplog: pytest.LogCaptureFixture
) -> None:
    rig = make_rig(2, watched=True)
    snap = rig.scan()
    assert rig.allocate(snap, ids(2)).envs["NCCL_IB_GID_INDEX"] == "3"
    # bond1 gets its address back after an IPv6 one took slots 2/3: its IPv4 GID now sits at 5.
    rig.node_exec("addr", "del", f"{bond_ip(1)}/28", "dev", "bond1")
    rig.node_exec("addr", "add", "2001:db8::11/64", "dev", "bond1", "nodad")
    rig.node_exec("addr", "add", f"{bond_ip(1)}/28", "dev", "bond1")
    barrier(rig.netns, rig.sys, "bond1")
    assert rig.allocate(snap, ["mlx5_bond_1"]).envs["UCX_IB_GID_INDEX"] == "5"  # same snapshot: read now
    with caplog.at_level(logging.WARNING, logger="rdma_cni.deviceplugin"):
        env = rig.allocate(snap, ids(2)).envs
    assert "NCCL_IB_GID_INDEX" not in env and "UCX_IB_GID_INDEX" not in env
    assert "mlx5_bond_0=3, mlx5_bond_1=5" in caplog.text
    assert env["NCCL_IB_HCA"] == "=mlx5_bond_0,mlx5_bond_1"


def test_records_are_read_again_only_when_their_directory_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A torn record is logged once, not on every rescan; a new record is seen at the next one."""
    from rdma_cni.attachments import AttachmentRecord, BondRecord
    from rdma_cni.state import NodeState

    st = NodeState(str(tmp_path))
    st.ensure()
    torn = os.path.join(st.dir, "dead@net1.json")
    with open(torn, "w") as f:
        f.write('{"schema": 1, "container_id"')

    def age() -> None:  # as if the last write was a while ago (the cache trusts a settled dir only)
        past = os.stat(st.dir).st_mtime - 5
        os.utime(st.dir, (past, past))

    age()
    with caplog.at_level(logging.ERROR, logger="rdma_cni.state"):
        assert inventory.holders(str(tmp_path)) == {}
        assert inventory.holders(str(tmp_path)) == {}
    assert caplog.text.count("dead@net1.json") == 1
    rec = AttachmentRecord("c1", "net1", "/run/netns/h2-gone", 0,
                           bonds=[BondRecord("bond0", 7, "bond0", "mvtmp0")])
    st.put(rec)
    assert inventory.holders(str(tmp_path)) == {"bond0": (Holder("c1", "/run/netns/h2-gone", False),)}
    age()
    os.unlink(st.path("c1", "net1"))
    assert inventory.holders(str(tmp_path)) == {}
