"""The simulated RDMA node as most tests run it (:mod:`rdma_cni.sim.daemon`): veth "bonds" in a node
netns, a sysfs tree whose GID tables follow their addresses, and the pod namespaces under /run/netns
whose names start with the test's prefix. One place for its arguments, so a test says only what is
particular to it (which bonds, the GID slots, the mlx5 layout, NUMA nodes, /dev nodes).

Usage::

    with sim_node(sysfs, ["bond0", "bond1"], n.name, f"h2-{n.tag}-pod-") as pid:
        ...
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

from rdma_cni.sim.daemon import daemon


def sim_node_args(
    sysfs: str,
    bonds: Sequence[str] | str,
    node_netns: str,
    pods_prefix: str | None = None,
    gid_slots: int | None = 16,
    extra: Sequence[str] = (),
) -> list[str]:
    """The daemon's arguments: ``node_netns`` is the name under /run/netns; ``pods_prefix`` None
    watches no pod namespaces; ``gid_slots`` None keeps the daemon's default."""
    spec = bonds if isinstance(bonds, str) else ",".join(bonds)
    args = ["--sysfs-root", sysfs, "--bonds", spec, "--node-netns", f"/run/netns/{node_netns}"]
    if pods_prefix is not None:
        args += ["--pods-dir", "/run/netns", "--pods-prefix", pods_prefix]
    if gid_slots is not None:
        args += ["--gid-slots", str(gid_slots)]
    return [*args, *extra]


def sim_node(
    sysfs: str,
    bonds: Sequence[str] | str,
    node_netns: str,
    pods_prefix: str | None = None,
    gid_slots: int | None = 16,
    extra: Sequence[str] = (),
    timeout: float = 30.0,
) -> AbstractContextManager[int]:
    """The daemon running (yields its pid) until the block ends; stopped by that pid."""
    return daemon(sim_node_args(sysfs, bonds, node_netns, pods_prefix, gid_slots, extra), timeout)


