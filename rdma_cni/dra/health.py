"""kubelet's device health stream (``DRAResourceHealth`` v1 and v1alpha1, ``NodeWatchResources``): the
health the device model gives each device of the driver's table (:mod:`.table`: a bond's, or a pool
member HCA's), as kubelet shows it in the pod status (``allocatedResourcesStatus``) of the pods
holding it.

The stream sends every device at once, then again on every change the health watch publishes to the
board, and at least every ``RESEND_S`` seconds: kubelet marks a device Unknown when its last report
is older than ``health_check_timeout_seconds``. It never ends while the driver runs; a cancelled
client (kubelet gone) ends it within ``POLL_S``.

    for resp in watch(board, "node-a", drahealth_v1_pb2, context): ...
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import grpc

from rdma_cni.dra.table import DeviceTable, Source, as_table
from rdma_cni.proto import (
    drahealth_v1_pb2,
    drahealth_v1_pb2_grpc,
    drahealth_v1alpha1_pb2,
    drahealth_v1alpha1_pb2_grpc,
)

SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")  # k8s.io/kubelet dra-health/*/types.go
RESEND_S = 10.0
TIMEOUT_S = 30  # three missed resends before kubelet calls a device Unknown
POLL_S = 0.5


def health_response(table: DeviceTable, node: str, pb: ModuleType, now: float) -> Any:
    out = pb.NodeWatchResourcesResponse()
    for dev in table.devices:
        ok = dev.health.healthy
        out.devices.add(
            device=pb.DeviceIdentifier(pool_name=node, device_name=dev.name),
            health=pb.HEALTHY if ok else pb.UNHEALTHY,
            last_updated_time=int(now),
            health_check_timeout_seconds=TIMEOUT_S,
            message="" if ok else dev.health.reason,
        )
    return out


def watch(board: Source, node: str, pb: ModuleType, context: grpc.ServicerContext) -> Iterator[Any]:
    context.add_callback(board.poke)  # a cancelled client wakes the stream at once
    seen, value = board.current()
    sent = time.monotonic()
    table = as_table(value)
    if table is not None:
        yield health_response(table, node, pb, time.time())
    while context.is_active():
        newer = board.wait_newer(seen, POLL_S)
        if newer is not None:
            seen, value = newer
            table = as_table(value)
        elif time.monotonic() - sent < RESEND_S:
            continue
        if table is not None:
            sent = time.monotonic()
            yield health_response(table, node, pb, time.time())


class HealthV1(drahealth_v1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, board: Source, node: str) -> None:
        self._board, self._node = board, node

    def NodeWatchResources(
        self, request: drahealth_v1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[drahealth_v1_pb2.NodeWatchResourcesResponse]:
        return watch(self._board, self._node, drahealth_v1_pb2, context)


class HealthV1alpha1(drahealth_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, board: Source, node: str) -> None:
        self._board, self._node = board, node

    def NodeWatchResources(
        self, request: drahealth_v1alpha1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[drahealth_v1alpha1_pb2.NodeWatchResourcesResponse]:
        return watch(self._board, self._node, drahealth_v1alpha1_pb2, context)


def add_to_server(board: Source, node: str, server: grpc.Server) -> None:
    drahealth_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1(board, node), server)
    drahealth_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1alpha1(board, node), server)
