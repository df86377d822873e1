"""Which devices kubelet gave a pod, asked of kubelet's PodResources API v1 (gRPC on a unix socket).

``<podResourcesDir>/kubelet.sock`` (``<kubelet root>/pod-resources``: it follows kubelet's
``--root-dir``) serves ``/v1.PodResourcesLister/{List,Get,GetAllocatableResources}``. ``Get`` (one
pod) is beta and on by default only from Kubernetes 1.34; older kubelets answer it UNIMPLEMENTED
(before 1.27) or UNKNOWN "Get method disabled" (gate off), so any answer of Get but a transport
failure is retried as ``List`` (GA, every kubelet since 1.28), which is what Multus calls.

Why ``grpc`` is imported inside the calls and never at module level: this runs inside a CNI ADD (a
cold interpreter pays ~100 ms for grpc + protobuf, see docs/benchmarks.md), and rdma-agent forks its workers
from a warm parent that must not have gRPC's threads and descriptors when it forks. Importing this
module costs nothing; only a call does, and only in the process (worker) that makes it.

    ids = pod_devices(socket_path("/var/lib/kubelet/pod-resources"), "default", "ibv-app-0", 3.0)
    # {"tke.cloud.tencent.com/tke-shared-rdma": ["mlx5_bond_1", "mlx5_bond_3"]}, or None: no socket
    got = pod_allocation(socket_path("/var/lib/kubelet/pod-resources"), "default", "ibv-app-0")
    got.claims  # (ClaimDevice("default", "rdma", "rdma.tke.cloud.tencent.com", "node-1", "bond1", ""), ...)

DRA devices (``ContainerResources.dynamic_resources``, GA with DRA in 1.34). What kubelet 1.37.2 puts
there, read in k8s.io/kubernetes@v1.37.2:

- ``pkg/kubelet/cm/container_manager_linux.go`` ``GetDynamicResources``: for each claim a container
  uses, one ``DynamicResource{claim_name, claim_namespace}`` with one ``ClaimResource{driver_name,
  pool_name, device_name, share_id, cdi_devices}`` per prepared device, from kubelet's claim cache
  (what the drivers' NodePrepareResources answered). Its ``cdi_devices`` slice is shared across the
  devices of one driver, so a later device also lists the earlier ones' CDI IDs: the device is
  known by ``device_name`` only, never by its CDI IDs.
- ``pkg/kubelet/cm/dra/manager.go`` ``GetContainerClaimInfos``: the claims a container uses are
  those of ``pod.spec.resourceClaims`` that the container names in ``resources.claims`` (a claim no
  container names is prepared but not reported), plus, with ``DRAExtendedResource`` (GA and locked
  in 1.37), **the special claim of KEP-5004**: a pod asking for an extended resource served by a
  DeviceClass's ``extendedResourceName`` (``tke.cloud.tencent.com/tke-shared-rdma: 4``, unchanged)
  gets one claim for all such resources, named ``pod.status.extendedResourceClaimStatus
  .resourceClaimName`` (the scheduler creates it with ``generateName: <pod name>-extended-resources-``,
  ``pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go``), reported as a
  ``DynamicResource`` of that name in every container its ``requestMappings`` name — never as
  ``devices`` under the resource name: ``pkg/kubelet/cm/devicemanager/manager.go`` skips a
  DRA-backed extended resource (``isDRAExtendedResource``), so the device manager, and with it
  ``ContainerDevices``, never holds it.

So a pod's DRA devices are the union of every container's claim resources, each claim once
whichever containers share it (:class:`PodAllocation` ``claims``).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from rdma_cni.cni.errors import KUBE_API_FAILURE, CniError

if TYPE_CHECKING:
    from rdma_cni.proto import podresources_v1_pb2 as pb
    from rdma_cni.proto.podresources_v1_pb2_grpc import PodResourcesListerStub

log = logging.getLogger("rdma_cni.kube")

SOCKET_NAME = "kubelet.sock"
DEFAULT_TIMEOUT = 3.0  # seconds per call: kubelet answers from memory in well under 10 ms
MAX_MESSAGE = 16 * 1024 * 1024  # a node with many pods: the same limit Multus uses for List

_T = TypeVar("_T")
PodKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Allocatable:
    """One device kubelet can hand out (GetAllocatableResources), with the NUMA nodes it reported."""

    resource: str
    device_id: str
    numa: tuple[int, ...]


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a DRA claim kubelet prepared for the pod (PodResources ``ClaimResource``, or
    kubelet's DRA checkpoint): which claim, which driver, and the device by pool and name."""

    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    share_id: str = ""  # the allocation's share of a multi-allocatable device; "" for a whole device


@dataclass(frozen=True)
class PodAllocation:
    """Everything kubelet allocated to one pod: device-plugin IDs by resource, and DRA devices."""

    devices: dict[str, list[str]]
    claims: tuple[ClaimDevice, ...] = ()

    def of_driver(self, driver: str) -> list[ClaimDevice]:
        return [c for c in self.claims if c.driver == driver]


def socket_path(pod_resources_dir: str) -> str:
    return os.path.join(pod_resources_dir, SOCKET_NAME)


def available(socket: str) -> bool:
    """True when ``socket`` exists as a socket: no socket means no PodResources on this node (or its
    directory is not mounted), which callers treat as "ask the checkpoint" rather than an error."""
    try:
        return stat.S_ISSOCK(os.stat(socket).st_mode)
    except OSError:
        return False


def pod_devices(socket: str, namespace: str, name: str, timeout: float = DEFAULT_TIMEOUT) -> (
    dict[str, list[str]] | None
):  # fmt: skip
    """Resource name -> device IDs kubelet allocated to the pod (every container, in order, each ID
    once); None when the socket is absent or kubelet does not know the pod. Raises CniError
    (KUBE_API_FAILURE) naming the socket and what to check when kubelet cannot be asked."""
    got = pod_allocation(socket, namespace, name, timeout)
    return None if got is None else got.devices


def pod_allocation(socket: str, namespace: str, name: str, timeout: float = DEFAULT_TIMEOUT) -> (
    PodAllocation | None
):  # fmt: skip
    """The pod's device-plugin devices (as :func:`pod_devices`) and DRA claim devices, from one
    question to kubelet; None when the socket is absent or kubelet does not know the pod."""
    if not available(socket):
        return None

    def ask(stub: PodResourcesListerStub, pb: Any) -> pb.PodResources | None:
        import grpc

        try:
            got = stub.Get(pb.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace), timeout=timeout)
            return got.pod_resources if got.HasField("pod_resources") else None
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            log.debug(
                "PodResources Get %s/%s: %s %s; asking List", namespace, name, exc.code(), exc.details()
            )
        for pod in stub.List(pb.ListPodResourcesRequest(), timeout=timeout).pod_resources:
            if pod.namespace == namespace and pod.name == name:
                return pod
        return None

    pod = _call(socket, timeout, f"the devices of pod {namespace}/{name}", ask)
    return None if pod is None else PodAllocation(_devices_of(pod), _claims_of(pod))


def list_pods(socket: str, timeout: float = DEFAULT_TIMEOUT) -> dict[PodKey, dict[str, list[str]]]:
    """Every pod kubelet knows -> its devices by resource (``List``); pods without devices included."""

    def ask(stub: PodResourcesListerStub, pb: Any) -> dict[PodKey, dict[str, list[str]]]:
        pods = stub.List(pb.ListPodResourcesRequest(), timeout=timeout).pod_resources
        return {(p.namespace, p.name): _devices_of(p) for p in pods}

    return _call(socket, timeout, "the pods' devices", ask)


@dataclass(frozen=True)
class ContainerAllocation:
    """What kubelet allocated to one container of a pod (its own devices and claims only)."""

    pod: PodKey
    container: str
    given: PodAllocation


def list_containers(socket: str, timeout: float = DEFAULT_TIMEOUT) -> list[ContainerAllocation]:
    """Every container of every pod kubelet knows, each with its device-plugin devices and DRA
    devices (``List``): per container, because two containers of one pod may hold different GPUs
    and NICs (``cni-tool doctor --pods`` judges each container's pairs)."""

    def ask(stub: PodResourcesListerStub, pb: Any) -> list[ContainerAllocation]:
        out = []
        for p in stub.List(pb.ListPodResourcesRequest(), timeout=timeout).pod_resources:
            for c in p.containers:
                one = pb.PodResources(name=p.name, namespace=p.namespace, containers=[c])
                given = PodAllocation(_devices_of(one), _claims_of(one))
                out.append(ContainerAllocation((p.namespace, p.name), c.name, given))
        return out

    return _call(socket, timeout, "the containers' devices", ask)


def allocatable(socket: str, timeout: float = DEFAULT_TIMEOUT) -> list[Allocatable]:
    """Every device kubelet can allocate (healthy ones only: kubelet's allocatable), with NUMA."""

    def ask(stub: PodResourcesListerStub, pb: Any) -> list[Allocatable]:
        got = stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=timeout)
        return [
            Allocatable(d.resource_name, dev, tuple(n.ID for n in d.topology.nodes))
            for d in got.devices
            for dev in d.device_ids
        ]

    return _call(socket, timeout, "the allocatable devices", ask)


def node_allocations(socket: str, timeout: float = DEFAULT_TIMEOUT) -> (
    tuple[dict[PodKey, PodAllocation], set[str]]
):  # fmt: skip
    """Every pod kubelet knows with all it allocated to it (``List``), and the resources kubelet
    can allocate on this node (``GetAllocatableResources``): one channel for both, because a CNI
    plugin that picks a device itself must know both who holds what and whether the resource is
    kubelet's to hand out at all."""

    def ask(stub: PodResourcesListerStub, pb: Any) -> tuple[dict[PodKey, PodAllocation], set[str]]:
        pods = stub.List(pb.ListPodResourcesRequest(), timeout=timeout).pod_resources
        held = {(p.namespace, p.name): PodAllocation(_devices_of(p), _claims_of(p)) for p in pods}
        served = stub.GetAllocatableResources(pb.AllocatableResourcesRequest(), timeout=timeout)
        return held, {d.resource_name for d in served.devices}

    return _call(socket, timeout, "which pod holds which device", ask)


def _devices_of(pod: pb.PodResources) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for container in pod.containers:
        for dev in container.devices:
            ids = out.setdefault(dev.resource_name, [])
            ids.extend(i for i in dev.device_ids if i not in ids)
    return out


def _claims_of(pod: pb.PodResources) -> tuple[ClaimDevice, ...]:
    """Every container's DRA devices, each once: a claim shared by several containers (or the
    extended-resource claim, reported in each container that asked for the resource) is reported
    whole in each of them."""
    out: dict[ClaimDevice, None] = {}
    for container in pod.containers:
        for claim in container.dynamic_resources:
            for res in claim.claim_resources:
                share = res.share_id if res.HasField("share_id") else ""
                key = ClaimDevice(claim.claim_namespace, claim.claim_name, res.driver_name, res.pool_name,
                                  res.device_name, share)  # fmt: skip
                out.setdefault(key, None)
    return tuple(out)


def _call(socket: str, timeout: float, what: str, ask: Callable[[PodResourcesListerStub, Any], _T]) -> _T:
    """One channel for one question, closed before returning (no gRPC connection outlives the call);
    every gRPC failure becomes one CniError sentence naming the socket and the likely fix."""
    # Here, not at the top: grpc and the generated stubs cost ~100 ms (python -X importtime), paid
    # only by a call that reaches a live PodResources socket (available() is a stat).
    import grpc

    from rdma_cni.proto import podresources_v1_pb2 as pb
    from rdma_cni.proto import podresources_v1_pb2_grpc as pb_grpc

    options = [("grpc.max_receive_message_length", MAX_MESSAGE), ("grpc.enable_http_proxy", 0)]
    threads = _threads()
    try:
        with grpc.insecure_channel(f"unix://{socket}", options=options) as channel:
            return ask(pb_grpc.PodResourcesListerStub(channel), pb)
    except grpc.RpcError as exc:
        raise CniError(KUBE_API_FAILURE, _explain(socket, timeout, what, exc)) from exc
    finally:
        _wait_for_threads(threads)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _wait_for_threads(before: int, limit: float = 1.0) -> None:
    """gRPC's core stops the threads (and their descriptors) of a closed channel a few ms later, on
    its own. Wait for that: an rdma-agent worker serves its next call only from a single-threaded
    process with no descriptor left behind (``setns`` into a mount namespace needs one thread)."""
    deadline = time.monotonic() + limit
    while _threads() > before and time.monotonic() < deadline:
        time.sleep(0.002)
    if _threads() > before:
        log.debug("gRPC threads still running %.1f s after the channel closed", limit)


def _explain(socket: str, timeout: float, what: str, exc: Any) -> str:
    import grpc

    code, details = exc.code(), exc.details() or ""
    head = f"kubelet PodResources ({socket}) could not tell {what}"
    if code == grpc.StatusCode.UNAVAILABLE:
        return (
            f"{head}: nothing answers there ({details}); is kubelet running, and is podResourcesDir the "
            "pod-resources directory of kubelet's --root-dir?"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{head}: no answer within {timeout:g} s; kubelet may be overloaded or restarting"
    if code == grpc.StatusCode.INTERNAL and "deserializ" in details.lower():
        return f"{head}: the answer is not a PodResources v1 message ({details}); is that socket kubelet's?"
    return f"{head}: {code.name} {details}".rstrip()
