"""Which devices kubelet gave a pod, asked of kubelet's PodResources API v1 (gRPC on a unix socket).

``<podResourcesDir>/kubelet.sock`` (``<kubelet root>/pod-resources``: it follows kubelet's
``--root-dir``) serves ``/v1.PodResourcesLister/{List,Get,GetAllocatableResources}``. ``Get`` (one
pod) is beta and on by default only from Kubernetes 1.34; older kubelets answer it UNIMPLEMENTED
(before 1.27) or UNKNOWN "Get method disabled" (gate off), so any answer of Get but a transport
failure is retried as ``List`` (GA, every kubelet since 1.28), which is what Multus calls.

Why ``grpc`` is imported inside the calls and never at module level: this runs inside a CNI ADD (a
cold interpreter pays ~100 ms for grpc + protobuf, see the README), and rdma-agent forks its workers
from a warm parent that must not have gRPC's threads and descriptors when it forks. Importing this
module costs nothing; only a call does, and only in the process (worker) that makes it.

    ids = pod_devices(socket_path("/var/lib/kubelet/pod-resources"), "default", "ibv-app-0", 3.0)
    # {"tke.cloud.tencent.com/tke-shared-rdma": ["mlx5_bond_1", "mlx5_bond_3"]}, or None: no socket
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
    return None if pod is None else _devices_of(pod)


def list_pods(socket: str, timeout: float = DEFAULT_TIMEOUT) -> dict[PodKey, dict[str, list[str]]]:
    """Every pod kubelet knows -> its devices by resource (``List``); pods without devices included."""

    def ask(stub: PodResourcesListerStub, pb: Any) -> dict[PodKey, dict[str, list[str]]]:
        pods = stub.List(pb.ListPodResourcesRequest(), timeout=timeout).pod_resources
        return {(p.namespace, p.name): _devices_of(p) for p in pods}

    return _call(socket, timeout, "the pods' devices", ask)


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


def _devices_of(pod: pb.PodResources) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for container in pod.containers:
        for dev in container.devices:
            ids = out.setdefault(dev.resource_name, [])
            ids.extend(i for i in dev.device_ids if i not in ids)
    return out


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
