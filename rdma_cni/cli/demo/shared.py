"""``scripts/demo --mode shared``: TKE's shared RDMA NIC mode on the demo's simulated GPU node: the
device plugin's shared pool, two pods sharing every bond through rdma-ipvlan, and the node as it was.

The node is the exclusive demo's (:class:`.node.Demo`: veth bonds with /28s in a node netns, their
peers in a switch netns, the simulated RDMA sysfs whose GID tables follow the live addresses,
mknod'd ``/dev/infiniband`` nodes) in shared mode (:class:`.shared_node.SharedDemo`); the steps:

* rdma-device-plugin with ``mode: shared``: kubelet admits two pods asking for one virtual device
  each, and each Allocate mounts every RDMA device (no GID-index env: a shared-mode pod's index
  exists only after its ADD);
* the two pods ADDed through rdma-multus (``tke-route-eni,tke-rdma-ipvlan``): each gets a child of
  every bond with an address of its own from the bond's /28 and that address's own RoCE v2 GID index;
  pings to the switch on every bond and between the pods; ``cni-tool state`` and ``doctor``;
* both DELeted, and the node compared with how it started, GID tables included.

Names, cleanup on failure and Ctrl-C, and the sweep of killed runs are the exclusive demo's.
"""

from __future__ import annotations

import signal

from rdma_cni.cli.demo import delete, device_plugin, inside_pod, node_says, pod, traffic
from rdma_cni.cli.demo.installed import step_node
from rdma_cni.cli.demo.node import RESOURCE
from rdma_cni.cli.demo.shared_node import SHARED_COUNT, SharedDemo
from rdma_cni.cli.demo.shell import banner, finish, interrupted


def scenario(d: SharedDemo) -> None:
    banner(
        f"1. A simulated GPU node, shared mode: netns {d.node}, {len(d.bonds)} bond NICs, switch {d.switch}"
    )
    d.build_node()
    d.wait_for("the bonds' carrier", d.bonds_settled)
    with d.rdma():
        host_index = step_node(d)
        before, bonds_before, gids = d.host_snapshot(), d.bond_snapshot(), d.gid_table()
        banner(f"2. The device plugin, mode: shared: one shared pool {RESOURCE} of {SHARED_COUNT}")
        with device_plugin.device_plugin(d) as ep:
            held = device_plugin.shared_pool(d, ep)
            pod.add_pods(d, held)
            addrs = inside_pod.shared(d, bonds_before, host_index)
            traffic.shared(d, addrs)
            # runDir (GID records, the device plugin's status) is named by rdma-macvlan's config,
            # which a shared-mode node does not have: say where it is
            node_says.show(d, [*d.node_options(), "--run-dir", str(d.tmp / "run")])
            delete.shared(d, before, gids, host_index)


def run_demo(bonds: int, bundle: str, mode: str) -> int:
    """The shared-mode demo with the exclusive demo's exit codes: 0, 1 failed, 130 interrupted."""
    d = SharedDemo(bonds, bundle, mode)
    signal.signal(signal.SIGTERM, interrupted)
    return finish(d, lambda: scenario(d))
