"""Running a simulated node (:class:`rdma_cni.sim.node.SimNode`): in a thread of this process
(:func:`running`), or as a process of its own (``python -m rdma_cni.sim.daemon --sysfs-root ...
--bonds bond0:mlx5_bond_0``; :func:`daemon` starts one and stops it by pid), as the demo, the test
cluster's nodes and the tests that drive a separate plugin process use it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence

from rdma_cni.sim import tree
from rdma_cni.sim.model import MLX5_TYPES, RXE_TYPES
from rdma_cni.sim.node import SimNode
from rdma_cni.sim.tree import SimBond


@contextlib.contextmanager
def running(node: SimNode, interval: float = 0.02, timeout: float = 30.0) -> Iterator[SimNode]:
    """Open and run a node in a background thread (for tests that drive a separate plugin process).

    The node is opened *in* that thread: pyroute2's sync API belongs to the thread that made it.
    """
    stop, ready = threading.Event(), threading.Event()
    failure: list[Exception] = []

    def main() -> None:
        try:
            with node:
                ready.set()
                node.serve(stop, interval)
        except Exception as e:  # noqa: BLE001 - handed to the caller below
            failure.append(e)
            ready.set()

    t = threading.Thread(target=main, daemon=True)
    t.start()
    if not ready.wait(timeout) or failure:
        stop.set()
        raise RuntimeError(f"simulated RDMA node did not start: {failure[0] if failure else 'timeout'}")
    try:
        yield node
    finally:
        stop.set()
        t.join()
    if failure or node.errors:
        raise RuntimeError(f"simulated RDMA node failed ({failure or node.errors} time(s)); see the log")


def parse_bonds(spec: str, numa: str = "", mad: bool = False) -> list[SimBond]:
    """``bond0:mlx5_bond_0,bond1:mlx5_bond_1`` (or ``bond0,bond1`` -> ``mlx5_bond_<N>``).

    ``numa``: one ``device/numa_node`` per bond (``0,0,1,1``; ``-1`` = no NUMA info, ``none`` = no PCI
    parent), or one value for all; ``mad``: umadN/issmN for every bond.
    """
    out = []
    items = [i for i in spec.split(",") if i]
    nodes = [n.strip() for n in numa.split(",")] if numa else []
    if len(nodes) == 1:
        nodes *= len(items)
    if nodes and len(nodes) != len(items):
        raise ValueError(f"--numa gives {len(nodes)} values for {len(items)} bonds")
    for pos, item in enumerate(items):
        name, _, device = item.partition(":")
        node = nodes[pos] if nodes else "none"
        out.append(
            SimBond(
                name,
                device or f"mlx5_bond_{name.removeprefix('bond')}",
                numa_node=None if node == "none" else int(node),
                mad=mad,
            )
        )
    return out


@contextlib.contextmanager
def daemon(args: Sequence[str], timeout: float = 30.0) -> Iterator[int]:
    """Start ``python -m rdma_cni.sim.daemon ARGS`` and yield its pid once ready; stop it by that pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rdma_cni.sim.daemon", *args], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else ""
        if line.strip() != "ready":
            raise RuntimeError(f"simulated RDMA node did not start (rc={proc.poll()}, said {line!r})")
        yield proc.pid
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    if proc.returncode != 0:
        raise RuntimeError(
            f"simulated RDMA node exited {proc.returncode}: it failed to apply events (see its stderr)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rdma_cni.sim.daemon", description=__doc__.split("\n")[0])
    p.add_argument("--sysfs-root", required=True)
    p.add_argument("--bonds", required=True, help="bond0:mlx5_bond_0,bond1:mlx5_bond_1")
    p.add_argument("--node-netns", default=None, help="netns path of the node (default: this one)")
    p.add_argument("--pods-dir", default=None, help="directory of pod netns bind mounts (e.g. /run/netns)")
    p.add_argument("--pods-prefix", default="")
    p.add_argument("--gid-slots", type=int, default=tree.RXE_GID_SLOTS)
    p.add_argument("--netns-mode", choices=("shared", "exclusive"), default="shared")
    p.add_argument(
        "--layout",
        choices=("rxe", "mlx5"),
        default="rxe",
        help="GID types per address: rxe = RoCE v2 only (IPv4 at 1), mlx5 = v1 + v2 (IPv4 v2 at 3)",
    )
    p.add_argument("--numa", default="", help="device/numa_node per bond: 0,0,1,1 (-1: none, 'none': absent)")
    p.add_argument("--mad", action="store_true", help="umadN/issmN char devices for every bond")
    p.add_argument("--rdma-cm", action="store_true", help="class/misc/rdma_cm (10:58)")
    p.add_argument("--dev-root", default=None, help="make the /dev/infiniband nodes (mknod) under this dir")
    p.add_argument("--pidfile", default=None)
    a = p.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    node = SimNode(
        a.sysfs_root,
        parse_bonds(a.bonds, a.numa, a.mad),
        a.node_netns,
        a.pods_dir,
        a.pods_prefix,
        a.gid_slots,
        MLX5_TYPES if a.layout == "mlx5" else RXE_TYPES,
        netns_mode=a.netns_mode,
        rdma_cm=a.rdma_cm,
        dev_root=a.dev_root,
    )
    with node:
        if a.pidfile:
            tree.put(a.pidfile, f"{os.getpid()}\n")
        print("ready", flush=True)
        node.serve(stop)
        failed = node.errors
    if a.pidfile:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(a.pidfile)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
