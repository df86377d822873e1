"""Which device-plugin devices the kubelet gave a pod, read from its device-manager checkpoint.

``<devicePluginDir>/kubelet_internal_checkpoint`` (``/var/lib/kubelet/device-plugins``: kubelet's
device manager uses that constant path even when its ``--root-dir`` moves) is JSON the kubelet
rewrites on every allocation: ``{"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName",
"ResourceName", "DeviceIDs", "AllocResp"}], "RegisteredDevices": {...}}, "Checksum": N}``. Since
Kubernetes 1.20 ``DeviceIDs`` is a map NUMA node -> IDs; before, a plain list. Both are read. The
kubelet allocates devices before it asks the runtime for the pod sandbox, so by the time a CNI ADD
runs the entry is there. rdma-multus reads it only when kubelet's PodResources API cannot answer
(:mod:`rdma_cni.kube.podresources`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from rdma_cni.cni.errors import STATE_CORRUPT, CniError

log = logging.getLogger("rdma_cni.kube")

CHECKPOINT = "kubelet_internal_checkpoint"


def pod_devices(device_plugin_dir: str, pod_uid: str) -> dict[str, list[str]]:
    """Resource -> IDs allocated to every container of the pod, in container order; {} if none."""
    return read(device_plugin_dir).pods.get(pod_uid, {})


@dataclass(frozen=True)
class Checkpoint:
    """What the checkpoint says: each pod's devices by UID, and the resources registered here."""

    pods: dict[str, dict[str, list[str]]]
    registered: frozenset[str]


def read(device_plugin_dir: str) -> Checkpoint:
    """Every pod's allocation (pod UID -> resource -> IDs); empty when there is no checkpoint."""
    path = os.path.join(device_plugin_dir, CHECKPOINT)
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        log.info("no kubelet device checkpoint at %s", path)
        return Checkpoint({}, frozenset())
    except (OSError, ValueError) as exc:
        raise CniError(STATE_CORRUPT, f"kubelet device checkpoint {path} cannot be read: {exc}") from exc
    data = (doc or {}).get("Data") or {}
    pods: dict[str, dict[str, list[str]]] = {}
    for entry in data.get("PodDeviceEntries") or []:
        if not isinstance(entry, dict):
            continue
        of_pod = pods.setdefault(str(entry.get("PodUID", "")), {})
        ids = of_pod.setdefault(str(entry.get("ResourceName", "")), [])
        ids.extend(dev for dev in _ids(entry.get("DeviceIDs")) if dev not in ids)
    registered = data.get("RegisteredDevices")
    return Checkpoint(pods, frozenset(registered) if isinstance(registered, dict) else frozenset())


def _ids(raw: Any) -> list[str]:
    if isinstance(raw, list):
        return [str(x) for x in raw]
    if isinstance(raw, dict):
        # NUMA node -> IDs; sort nodes numerically so the order is stable from call to call.
        nodes = sorted(raw, key=lambda k: (int(k) if str(k).lstrip("-").isdigit() else 1 << 30, str(k)))
        return [str(x) for node in nodes for x in (raw[node] or [])]
    return []
