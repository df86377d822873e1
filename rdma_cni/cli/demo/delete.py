"""Step 7 of the demo: delete. ``cni-tool del rdma-multus`` for each pod, its netns removed, and the
node compared with how it started: addresses, routes, rules and GID indexes all given back
(:func:`exclusive`), or, in shared mode, every pod address freed and the GID tables as before
(:func:`shared`).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from rdma_cni.cli.demo.installed import Demo
from rdma_cni.cli.demo.node import gid_index
from rdma_cni.cli.demo.shared_node import SharedDemo
from rdma_cni.cli.demo.shell import DemoFailed, banner, run, say


def exclusive(d: Demo, env: dict[str, str], before: dict[str, Any], host_index: int) -> None:
    banner("7. Delete the pod: the IPs, routes and GIDs go back to the node")
    d.cni_tool("del", "rdma-multus", f"/run/netns/{d.pod}", env=env)
    run("ip", "netns", "del", d.pod)
    d.namespaces.remove(d.pod)
    after = d.host_snapshot()
    run("ip", "-n", d.node, "-br", "addr", show=True)
    for i, bond in d.pod_bond_list():
        d.wait_for(
            f"the host's GID on {bond}", partial(lambda i, bond: gid_index(d, i, bond) is not None, i, bond)
        )
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    if after != before:
        diff = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        raise DemoFailed(f"the node is not as it was: {json.dumps(diff)[:2000]}")
    for i, bond in d.pod_bond_list():
        index = gid_index(d, i, bond)
        if index != host_index:
            raise DemoFailed(f"{bond}'s GID came back at index {index}, it was {host_index}")
    say(f"-> node restored: addresses, routes and rules as before the pod; GID index {host_index} again")


def shared(d: SharedDemo, before: dict[str, Any], gids: list[dict[str, Any]], host_index: int) -> None:
    banner("7. Delete both pods: their children, addresses and GIDs go; the node is as it was")
    for i, pod in enumerate(d.pods):
        d.cni_tool("del", "rdma-multus", f"/run/netns/{pod}", env=d.pod_env(i))
        run("ip", "netns", "del", pod)
        d.namespaces.remove(pod)
    d.wait_for("the pods' GIDs to go", lambda: d.gid_table() == gids)
    run("ip", "-n", d.node, "-br", "addr", show=True)
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    after = d.host_snapshot()
    if after != before:
        diff = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        raise DemoFailed(f"the node is not as it was: {json.dumps(diff)[:2000]}")
    left = sorted((d.data_dir / "attachments").glob("*.json"))
    if left:
        raise DemoFailed(f"addresses still held after both DELs: {[p.name for p in left]}")
    say(
        "-> node restored: addresses, routes, rules and GID tables as before the pods "
        f"(GID index {host_index}); no address held"
    )
