"""Upstream Multus on the test cluster, installed the way its own deployment manifests install it.

The manifests come from the very module the harness builds (``deployments/multus-daemonset.yml``,
thin, as NVIDIA network-operator deploys it; ``-thick.yml``, thick), out of the Go module cache
(``go mod download`` of :data:`~cluster.versions.MULTUS`), with only their image replaced by the
local build (:func:`cluster.images.build_multus`, pulled from the cluster's registry). Nothing else
is edited: the NetworkAttachmentDefinition CRD, the ServiceAccount, the ClusterRole and the
DaemonSet are upstream's.

What a Multus node needs besides, as on any cluster that runs it:

- a cluster network config at the top of ``/etc/cni/net.d`` for Multus's ``auto`` config to wrap
  as its ``clusterNetwork`` (delegate 0): the cluster's ptp network ``tke-route-eni``, as
  ``10-tke-route-eni.conf`` (:func:`cluster_network`);
- the product installed with the chart's ``metaPlugin=none`` (install.sh then lays only the
  binaries, the delegate configs and the device plugin's config): one node runs one meta plugin
  (:func:`product_without_meta`).

    apply(bins, deployment("thin"))
    w.wait_ready(bins, SELECTOR, 1, "kube-system")
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from cluster import chart
from cluster.images import MULTUS_REPO
from cluster.node import Node
from cluster.versions import MULTUS, MULTUS_MODULE

SELECTOR = "app=multus"  # both upstream DaemonSets' pods carry it
UPSTREAM_IMAGE = "ghcr.io/k8snetworkplumbingwg/multus-cni:snapshot"  # -thick for the thick one
IMAGE = f"{MULTUS_REPO.rsplit('/', 1)[-1]}:{MULTUS}"  # multus-cni:v4.2.3, from the cluster's registry
MANIFESTS = {"thin": "multus-daemonset.yml", "thick": "multus-daemonset-thick.yml"}
# What Multus's auto config writes, and the runtime then uses first: the thin entrypoint a conflist
# when the cluster network's cniVersion is 1.0.0 (its template), else a plain config; the thick
# daemon always the plain one. In the runtime's (sorted) order: .conf before .conflist.
GENERATED = ("00-multus.conf", "00-multus.conflist")
CLUSTER_NETWORK = "10-tke-route-eni.conf"


def module_dir() -> Path:
    """The pinned Multus module's directory in the Go module cache (downloaded when missing)."""
    out = subprocess.run(
        ["go", "mod", "download", "-json", f"{MULTUS_MODULE}@{MULTUS}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    return Path(json.loads(out)["Dir"])


def deployment(variant: str = "thin") -> str:
    """Upstream's manifest of ``variant`` (thin or thick), its image the local build."""
    text = (module_dir() / "deployments" / MANIFESTS[variant]).read_text()
    upstream = UPSTREAM_IMAGE + ("-thick" if variant == "thick" else "")
    if upstream not in text:
        raise RuntimeError(f"{MANIFESTS[variant]} of Multus {MULTUS} names no {upstream}")
    return text.replace(upstream, IMAGE)


def generated(node: Node) -> dict[str, Any] | None:
    """The Multus plugin's config the runtime uses on ``node`` (the first plugin of a conflist), or
    None while Multus's ``auto`` wrote none."""
    for name in GENERATED:
        path = node.dir("/etc/cni/net.d") / name
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        plugin = doc["plugins"][0] if "plugins" in doc else doc
        return plugin if isinstance(plugin, dict) else None
    return None


def cluster_network(node: Node) -> None:
    """The cluster network as a top-level config: the same ptp ``tke-route-eni`` the harness lays
    into ``rdma-multus.d`` (:func:`cluster.node.cluster_network_config`), for Multus to find first."""
    src = node.dir("/etc/cni/net.d") / "rdma-multus.d" / "tke-route-eni.conf"
    (node.dir("/etc/cni/net.d") / CLUSTER_NETWORK).write_text(src.read_text())


def product_without_meta(rdma_mode: str = "exclusive", mellanox_config: Path | None = None,
                         front_end: str = "devicePlugin") -> str:
    """The chart rendered as a Multus user installs it: ``metaPlugin=none`` (install.sh writes no
    ``00-rdma-multus.conflist``), ``rdma_mode``, ``front_end``, and with ``mellanox_config``
    Mellanox's config.json as ``devicePlugin.mellanoxConfig``."""
    sets = ["--set", "metaPlugin=none", "--set", f"rdmaMode={rdma_mode}", "--set", f"frontEnd={front_end}"]
    if rdma_mode == "shared":  # this kernel has no IPVLAN: the node's link (the node policy's) is macvlan
        sets += ["--set", "shared.link=macvlan"]
    if mellanox_config is not None:
        sets += ["--set-file", f"devicePlugin.mellanoxConfig={mellanox_config}"]
    return chart.template(*sets, hooks=False)


# Exclusive mode's NAD: our delegate config, the device plugin's resource named so that Multus hands
# each reference one of the pod's allocated bonds as deviceID.
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
RDMA_MACVLAN = {
    "cniVersion": "1.0.0",
    "name": "rdma-exclusive",
    "type": "rdma-macvlan",
    "capabilities": {"deviceID": True},
}


def nad(name: str, config: dict[str, Any], resource: str | None = None) -> str:
    """A NetworkAttachmentDefinition in ``default`` (with ``k8s.v1.cni.cncf.io/resourceName``)."""
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if resource:
        meta["annotations"] = {"k8s.v1.cni.cncf.io/resourceName": resource}
    return yaml.safe_dump(
        {
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": meta,
            "spec": {"config": json.dumps(config)},
        }
    )


def references(count: int, network: str = "rdma-exclusive") -> dict[str, str]:
    """A pod's annotation referencing ``network`` ``count`` times (each gets the next device)."""
    return {"k8s.v1.cni.cncf.io/networks": ",".join([network] * count)}


def daemon_pids(node: Node) -> list[int]:
    """The thick plugin's ``multus-daemon`` processes running in ``node``'s cgroups."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != "multus-daemon":
                    continue
            with open(f"/proc/{pid}/cgroup") as f:
                if node.cgroup_root + "/" not in f.read():
                    continue
        except OSError:
            continue
        out.append(int(pid))
    return out
