"""``scripts/demo --cluster``: seed 000's scenario on the real test cluster, printing what a user sees.

The TKE guide's steps, in its order: label the nodes, ``kubectl apply`` the component, see the
capacity in ``kubectl describe node``, apply the ``ibv-app`` StatefulSet, wait for the pods, look
into one (its bonds, its ``/dev/infiniband``, the GID table as ``show_gids`` prints it, its
network-status annotation), then delete it and see the node exact again. The cluster is torn down at
the end (also on failure or Ctrl-C).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from collections.abc import Sequence

from cluster import build, cluster
from cluster import topology as topo
from cluster import workloads as w
from cluster.build import Binaries
from cluster.cluster import kubectl
from cluster.node import Node


def banner(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def show(bins: Binaries, *args: str) -> str:
    print(f"$ kubectl {' '.join(args)}", flush=True)
    out = kubectl(bins, *args).stdout
    print(out.rstrip(), flush=True)
    return out


def scenario(bins: Binaries, nodes: int) -> None:
    banner("1. Label the RDMA nodes and apply the component (conf/k8s/rdma-cni.yaml, the local image)")
    w.label_nodes(bins, nodes)
    w.apply(bins, w.product_manifest())
    w.wait_ready(bins, "k8s-app=rdma-cni", nodes, "kube-system", timeout=300)
    show(bins, "-n", "kube-system", "get", "po", "-o", "wide", "-l", "k8s-app=rdma-cni")
    for name in (topo.node_name(n) for n in range(1, nodes + 1)):
        w.wait(f"{name} offers 8", functools.partial(_offers_8, bins, name), 120)
    print("$ kubectl describe node | grep tke-shared-rdma")
    print(
        "\n".join(
            line
            for line in kubectl(bins, "describe", "node").stdout.splitlines()
            if "tke-shared-rdma" in line
        )
    )
    banner("2. Seed 000's ibv-app StatefulSet (rdma-test.yaml; only the image is the local one)")
    t0 = time.monotonic()
    w.apply(bins, w.seed_statefulset())
    w.wait_ready(bins, "k8s-app=ibv-app", min(4, 2 * nodes))
    print(f"-> {min(4, 2 * nodes)} pods Running {time.monotonic() - t0:.1f} s after kubectl apply")
    show(bins, "get", "pods", "-l", "k8s-app=ibv-app", "-o", "wide")
    banner("3. Inside ibv-app-0: its bonds carry the bonds' own IPs, its RDMA devices, the host's GID index")
    for cmd in (
        ["ip", "-br", "addr"],
        ["ls", "/dev/infiniband"],
        ["sh", "-c", "env | grep -E 'NCCL|UCX' | sort"],
    ):
        print(f"$ kubectl exec ibv-app-0 -- {' '.join(cmd)}")
        print(w.pod_exec(bins, "ibv-app-0", *cmd).rstrip())
    pod = json.loads(kubectl(bins, "get", "pod", "ibv-app-0", "-o", "json").stdout)
    nd = Node(int(pod["spec"]["nodeName"].rsplit("-", 1)[1]))
    print(f"$ cni-tool gids   (on {nd.name}: show_gids; the pod keeps each bond's index 3)")
    print(nd.run("/opt/cni/bin/cni-tool gids | head -20").stdout.rstrip())
    key = "k8s\\.v1\\.cni\\.cncf\\.io/network-status"
    print(f"$ kubectl get pod ibv-app-0 -o jsonpath='{{.metadata.annotations.{key}}}'")
    print(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"])
    banner("4. Delete the workload: every bond's IP, route, rule and GID back on the node")
    kubectl(bins, "delete", "statefulset", "ibv-app", "--wait=true", timeout=180)
    w.wait_gone(bins, "k8s-app=ibv-app")
    time.sleep(1)
    for n in range(1, nodes + 1):
        addrs = w.node_network(Node(n))["addr"]
        print(f"{topo.node_name(n)}: " + ", ".join(f"{b} {a[0][0]}" for b, a in sorted(addrs.items())))


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="cluster: %(message)s", stream=sys.stderr)
    p = argparse.ArgumentParser(prog="scripts/demo --cluster")
    p.add_argument("--nodes", type=int, default=2)
    a = p.parse_args(argv)
    with cluster.exclusive():
        try:
            cluster.up(a.nodes)
            scenario(build.binaries(), a.nodes)
        except KeyboardInterrupt:
            print("interrupted: removing the cluster", file=sys.stderr)
            return 130
        finally:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _offers_8(bins: Binaries, name: str) -> bool:
    return w.node_capacity(bins, name) == (8, 8)
