"""Section ``kernel``: addresses moved with plain ``ip`` commands (no project code), the real GID table
dumped after every step, and the GID-table model (``rdma_cni/sim``) compared against that trace."""

from __future__ import annotations

import tempfile
import traceback
from typing import Any

from .host import addresses, gid_table, ip, v2_entry, v2_index, wait_for
from .report import BONDS, SYS, R


class ModelWatch:
    """The project's simulated RDMA node (``rdma_cni.sim``: the GID-table model the netns tests run
    on) watching the very same address moves as the real kernel, compared slot by slot.

    It listens to the guest's real rtnetlink events for bond2 and its macvlans in pods ``k*`` and
    writes its own sysfs tree; after every step both trees are read with the same reader.
    """

    DEVICE = "mlx5_bond_2"

    def __init__(self) -> None:
        self.node: Any = None
        self.root = ""
        self.why: str | None = None

    def open(self) -> None:
        try:
            from rdma_cni.sim.model import table_snapshot  # noqa: F401 - present with the node
            from rdma_cni.sim.node import SimNode
            from rdma_cni.sim.tree import SimBond
        except ImportError as e:
            self.why = f"rdma_cni.sim has no SimNode/table_snapshot yet ({e})"
            return
        self.root = tempfile.mkdtemp(prefix="vm-e2e-sim-")
        try:
            self.node = SimNode(
                self.root, [SimBond("bond2", self.DEVICE)], pods_dir="/run/netns", pods_prefix="k"
            ).open()
        except Exception as e:  # noqa: BLE001 - the model's failure is a finding, the scenario goes on
            R.check(
                "model: simulated node opens on the real kernel",
                None,
                f"{type(e).__name__}: {e}",
                traceback.format_exc(),
            )
            self.node = None
            self.why = "the simulated node did not open"
            return
        self.compare("initial state")

    def sync(self) -> None:
        if self.node is not None:
            self.node.process()

    def compare(self, label: str) -> None:
        if self.node is None:
            return
        from rdma_cni.sim.model import table_snapshot

        section, R.section = R.section, "model"
        try:
            self.node.process()
            real = table_snapshot(SYS, [self.DEVICE])
            modelled = table_snapshot(self.root, [self.DEVICE])
            R.check(f"model matches the real kernel: {label}", real, modelled)
        except Exception as e:  # noqa: BLE001 - a crash in the model is recorded as a failed check
            R.check(
                f"model matches the real kernel: {label}",
                None,
                f"{type(e).__name__}: {e}",
                traceback.format_exc(),
            )
        finally:
            R.section = section

    def close(self) -> None:
        if self.node is not None:
            self.node.close()
        if self.why:
            section, R.section = R.section, "model"
            R.skip("model", self.why)
            R.section = section


MODEL = ModelWatch()


class Trace:
    """Address moves done with plain ``ip`` and the GID table after each: the model's test data."""

    def __init__(self, name: str, device: str) -> None:
        self.name = name
        self.device = device
        self.steps: list[dict[str, Any]] = []

    def step(self, label: str, lines: list[str], netns: str | None = None) -> list[dict[str, Any]]:
        ip(lines, netns)
        table = gid_table(self.device)
        self.steps.append({"label": label, "netns": netns, "commands": lines, "table": table})
        MODEL.compare(f"{self.name}: {label}")
        return table

    def netns(self, lines: list[str]) -> None:
        """Namespaces come and go between steps; the model notices them on its next look."""
        ip(lines)
        MODEL.sync()

    def record(self) -> None:
        R.fact(f"trace {self.name}", {"device": self.device, "steps": self.steps})


def kernel_section() -> None:
    """What the plugin's design rests on, seen on the real kernel with bond2/mlx5_bond_2."""
    dev, (a30, a31) = "mlx5_bond_2", BONDS["bond2"][2]
    host = {a: v2_index(dev, a) for a in (a30, a31)}

    MODEL.open()
    try:
        moves(dev, a30, a31, host)
    finally:
        MODEL.close()


def moves(dev: str, a30: str, a31: str, host: dict[str, int | None]) -> None:
    # ADD in the design's order: macvlan made in the pod, no IPv6 link-local, host addresses
    # deleted (secondary first: deleting a primary deletes its secondaries), pod addresses added,
    # then link up.
    t = Trace("move-and-back", dev)
    t.netns(["netns add k1"])
    t.step("macvlan created in pod k1", ["link add link bond2 name h4tmp netns k1 type macvlan mode bridge"])
    t.step(
        "renamed, addrgenmode none", ["link set h4tmp name bond2", "link set bond2 addrgenmode none"], "k1"
    )
    t.step("host addresses deleted", [f"addr del {a31} dev bond2", f"addr del {a30} dev bond2"])
    t.step("pod addresses added", [f"addr add {a30} dev bond2", f"addr add {a31} dev bond2"], "k1")
    t.step("pod link up", ["link set bond2 up"], "k1")
    for a in (a30, a31):
        entry = v2_entry(dev, a)
        R.check(f"moved {a}: pod GID index equals the host's", host[a], entry and entry["index"])
        R.check(f"moved {a}: GID ndev is the pod-side name", "bond2", entry and entry["ndev"])
    t.step("pod link deleted", ["link del bond2"], "k1")
    t.step("host addresses back", [f"addr add {a30} dev bond2", f"addr add {a31} dev bond2"])
    for a in (a30, a31):
        R.check(f"DEL (pod link first): {a} back at the host's index", host[a], v2_index(dev, a))
    t.record()

    # Link up before the address arrives: the pod's IPv6 link-local takes the freed slot (V6).
    v = Trace("link-up-before-address", dev)
    v.netns(["netns add k2"])
    v.step("macvlan created in pod k2", ["link add link bond2 name h4tmp netns k2 type macvlan mode bridge"])
    v.step("host addresses deleted", [f"addr del {a31} dev bond2", f"addr del {a30} dev bond2"])
    v.step("pod link up (IPv6 link-local on)", ["link set h4tmp up"], "k2")
    wait_for(lambda: len(gid_table(dev)) > 1, 2.0)  # the link-local GID follows DAD-less address setup
    v.step("pod addresses added", [f"addr add {a30} dev h4tmp", f"addr add {a31} dev h4tmp"], "k2")
    R.fact(f"link-up-before-address: pod index of {a30} (host had {host[a30]})", v2_index(dev, a30))
    v.step("pod link deleted", ["link del h4tmp"], "k2")
    v.step("host addresses back", [f"addr add {a30} dev bond2", f"addr add {a31} dev bond2"])
    v.record()

    # The runtime deletes the netns before DEL: the macvlan and its addresses vanish with it.
    g = Trace("netns-deleted-first", dev)
    g.netns(["netns add k3"])
    g.step("macvlan created in pod k3", ["link add link bond2 name h4tmp netns k3 type macvlan mode bridge"])
    g.step("host addresses deleted", [f"addr del {a31} dev bond2", f"addr del {a30} dev bond2"])
    g.step(
        "pod addresses added, up",
        [
            "link set h4tmp addrgenmode none",
            f"addr add {a30} dev h4tmp",
            f"addr add {a31} dev h4tmp",
            "link set h4tmp up",
        ],
        "k3",
    )
    ip(["netns del k3", "netns del k2", "netns del k1"])
    gone = wait_for(lambda: v2_index(dev, a30) is None, 5.0)
    R.fact("netns deleted: seconds until its GIDs left the table (asynchronous)", gone)
    MODEL.compare("netns-deleted-first: netns deleted, its GIDs gone")
    g.step("host addresses back", [f"addr add {a30} dev bond2", f"addr add {a31} dev bond2"])
    for a in (a30, a31):
        R.check(f"netns deleted first: {a} back at the host's index", host[a], v2_index(dev, a))
    g.record()
    R.check("bond2 addresses as before", [a30, a31 + " secondary"], addresses("bond2"))
