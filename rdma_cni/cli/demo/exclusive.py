"""``scripts/demo`` in TKE's exclusive RDMA mode (the default): one pod gets whole bonds through
rdma-multus and rdma-macvlan on the simulated node, step by step in TKE's guide's order.

Like containerd for a pod annotated ``tke.cloud.tencent.com/networks: tke-route-eni,
tke-rdma-macvlan``: ``cni-tool add rdma-multus`` (ADD through rdma-multus → ptp + rdma-macvlan),
show the pod's interfaces, routes and GIDs, ping the switch from each bond, ``cni-tool doctor`` and
``cni-tool state``, ``cni-tool del``, and compare the node with how it started.
"""

from __future__ import annotations

import signal

from rdma_cni.cli.demo import delete, device_plugin, inside_pod, node_says, pod, traffic
from rdma_cni.cli.demo.installed import Demo, step_node
from rdma_cni.cli.demo.node import RESOURCE
from rdma_cni.cli.demo.shell import banner, finish, interrupted


def scenario(d: Demo) -> None:
    banner(f"1. A simulated GPU node: netns {d.node}, {len(d.bonds)} bond NICs, switch {d.switch}")
    d.build_node()
    # Start the simulated RDMA devices on settled links (carrier up, IPv6 link-local in place), as on
    # a node whose bonds came up at boot.
    d.wait_for("the bonds' carrier", d.bonds_settled)
    with d.rdma():
        host_index = step_node(d)
        before = d.host_snapshot()
        banner(f"2. The device plugin: rdma-device-plugin advertises {RESOURCE} to kubelet")
        with device_plugin.device_plugin(d) as ep:
            device_plugin.exclusive_pool(d, ep)
            env = pod.add(d)
            inside_pod.exclusive(d, host_index)
            traffic.exclusive(d)
            node_says.show(d, d.node_options())
            delete.exclusive(d, env, before, host_index)


def run_demo(bonds: int, pod_bonds: int, bundle: str, network: str) -> int:
    """The exclusive-mode demo end to end; the exit code (0 OK, 1 failed, 130 interrupted)."""
    d = Demo(bonds, pod_bonds, bundle, network)
    signal.signal(signal.SIGTERM, interrupted)
    return finish(d, lambda: scenario(d))
