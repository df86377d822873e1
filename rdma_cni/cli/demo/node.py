"""Step 1 of the demo: the node. :class:`Node` holds one run's node: its namespaces and bonds, the
simulated RDMA devices, and how to look at it; :class:`.installed.Demo` adds what is installed and
configured there.

What it builds, on any Linux machine with netns/veth/macvlan (no RDMA hardware needed):

* ``<tag>-node``: the node. ``bond0..bond3`` are veth ends (this kernel may have no bonding) holding
  ``198.51.100.{2,18,34,50}/28``, one /28 per NIC as on a TKE GPU node; their peers sit in
  ``<tag>-sw`` (the "switch") holding ``.1, .17, .33, .49``.
* an RDMA sysfs tree (``mlx5_bond_0..3`` over ``bond0..3``, RoCE v1+v2 GID tables like mlx5) kept in
  sync with the live addresses by H3's simulated node (:mod:`rdma_cni.sim.node`), so the GID indices
  are those the kernel would give;
* the CNI configs of conf/vpc-cni (``--mode global-router``: conf/global-router), pointed at the demo's
  directories, plus the cluster network played by a reference plugin (``tke-route-eni``: ``ptp``;
  ``tke-bridge``: ``bridge``).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rdma_cni.cli.demo.shell import PREFIX, REPO, DemoFailed, run
from rdma_cni.rdma import sysfs

ANNOTATION = "tke.cloud.tencent.com/networks"
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
REFERENCE_PLUGINS = ("/usr/lib/cni", "/opt/cni/bin")
POD = {"namespace": "default", "name": "rdma-demo-0"}
# TKE's two cluster network modes: the default network each names, and the reference plugin that
# plays it here (VPC-CNI routes each pod over its own link; GlobalRouter bridges pods on the node).
MODES = {"vpc-cni": ("tke-route-eni", "ptp"), "global-router": ("tke-bridge", "bridge")}
# The RDMA modes (TKE's rdma-agent has both): exclusive (:mod:`.exclusive`) and shared (:mod:`.shared`).
RDMA_MODES = ("exclusive", "shared")


def bond_addr(i: int) -> tuple[str, str]:
    """(bond address, switch peer address) of bond i: one /28 per NIC."""
    return f"198.51.100.{16 * i + 2}/28", f"198.51.100.{16 * i + 1}/28"


def bond_ip(i: int) -> str:
    return bond_addr(i)[0].split("/")[0]

class Node:
    """One demo run's node: its namespaces, bonds and files, the simulated RDMA devices over the bonds,
    and how to look at them. The steps (the modules beside this one) act on it."""

    def __init__(self, bonds: int, pod_bonds: int, bundle: str, mode: str = "vpc-cni") -> None:
        self.tag = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.node, self.switch, self.pod = f"{self.tag}-node", f"{self.tag}-sw", f"{self.tag}-pod0"
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
        self.sysfs = str(self.tmp / "sys")
        self.bonds = [f"bond{i}" for i in range(bonds)]
        self.pod_bonds = pod_bonds
        self.bundle = bundle
        self.namespaces: list[str] = []
        self.mode = mode
        self.default_network, self.default_plugin = MODES[mode]
        # GlobalRouter's node bridge: it stays after the pod is gone, as tke-bridge's does.
        self.cluster_bridge = f"cni-{self.tag[-9:]}" if self.default_plugin == "bridge" else ""
        self.pods_prefix = f"{self.tag}-pod"  # pod netns names the simulated RDMA node follows
        self.bin_dir = self.tmp / "bin"
        self.conf_dir = self.tmp / "net.d"
        self.dev_root = str(self.tmp / "dev")
        self.kubelet_root = self.tmp / "kubelet"
        self.picked: list[int] = list(range(pod_bonds))  # the bonds kubelet gives the pod (admission)
        self.pod_resources: Any = None  # the kubelet's PodResources server, while it runs

    def numa(self, i: int) -> int:
        """NUMA node of NIC i: the first half on node 0, the rest on node 1 (as on a GPU node)."""
        return 0 if i < (len(self.bonds) + 1) // 2 else 1

    def pod_bond_list(self) -> list[tuple[int, str]]:
        return [(i, self.bonds[i]) for i in self.picked]

    # ---- the node ------------------------------------------------------------------------------
    def netns(self, name: str) -> None:
        # Listed before it exists: a Ctrl-C landing between `ip netns add` and the append (or
        # inside `ip`, which gets the same SIGINT) must still leave it to cleanup's `ip netns del`.
        self.namespaces.append(name)
        run("ip", "netns", "add", name)
        run("ip", "-n", name, "link", "set", "lo", "up")
        run(
            "ip",
            "netns",
            "exec",
            name,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.dad_transmits=0",
            "net.ipv6.conf.default.dad_transmits=0",
        )

    def build_node(self) -> None:
        self.netns(self.node)
        self.netns(self.switch)
        for i, bond in enumerate(self.bonds):
            mine, peer = bond_addr(i)
            run(
                "ip",
                "-n",
                self.node,
                "link",
                "add",
                bond,
                "type",
                "veth",
                "peer",
                "name",
                f"sw{i}",
                "netns",
                self.switch,
            )
            run("ip", "-n", self.switch, "addr", "add", peer, "dev", f"sw{i}")
            run("ip", "-n", self.switch, "link", "set", f"sw{i}", "up")
            run("ip", "-n", self.node, "addr", "add", mine, "dev", bond)
            run("ip", "-n", self.node, "link", "set", bond, "up")

    @contextmanager
    def rdma(self) -> Iterator[None]:
        """The simulated RDMA devices: H3's SimNode with mlx5's GID types (RoCE v1 + v2, so the IPv4
        RoCE v2 GID sits at index 3 as in the seed), half the NICs on each of 2 NUMA nodes, their
        uverbs/umad/issm/rdma_cm char devices made under the demo's dev root; run as its own process
        like the kernel would be."""
        args = [
            self.sysfs,
            ",".join(f"{b}:mlx5_bond_{i}" for i, b in enumerate(self.bonds)),
            f"/run/netns/{self.node}",
            self.pods_prefix,
            ",".join(str(self.numa(i)) for i in range(len(self.bonds))),
            self.dev_root,
        ]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.Popen(
            [sys.executable, "-c", SIM_NODE, *args], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 30)
            if not ready or proc.stdout.readline().strip() != "ready":
                raise DemoFailed(f"the simulated RDMA node did not start (exit code {proc.poll()})")
            yield
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
            proc.wait(30)

    def host_snapshot(self) -> dict[str, Any]:
        """The node's addresses, routes and rules (the cluster network's own bridge left out)."""

        def j(*args: str) -> list[dict[str, Any]]:
            rows = json.loads(run("ip", "-n", self.node, "-j", *args).stdout or "[]")
            return [
                r
                for r in rows
                if not self.cluster_bridge or self.cluster_bridge not in (r.get("ifname"), r.get("dev"))
            ]

        addrs = [
            {
                "ifname": a["ifname"],
                "addr": [(x["family"], x["local"], x["prefixlen"]) for x in a["addr_info"]],
            }
            for a in j("addr")
        ]
        return {"addr": addrs, "route": j("route", "show", "table", "all"), "rule": j("rule")}

    def bonds_settled(self) -> bool:
        links = json.loads(run("ip", "-n", self.node, "-j", "addr").stdout or "[]")
        ready = {
            a["ifname"]
            for a in links
            if a.get("operstate") == "UP"
            and any(
                x["family"] == "inet6" and x["scope"] == "link" and not x.get("tentative")
                for x in a["addr_info"]
            )
        }
        return set(self.bonds) <= ready

    def host_has(self, bond: str) -> bool:
        """Whether ``bond`` holds an IPv4 address on the node right now."""
        out = run("ip", "-n", self.node, "-4", "-j", "addr", "show", "dev", bond).stdout
        return any(a.get("addr_info") for a in json.loads(out or "[]"))

    def wait_for(self, what: str, cond: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise DemoFailed(f"timed out waiting for {what}")
            time.sleep(0.05)

    def cleanup(self) -> None:
        for name in reversed(self.namespaces):
            run("ip", "netns", "del", name, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)


# The simulated node's process: SimNode serving in its main thread until SIGTERM.
SIM_NODE = r"""
import signal, sys, threading
from rdma_cni.sim.model import MLX5_TYPES
from rdma_cni.sim.node import SimNode
from rdma_cni.sim.daemon import parse_bonds
root, bonds, node_netns, prefix, numa, dev_root = sys.argv[1:7]
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the demo, which stops us by pid
node = SimNode(root, parse_bonds(bonds, numa, mad=True), node_netns, "/run/netns", prefix, gid_slots=16,
               gid_types=MLX5_TYPES, rdma_cm=True, dev_root=dev_root)
with node:
    print("ready", flush=True)
    node.serve(stop)
"""


def gid_index(d: Node, i: int, ndev: str | None = None) -> int | None:
    """Index of the RoCE v2 GID of bond i's IPv4 address in mlx5_bond_i's table (None: not there)."""
    return sysfs.roce_v2_index(d.sysfs, f"mlx5_bond_{i}", 1, bond_ip(i), ndev=ndev)


