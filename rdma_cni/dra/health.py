"""kubelet's device health stream (``DRAResourceHealth`` v1 and v1alpha1, ``NodeWatchResources``): the
health the device model gives each bond, as kubelet shows it in the pod status
(``allocatedResourcesStatus``) of the pods holding it.

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

from rdma_cni.deviceplugin.server import Board
from rdma_cni.devices.model import Snapshot
from rdma_cni.dra import names
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


def health_response(snap: Snapshot, node: str, pb: ModuleType, now: float) -> Any:
    by_id = names.device_names([(b.id, b.netdev) for b in snap.bonds])
    out = pb.NodeWatchResourcesResponse()
    for bond in snap.bonds:
        health = snap.health_of(bond.id)
        ok = health is not None and health.healthy
        out.devices.add(
            device=pb.DeviceIdentifier(pool_name=node, device_name=by_id[bond.id]),
            health=pb.HEALTHY if ok else pb.UNHEALTHY,
            last_updated_time=int(now),
            health_check_timeout_seconds=TIMEOUT_S,
            message="" if ok or health is None else health.reason,
        )
    return out


def watch(board: Board, node: str, pb: ModuleType, context: grpc.ServicerContext) -> Iterator[Any]:
    context.add_callback(board.poke)  # a cancelled client wakes the stream at once
    seen, snap = board.current()
    sent = time.monotonic()
    if isinstance(snap, Snapshot):
        yield health_response(snap, node, pb, time.time())
    while context.is_active():
        newer = board.wait_newer(seen, POLL_S)
        if newer is not None:
            seen, snap = newer
        elif time.monotonic() - sent < RESEND_S:
            continue
        if isinstance(snap, Snapshot):
            sent = time.monotonic()
            yield health_response(snap, node, pb, time.time())


class HealthV1(drahealth_v1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, board: Board, node: str) -> None:
        self._board, self._node = board, node

    def NodeWatchResources(
        self, request: drahealth_v1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[drahealth_v1_pb2.NodeWatchResourcesResponse]:
        return watch(self._board, self._node, drahealth_v1_pb2, context)


class HealthV1alpha1(drahealth_v1alpha1_pb2_grpc.DRAResourceHealthServicer):
    def __init__(self, board: Board, node: str) -> None:
        self._board, self._node = board, node

    def NodeWatchResources(
        self, request: drahealth_v1alpha1_pb2.NodeWatchResourcesRequest, context: grpc.ServicerContext
    ) -> Iterator[drahealth_v1alpha1_pb2.NodeWatchResourcesResponse]:
        return watch(self._board, self._node, drahealth_v1alpha1_pb2, context)


def add_to_server(board: Board, node: str, server: grpc.Server) -> None:
    drahealth_v1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1(board, node), server)
    drahealth_v1alpha1_pb2_grpc.add_DRAResourceHealthServicer_to_server(HealthV1alpha1(board, node), server)
