"""What the node says about the device plugin, read once per doctor/state run: the plugin's own status
file and kubelet's PodResources (allocatable devices, and which pod holds which).

Nothing in :mod:`rdma_cni.doctor` is imported here: the node snapshot (:mod:`rdma_cni.doctor.node`)
reads this, and the checks read the snapshot, so the arrows run one way.

    view = observe_device_plugin(pod_resources_dir, run_dir, resource)

The status file (``<run_dir>/device-plugin/status.json``, written atomically by the plugin on every
change) is ``{"resourceName", "registered", "registrations", "endpoint", "pid", "updated",
"allocations", "devices": [{"id", "netdev", "numa", "healthy", "reason"}]}``.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from typing import Any

from rdma_cni.cni.errors import CniError
from rdma_cni.devices.dra_names import DRIVER as DRA_DRIVER
from rdma_cni.kube import podresources

DEFAULT_RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
STATUS_FILE = os.path.join("device-plugin", "status.json")
ABSENT = "absent"
PodKey = tuple[str, str]


@dataclass
class DevicePluginView:
    resource: str
    status_path: str
    status: dict[str, Any] | None
    status_error: str  # "" = read; ABSENT; else why it could not be read
    socket: str
    pods: dict[PodKey, dict[str, list[str]]] | None  # None: kubelet not asked/answering
    allocatable: list[tuple[str, tuple[int, ...]]] | None  # (device ID, NUMA) of ``resource``
    kubelet_error: str  # "" = answered; ABSENT = no socket; else the client's sentence
    allocatable_by: dict[str, int] | None = None  # resource -> kubelet's allocatable count (every pool)
    dra_registration: str = ""  # rdma-dra-driver's registration socket when it exists: a DRA node
    status_stale: bool = False  # its pid no longer runs and kubelet has none of it: a stopped plugin

    def allocated(self) -> dict[str, str]:
        """Device ID of ``resource`` -> "namespace/name" of the pod kubelet gave it to."""
        out: dict[str, str] = {}
        for (ns, name), devices in (self.pods or {}).items():
            for dev in devices.get(self.resource, []):
                out[dev] = f"{ns}/{name}"
        return out

    def known_ids(self) -> set[str]:
        """IDs kubelet knows for ``resource``: allocatable now or allocated to a pod."""
        return {d for d, _ in self.allocatable or []} | set(self.allocated())


def observe_device_plugin(
    pod_resources_dir: str, run_dir: str, resource: str, timeout: float = 3.0
) -> DevicePluginView:
    status_path = os.path.join(run_dir, STATUS_FILE)
    status, status_error = _read_status(status_path)
    if status and isinstance(status.get("resourceName"), str) and status["resourceName"]:
        resource = status["resourceName"]

    sock = podresources.socket_path(pod_resources_dir)
    pods: dict[PodKey, dict[str, list[str]]] | None = None
    alloc: list[tuple[str, tuple[int, ...]]] | None = None
    counts: dict[str, int] | None = None
    kubelet_error = ABSENT
    if podresources.available(sock):
        try:
            pods = podresources.list_pods(sock, timeout)
            every = merged_by_device(podresources.allocatable(sock, timeout))
            alloc = [(dev, numa) for (res, dev), numa in every.items() if res == resource]
            counts = {}
            for res, _ in every:
                counts[res] = counts.get(res, 0) + 1
            kubelet_error = ""
        except CniError as err:
            kubelet_error = err.msg
    return DevicePluginView(
        resource, status_path, status, status_error, sock, pods, alloc, kubelet_error, counts,
        dra_registration(pod_resources_dir),
        # stale: the plugin that wrote it is gone and kubelet has nothing of its resource
        status is not None and not alloc and not _pid_runs(status.get("pid")),
    )


def merged_by_device(every: list[podresources.Allocatable]) -> dict[tuple[str, str], tuple[int, ...]]:
    """(resource, device ID) -> its NUMA nodes, each device once. kubelet lists a device once per
    NUMA node of its topology, each entry naming one node (devicemanager's
    containerDevicesFromResourceDeviceInstances): counted as they come, a shared-mode pool whose
    virtual devices sit on both NUMA nodes showed twice its size."""
    out: dict[tuple[str, str], tuple[int, ...]] = {}
    for a in every:
        key = (a.resource, a.device_id)
        out[key] = tuple(sorted(set(out.get(key, ())) | set(a.numa)))
    return out


def dra_registration(pod_resources_dir: str) -> str:
    """rdma-dra-driver's registration socket under the same kubelet root, when it is there: the
    node serves the RDMA resource through DRA (the DaemonSet's DRA variant), not a device plugin."""
    root = os.path.dirname(os.path.normpath(pod_resources_dir))
    path = os.path.join(root, "plugins_registry", f"{DRA_DRIVER}-reg.sock")
    try:
        return path if stat.S_ISSOCK(os.stat(path).st_mode) else ""
    except OSError:
        return ""


def _pid_runs(pid: object) -> bool:
    """Whether the plugin's recorded pid still runs (the DaemonSet shares the node's PIDs); an
    unknown pid counts as running, so only a provably gone plugin is called stale."""
    if not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_status(path: str) -> tuple[dict[str, Any] | None, str]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        return None, ABSENT
    except (OSError, ValueError) as exc:
        return None, f"{path} cannot be read: {exc}"
    if not isinstance(doc, dict) or not isinstance(doc.get("devices", []), list):
        return None, f"{path} is not a device plugin status (an object with a devices list)"
    return doc, ""
