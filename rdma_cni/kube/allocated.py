"""Which devices of one resource kubelet allocated to a pod, and to every other pod of the node.

A CNI plugin that picks a device itself (rdma-macvlan when no meta plugin passed a ``deviceID``:
upstream Multus passes none to the references of a NetworkAttachmentDefinition beyond the pod's
allocation) must never take a device kubelet gave another pod: that pod's ``/dev/infiniband``
files are that device's, and its own ADD would find the bond taken. So it asks kubelet, as the
meta plugins do: PodResources ``List`` (every pod, with its device-plugin devices and DRA devices)
and ``GetAllocatableResources`` (is the resource kubelet's to hand out here); when that socket is
absent or kubelet cannot answer, kubelet's device checkpoint (every pod by UID, and the resources
registered). DRA devices count under the resource when they come from our driver, as the devices
they stand in for.

    got = pod_view(PodRef("default", "ibv-app-0", "uid-1"), RESOURCE, DRIVER,
                   "/var/lib/kubelet/pod-resources", "/var/lib/kubelet/device-plugins")
    got.mine    # ("mlx5_bond_2", "mlx5_bond_3")
    got.others  # {"mlx5_bond_0": "pod default/ibv-app-1", ...}
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from rdma_cni.cni.errors import CniError
from rdma_cni.kube import checkpoint, podresources

log = logging.getLogger("rdma_cni.kube")


@dataclass(frozen=True)
class PodRef:
    """The pod a CNI call is for, as kubelet names it in ``CNI_ARGS``."""

    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class DeviceHolders:
    """One resource's devices on this node as kubelet allocated them."""

    resource: str
    mine: tuple[str, ...]  # the pod's device IDs (and our driver's DRA device names), in kubelet's order
    others: Mapping[str, str]  # device ID -> the other pod holding it ("pod ns/name" or "pod UID u")
    served: bool  # kubelet hands the resource out on this node (allocatable, or registered)
    source: str  # where it was read, for messages
    # The node's policy: a bond opens only to the pod kubelet allocated it to (rdma_cni.node_policy),
    # so a pod holding none gets none, whether or not kubelet serves the resource.
    only_allocated: bool = False


def pod_view(
    pod: PodRef, resource: str, driver: str, pod_resources_dir: str, device_plugin_dir: str,
    timeout: float = podresources.DEFAULT_TIMEOUT,
) -> DeviceHolders | None:
    """What kubelet allocated of ``resource`` (and of ``driver``'s DRA devices); None when neither
    PodResources nor the checkpoint exists (a node without kubelet's device manager: nothing to
    respect). A checkpoint that cannot be read is an error: choosing blind could steal a bond."""
    socket = podresources.socket_path(pod_resources_dir)
    if podresources.available(socket):
        try:
            held, served = podresources.node_allocations(socket, timeout)
            return _from_pod_resources(pod, resource, driver, held, served, socket)
        except CniError as exc:
            log.warning("%s; reading kubelet's device checkpoint instead", exc.msg)
    found = checkpoint.read(device_plugin_dir)
    if not found.pods and not found.registered:
        return None
    return _from_checkpoint(pod, resource, found, f"{device_plugin_dir}/{checkpoint.CHECKPOINT}")


def _from_pod_resources(
    pod: PodRef, resource: str, driver: str, held: Mapping[podresources.PodKey, podresources.PodAllocation],
    served: set[str], socket: str,
) -> DeviceHolders:
    me = (pod.namespace, pod.name)
    mine = _ids_of(held.get(me), resource, driver)
    others: dict[str, str] = {}
    for key, given in held.items():
        if key == me:
            continue
        for dev in _ids_of(given, resource, driver):
            if dev not in mine:  # a DRA claim shared with this pod is this pod's too
                others.setdefault(dev, f"pod {key[0]}/{key[1]}")
    return DeviceHolders(resource, tuple(mine), others, resource in served or bool(others) or bool(mine),
                         f"kubelet PodResources ({socket})")  # fmt: skip


def _ids_of(given: podresources.PodAllocation | None, resource: str, driver: str) -> list[str]:
    if given is None:
        return []
    ids = list(given.devices.get(resource, []))
    ids += [c.device for c in given.of_driver(driver) if c.device not in ids]
    return ids


def _from_checkpoint(pod: PodRef, resource: str, found: checkpoint.Checkpoint, path: str) -> DeviceHolders:
    mine = list(found.pods.get(pod.uid, {}).get(resource, [])) if pod.uid else []
    others: dict[str, str] = {}
    for uid, given in found.pods.items():
        if uid == pod.uid:
            continue
        for dev in given.get(resource, []):
            others.setdefault(dev, f"pod UID {uid}")
    served = resource in found.registered or bool(others) or bool(mine)
    return DeviceHolders(resource, tuple(mine), others, served, f"kubelet's device checkpoint ({path})")
