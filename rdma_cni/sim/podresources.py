"""A simulated kubelet's PodResources server: the real v1 API (generated from rdma_cni/proto) over gRPC
on a real unix socket, answering from what the test (or the demo) says kubelet allocated.

No kubelet can run here, so this stands in for the one part of it the CNI side talks to (the tests
import it as ``tests/podresources_server``; the demo attaches it to the simulated kubelet,
:class:`~rdma_cni.sim.kubelet.TestKubelet`). It behaves like kubelet where the client can tell:
``Get`` of an unknown pod is an error (UNKNOWN, kubelet's plain ``fmt.Errorf``), ``get="disabled"``
answers like a kubelet with the ``KubeletPodResourcesGet`` gate off (1.27-1.33 default: UNKNOWN
"PodResources API Get method disabled"), ``get="absent"`` like one from before 1.27 (no such method:
UNIMPLEMENTED), and ``malformed=True`` answers every call with bytes that are not a protobuf
message. Every call is recorded in ``calls`` by its method name.

    with PodResourcesServer(sock) as kubelet:
        kubelet.set_pod("default", "ibv-app-0", {"trainer": {RESOURCE: ["mlx5_bond_1", "mlx5_bond_3"]}})
        kubelet.set_allocatable(RESOURCE, {"mlx5_bond_0": 0, "mlx5_bond_1": 0})
        # a DRA pod: its containers' claims (ContainerResources.dynamic_resources), as kubelet >= 1.34
        kubelet.set_pod("default", "dra-0", {"trainer": {}},
                        claims={"trainer": [claim("default", "rdma", device(DRIVER, "node-1", "bond1"))]})

A test kubelet that serves other APIs too adds this one to its own server: ``add_to(server)``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from typing import Any

import grpc

from rdma_cni.proto import podresources_v1_pb2 as pb

SERVICE = "v1.PodResourcesLister"
GET_DISABLED = "PodResources API Get method disabled"  # what kubelet answers with the gate off


def device(driver: str, pool: str, name: str, share_id: str | None = None) -> pb.ClaimResource:
    """One prepared device of a claim, as kubelet reports it (``share_id``: a shared allocation)."""
    cdi = [pb.CDIDevice(name=f"{driver}/bond={pool}-{name}")]
    return pb.ClaimResource(cdi_devices=cdi, driver_name=driver, pool_name=pool, device_name=name,
                            share_id=share_id)  # fmt: skip


def claim(namespace: str, name: str, *devices: pb.ClaimResource) -> pb.DynamicResource:
    """One claim of a container (a KEP-5004 extended-resource claim is one too, by its own name)."""
    return pb.DynamicResource(claim_namespace=namespace, claim_name=name, claim_resources=devices)


class PodResourcesServer:
    def __init__(self, socket: str, get: str = "enabled", malformed: bool = False) -> None:
        if get not in ("enabled", "disabled", "absent"):
            raise ValueError(f"get must be enabled, disabled or absent, not {get!r}")
        self.socket = socket
        self.get = get
        self.malformed = malformed
        self.calls: list[str] = []
        # (namespace, name) -> container -> resource -> device IDs, in pod-spec order
        self._pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self._claims: dict[tuple[str, str], dict[str, list[pb.DynamicResource]]] = {}  # container -> claims
        self._allocatable: dict[str, dict[str, tuple[int, ...]]] = {}  # resource -> device -> NUMA
        self._numa: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None

    # ------------------------------------------------------------ what kubelet allocated
    def set_pod(
        self,
        namespace: str,
        name: str,
        containers: Mapping[str, Mapping[str, Sequence[str]]],
        claims: Mapping[str, Sequence[pb.DynamicResource]] | None = None,
    ) -> None:
        """``containers``: container -> resource -> device IDs; ``claims``: container -> the DRA
        claims kubelet reports for it (:func:`claim`), every container listed in ``containers``."""
        with self._lock:
            self._pods[(namespace, name)] = {c: {r: list(ids) for r, ids in res.items()}
                                             for c, res in containers.items()}  # fmt: skip
            self._claims[(namespace, name)] = {c: list(found) for c, found in (claims or {}).items()}

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pods.pop((namespace, name), None)
            self._claims.pop((namespace, name), None)

    def set_allocatable(self, resource: str, devices: Mapping[str, int | tuple[int, ...] | None]) -> None:
        """``devices``: ID -> NUMA node, or the nodes of a device on several (None: no topology, like
        a device with numa_node -1)."""
        nodes = {dev: _nodes(numa) for dev, numa in devices.items()}
        with self._lock:
            self._allocatable[resource] = nodes
            self._numa.update(nodes)

    # ------------------------------------------------------------ serving
    def add_to(self, server: grpc.Server) -> None:
        alloc = self._handler(
            "GetAllocatableResources", self._allocatable_resources, pb.AllocatableResourcesRequest
        )
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "List": self._handler("List", self._list, pb.ListPodResourcesRequest),
            "GetAllocatableResources": alloc,
        }
        if self.get != "absent":
            handlers["Get"] = self._handler("Get", self._get, pb.GetPodResourcesRequest)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    def start(self) -> PodResourcesServer:
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.add_to(server)
        if server.add_insecure_port(f"unix://{self.socket}") == 0:
            raise RuntimeError(f"cannot listen on {self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if os.path.exists(self.socket):
            os.unlink(self.socket)

    def __enter__(self) -> PodResourcesServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ the API
    def _handler(self, method: str, body: Any, request_type: Any) -> grpc.RpcMethodHandler[Any, Any]:
        def respond(raw: bytes, context: grpc.ServicerContext) -> bytes:
            self.calls.append(method)
            request = request_type.FromString(raw)
            if self.malformed:
                return b"\xff\xff\xff\xff not a protobuf message"
            answer: Any = body(request, context)
            return bytes(answer.SerializeToString())

        return grpc.unary_unary_rpc_method_handler(respond)

    def _containers(self, pod: tuple[str, str]) -> list[pb.ContainerResources]:
        out = []
        claims = self._claims.get(pod, {})
        for cname, resources in self._pods[pod].items():
            devices = [pb.ContainerDevices(resource_name=r, device_ids=ids, topology=self._topology(ids))
                       for r, ids in resources.items()]  # fmt: skip
            dra = claims.get(cname, [])
            out.append(pb.ContainerResources(name=cname, devices=devices, dynamic_resources=dra))
        return out

    def _topology(self, ids: Sequence[str]) -> pb.TopologyInfo | None:
        nodes = sorted({n for i in ids for n in self._numa.get(i, ())})
        return pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in nodes]) if nodes else None

    def _list(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        with self._lock:
            pods = [pb.PodResources(name=name, namespace=ns, containers=self._containers((ns, name)))
                    for ns, name in self._pods]  # fmt: skip
        return pb.ListPodResourcesResponse(pod_resources=pods)

    def _get(self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        if self.get == "disabled":
            context.abort(grpc.StatusCode.UNKNOWN, GET_DISABLED)
        with self._lock:
            key = (request.pod_namespace, request.pod_name)
            if key not in self._pods:
                why = f"pod {request.pod_name} in namespace {request.pod_namespace} not found"
                context.abort(grpc.StatusCode.UNKNOWN, why)
            pod = pb.PodResources(name=request.pod_name, namespace=request.pod_namespace,
                                  containers=self._containers(key))  # fmt: skip
        return pb.GetPodResourcesResponse(pod_resources=pod)

    def _allocatable_resources(
        self, request: pb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> Any:
        with self._lock:
            devices = []
            for resource, ids in self._allocatable.items():
                for dev, nodes in ids.items():
                    devices += _per_numa_node(resource, dev, nodes)
        return pb.AllocatableResourcesResponse(devices=devices)


def _nodes(numa: int | tuple[int, ...] | None) -> tuple[int, ...]:
    if numa is None:
        return ()
    return (numa,) if isinstance(numa, int) else tuple(numa)


def _per_numa_node(resource: str, dev: str, nodes: tuple[int, ...]) -> list[Any]:
    """A device as kubelet's GetAllocatableResources lists it: once per NUMA node of its topology,
    each entry naming one node (devicemanager's containerDevicesFromResourceDeviceInstances), once
    without topology when it has none. A shared-mode virtual device on two nodes is two entries."""
    if not nodes:
        return [pb.ContainerDevices(resource_name=resource, device_ids=[dev])]
    return [pb.ContainerDevices(resource_name=resource, device_ids=[dev],
                                topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=n)]))
            for n in nodes]  # fmt: skip
