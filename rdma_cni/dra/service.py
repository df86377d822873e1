"""kubelet's gRPC services of a DRA plugin, carrying :class:`~rdma_cni.dra.driver.Driver`'s answers.

- ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` and its ``v1beta1`` twin (kubelet >= 1.34 speaks v1,
  older ones v1beta1; the messages are the same but v1's ``share_id``): every claim kubelet named gets
  an entry in the answer (a missing one is retried), a claim that failed carries its error text,
  ``<gRPC code>: <sentence>``, made here from the driver's :class:`~rdma_cni.dra.driver.ClaimError`;
- ``DRAResourceHealth`` v1 and v1alpha1 on the same socket (:mod:`.health`), when given the board;
- ``pluginregistration.Registration`` on the registration socket: ``GetInfo`` says type ``DRAPlugin``,
  the driver's name, the DRA socket's path and the services above (``v1.DRAPlugin``,
  ``v1beta1.DRAPlugin``, then ``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``: kubelet picks
  the newest of each it knows, as k8s.io/dynamic-resource-allocation's kubeletplugin advertises them);
  ``NotifyRegistrationStatus`` is kubelet saying whether it took us.

    server = serve_dra(driver, "/var/lib/kubelet/plugins/rdma.tke.cloud.tencent.com/dra.sock")
    reg = serve_registration(Registration(dra_socket), "/var/lib/kubelet/plugins_registry/...-reg.sock")
"""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from types import ModuleType
from typing import Any

import grpc

from rdma_cni.dra import health, names
from rdma_cni.dra.driver import ClaimError, ClaimRef, Driver
from rdma_cni.dra.table import Source
from rdma_cni.kube import sockets
from rdma_cni.proto import dra_v1_pb2, dra_v1_pb2_grpc, dra_v1beta1_pb2, dra_v1beta1_pb2_grpc
from rdma_cni.proto import pluginregistration_v1_pb2 as reg_pb
from rdma_cni.proto import pluginregistration_v1_pb2_grpc as reg_grpc

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # k8s.io/kubelet pkg/apis/dra/*/types.go DRAPluginService
WORKERS = 8


def _error_text(e: ClaimError) -> str:
    return f"{e.code.name}: {e.message}"


def _refs(request: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]


def prepare_response(driver: Driver, request: Any, pb: ModuleType) -> Any:
    """One NodePrepareResources answer in the message types of ``pb`` (v1 or v1beta1)."""
    out = pb.NodePrepareResourcesResponse()
    v1 = pb is dra_v1_pb2
    for uid, result in driver.prepare(_refs(request)).items():
        entry = out.claims[uid]
        if isinstance(result, ClaimError):
            entry.error = _error_text(result)
            continue
        for d in result:
            dev = entry.devices.add(request_names=[d.request], pool_name=d.pool, device_name=d.device,
                                    cdi_device_ids=list(d.cdi_ids))
            if v1 and d.share_id:
                dev.share_id = d.share_id
    return out


def unprepare_response(driver: Driver, request: Any, pb: ModuleType) -> Any:
    out = pb.NodeUnprepareResourcesResponse()
    for uid, error in driver.unprepare(_refs(request)).items():
        entry = out.claims[uid]
        if error is not None:
            entry.error = _error_text(error)
    return out


class DraV1(dra_v1_pb2_grpc.DRAPluginServicer):
    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    def NodePrepareResources(self, request: dra_v1_pb2.NodePrepareResourcesRequest,
                             context: grpc.ServicerContext) -> dra_v1_pb2.NodePrepareResourcesResponse:
        resp: dra_v1_pb2.NodePrepareResourcesResponse = prepare_response(self._driver, request, dra_v1_pb2)
        return resp

    def NodeUnprepareResources(self, request: dra_v1_pb2.NodeUnprepareResourcesRequest,
                               context: grpc.ServicerContext) -> dra_v1_pb2.NodeUnprepareResourcesResponse:
        resp: dra_v1_pb2.NodeUnprepareResourcesResponse = unprepare_response(
            self._driver, request, dra_v1_pb2)
        return resp


class DraV1beta1(dra_v1beta1_pb2_grpc.DRAPluginServicer):
    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    def NodePrepareResources(self, request: dra_v1beta1_pb2.NodePrepareResourcesRequest,
                             context: grpc.ServicerContext) -> dra_v1beta1_pb2.NodePrepareResourcesResponse:
        resp: dra_v1beta1_pb2.NodePrepareResourcesResponse = prepare_response(
            self._driver, request, dra_v1beta1_pb2)
        return resp

    def NodeUnprepareResources(
        self, request: dra_v1beta1_pb2.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra_v1beta1_pb2.NodeUnprepareResourcesResponse:
        resp: dra_v1beta1_pb2.NodeUnprepareResourcesResponse = unprepare_response(
            self._driver, request, dra_v1beta1_pb2)
        return resp


class Registration(reg_grpc.RegistrationServicer):
    """What kubelet's plugin watcher asks on the ``-reg.sock``. ``registered`` is set once kubelet says
    it took the plugin (and cleared when it says it did not)."""

    def __init__(self, dra_socket: str, with_health: bool = False) -> None:
        self._endpoint = dra_socket
        self._services = [*SERVICES, *(health.SERVICES if with_health else ())]
        self.registered = threading.Event()
        self.last_error = ""

    def GetInfo(self, request: reg_pb.InfoRequest, context: grpc.ServicerContext) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(type=DRA_PLUGIN_TYPE, name=names.DRIVER, endpoint=self._endpoint,
                                 supported_versions=self._services)

    def NotifyRegistrationStatus(self, request: reg_pb.RegistrationStatus,
                                 context: grpc.ServicerContext) -> reg_pb.RegistrationStatusResponse:
        if request.plugin_registered:
            log.info("kubelet registered %s (DRA socket %s)", names.DRIVER, self._endpoint)
            self.last_error = ""
            self.registered.set()
        else:
            log.error("kubelet did not register %s: %s", names.DRIVER, request.error)
            self.last_error = request.error
            self.registered.clear()
        return reg_pb.RegistrationStatusResponse()


def _server(prefix: str) -> grpc.Server:
    return grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix=prefix))


def serve_dra(driver: Driver, socket_path: str, board: Source | None = None) -> grpc.Server:
    """Both DRA service versions on ``socket_path`` and, given the board, the health stream
    (:mod:`.health`) beside them (RuntimeError when it cannot bind)."""
    server = _server("dra-grpc")
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(DraV1(driver), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(DraV1beta1(driver), server)
    if board is not None:
        health.add_to_server(board, driver.node, server)
    server.add_insecure_port(f"unix:{socket_path}")
    sockets.make_private(socket_path)  # before start(): only kubelet (root) may prepare a claim
    server.start()
    return server


def serve_registration(registration: Registration, socket_path: str) -> grpc.Server:
    server = _server("dra-reg")
    reg_grpc.add_RegistrationServicer_to_server(registration, server)
    server.add_insecure_port(f"unix:{socket_path}")
    sockets.make_private(socket_path)  # before start(): only kubelet (root) may ask for its info
    server.start()
    return server
