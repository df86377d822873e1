"""The faults of the chaos run (tests/cluster/chaos.py): kill -9 of one component of the test cluster,
then what brings it back on a real cluster.

- The product's DaemonSet containers (``rdma-agent``, ``rdma-device-plugin``, ``rdma-dra-driver``):
  their first process is killed; kubelet restarts the container, as it would on a node.
- kubelet and containerd: started again by the harness, as a node's service manager would
  (``Restart=always``).
- etcd, kube-apiserver, kube-controller-manager, kube-scheduler: started again by the harness, as
  kubelet restarts a control-plane node's static pods.

Every process killed is one the harness started (by its recorded pid) or one that runs in a node's
cgroup tree, which only the test cluster's runtime populates.

    fault = faults.pick(rng, faults.components("dra"), nodes=2)
    done = faults.inject(fault)   # Kill(component="rdma-node-1/rdma-agent", ...)
"""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from cluster import cluster
from cluster import topology as topo
from cluster.node import Node

# the DaemonSet's containers by the front end that runs them: the entry point's argv[1]
DAEMONSET = {"devicePlugin": ("rdma-agent", "rdma-device-plugin"), "dra": ("rdma-agent", "rdma-dra-driver")}
SERVICES = ("kubelet", "containerd")
STATIC_PODS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
BUNDLE = b"rdma-cni"  # the DaemonSet's entry point: /opt/cni/bin/rdma-cni.d/current/rdma-cni


@dataclass(frozen=True)
class Fault:
    """What to kill: ``component`` on ``node`` (0 for the control plane)."""

    component: str
    node: int = 0

    @property
    def name(self) -> str:
        """The name a report counts it under and cluster.State records it by."""
        return f"{topo.node_name(self.node)}/{self.component}" if self.node else self.component


@dataclass(frozen=True)
class Kill:
    """One fault injected: when (monotonic), whether a process was there to kill, how long the
    harness's restart took (0 for the DaemonSet's containers: kubelet restarts those)."""

    fault: Fault
    at: float
    killed: bool
    restart_s: float = 0.0


def components(front_end: str) -> list[str]:
    """Every component a run of ``front_end`` kills."""
    return [*DAEMONSET[front_end], *SERVICES, *STATIC_PODS]


def pick(rng: random.Random, names: list[str], nodes: int) -> Fault:
    """A component drawn evenly, on a node drawn evenly when it runs on every node."""
    name = rng.choice(names)
    return Fault(name) if name in STATIC_PODS else Fault(name, rng.randint(1, nodes))


def inject(fault: Fault) -> Kill:
    """kill -9 of the fault's process, then what starts it again."""
    at = time.monotonic()
    if fault.component in STATIC_PODS or fault.component in SERVICES:
        cluster.stop_one(fault.name, signal.SIGKILL)
        cluster.start_again(fault.name)
        return Kill(fault, at, True, time.monotonic() - at)
    pid = container_process(Node(fault.node), fault.component)
    if pid is None:  # kubelet is still restarting the container (a kill before, or its back-off)
        return Kill(fault, at, False)
    os.kill(pid, signal.SIGKILL)
    return Kill(fault, at, True)


def container_process(node: Node, entry: str) -> int | None:
    """The first process of the DaemonSet's container ``entry`` on ``node`` (its workers and children
    have the same command line: the one whose parent is not one of them), found in the node's cgroup
    tree; None while none runs."""
    mine = {pid: ppid for pid, ppid in _bundle_processes(node, entry.encode())}
    first = [pid for pid, ppid in mine.items() if ppid not in mine]
    return min(first) if first else None


def _bundle_processes(node: Node, entry: bytes) -> list[tuple[int, int]]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
            if len(argv) < 2 or argv[1] != entry or not argv[0].endswith(BUNDLE):
                continue
            if f"{node.cgroup_root}/" not in Path(f"/proc/{d}/cgroup").read_text():
                continue
            stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[0] != "Z":
            out.append((int(d), int(stat[1])))
    return out
