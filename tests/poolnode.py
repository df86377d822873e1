"""A simulated node for device plugin pools: tests/dpnode.py's node of RoCE bonds (veth bonds in a
node netns, the simulated sysfs kept current by rdma_cni.sim.node, mknod'd /dev/infiniband nodes,
the test kubelet) plus InfiniBand HCAs on PCI functions of their own (rdma_cni.sim.tree.add_ib_hca),
each with its IPoIB netdev: a veth end of that name in the node netns stands in for it (this kernel
has no IPoIB), so its up/down is real netlink, while sysfs says ``type`` 32 as the kernel would.

    with pool_node(roce=4, ib=("ibs108", "ibs109")) as p:
        p.start_with(config_text)                    # returns once every pool is registered
        ep = p.endpoint("rdma/hca_shared_devices_a")

Everything made here is removed on exit, also on failure.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from dpnode import DpNode, dp_node

from rdma_cni.sim.devnodes import make_dev_nodes
from rdma_cni.sim.kubelet import Endpoint
from rdma_cni.sim.tree import SimIbHca, add_ib_hca

ROCE_NUMA = (0, 0, 1, 1)


@dataclass
class PoolNode:
    d: DpNode
    ib: dict[str, str]  # RDMA device -> its IPoIB netdev

    config: str = ""  # the last config file written

    def write_config(self, text: str) -> str:
        """``config.json`` for JSON (Mellanox's name), ``device-plugin.yaml`` otherwise."""
        name = "config.json" if text.lstrip().startswith("{") else "device-plugin.yaml"
        path = self.config = os.path.join(self.d.n.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def start_with(
        self, text: str, resources: Sequence[str] = (), *extra: str, wait: bool = True
    ) -> subprocess.Popen[bytes]:
        """The real plugin process with ``--config`` holding ``text``; with ``wait``, returns once every
        one of ``resources`` is registered with the kubelet."""
        proc = self.d.start("--config", self.write_config(text), *extra, wait=False)
        if wait:
            for resource in resources:
                try:
                    self.d.kubelet.wait_endpoint(resource, timeout=30)
                except AssertionError as e:
                    raise AssertionError(f"{e}; plugin rc={proc.poll()}, log: {self.d.log_tail()}") from None
        return proc

    def endpoint(self, resource: str, newer_than: Endpoint | None = None) -> Endpoint:
        return self.d.kubelet.wait_endpoint(resource, newer_than=newer_than, timeout=30)


@contextmanager
def pool_node(
    roce: int = 4, ib: Sequence[str] = ("ibs108", "ibs109"), ib_numa: Sequence[int] = (1, 0)
) -> Iterator[PoolNode]:
    """``roce`` RoCE bonds mlx5_bond_0.. (NUMA 0,0,1,1) and one InfiniBand HCA mlx5_<roce+i> per name in
    ``ib`` (NUMA ``ib_numa[i]``, uverbs/umad/issm numbered after the bonds)."""
    with dp_node(bonds=roce, numa=lambda i: ROCE_NUMA[i % 4]) as d:
        hcas: dict[str, str] = {}
        for i, netdev in enumerate(ib):
            d.n.bond(netdev, f"203.0.113.{16 * i + 2}/28")  # a link of that name, up, in the node netns
            n = roce + i
            add_ib_hca(d.sysfs, SimIbHca(f"mlx5_{n}", netdev, pci_index=n, uverbs=n, numa_node=ib_numa[i]))
            hcas[f"mlx5_{n}"] = netdev
        make_dev_nodes(d.sysfs, d.dev)
        yield PoolNode(d, hcas)
