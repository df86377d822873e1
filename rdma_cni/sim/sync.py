"""Waiting for the simulated node (:class:`rdma_cni.sim.node.SimNode`) to catch up with the kernel.

A test or the demo changes links and addresses, then a plugin reads the GID tables the simulated node
keeps: it must first know that the node has seen the change. :func:`watched` / :func:`wait_watched`:
a new pod netns is being listened to; :func:`barrier`: every event queued so far has been applied.
"""

from __future__ import annotations

import os
import subprocess
import time

from rdma_cni.net.netns import iproute_in, open_netns
from rdma_cni.sim.node import NSID_UNSET


def watched(node_netns: str | None, pod_netns: str) -> bool:
    """True once events of ``pod_netns`` reach the node's listener (the node netns has an nsid for it;
    a running SimNode gives one to every pod netns it finds). Tests wait for this after creating a
    pod netns, before the plugin runs: a move made earlier is read as a snapshot, not in order."""
    with open_netns(pod_netns) as pod, open_netns(node_netns or "/proc/thread-self/ns/net") as node:
        ipr = iproute_in(node if node_netns else None)
        try:
            got = ipr.get_netnsid(fd=pod.fd) or {}
        finally:
            ipr.close()
    return got.get("nsid") not in NSID_UNSET


def wait_watched(node_netns: str | None, pod_netns: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not watched(node_netns, pod_netns):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the simulated node did not pick up {pod_netns} within {timeout} s")
        time.sleep(0.005)


def barrier(node_netns: str | None, sysfs_root: str, bond: str = "bond0", timeout: float = 5.0) -> None:
    """Return once a running SimNode has applied every event queued before this call.

    Sets a unique alias on ``bond`` (a link event, no GID change) and waits for the tree's
    ``class/net/<bond>/ifalias`` to show it: events are applied in order, so all earlier ones are done.
    """
    token = f"sim-barrier-{os.getpid()}-{time.monotonic_ns()}"
    cmd = [
        "ip",
        *(["-n", os.path.basename(node_netns)] if node_netns else []),
        "link",
        "set",
        bond,
        "alias",
        token,
    ]
    if node_netns and os.path.dirname(node_netns) != "/run/netns":
        cmd = ["nsenter", f"--net={node_netns}", "ip", "link", "set", bond, "alias", token]
    subprocess.run(cmd, check=True, capture_output=True)
    path = os.path.join(sysfs_root, "class", "net", bond, "ifalias")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                if f.read().strip() == token:
                    return
        except FileNotFoundError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the simulated node did not catch up within {timeout} s")
        time.sleep(0.005)
