"""A rolling update's hand-over between two device plugin processes of one node, and what the
DaemonSet's readiness reads (the status file's ``registered``).

Real ``rdma-device-plugin`` processes in a node netns (tests/dpnode.py), real unix sockets, a kubelet
of the test's own where the test needs one that takes a registration and opens no stream, real
SIGTERM and kill -9.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from dpnode import RESOURCE, DpNode, dp_node, wait_for

from rdma_cni.proto import deviceplugin_v1beta1_pb2 as pb
from rdma_cni.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

pytestmark = pytest.mark.netns


def status(d: DpNode) -> dict[str, Any]:
    try:
        return d.status()
    except (OSError, ValueError):
        return {}


class LazyKubelet(pb_grpc.RegistrationServicer):
    """kubelet's Register (it dials the plugin and asks its options inside the call) without the
    ListAndWatch that kubelet then opens on its own: the test opens it when it wants."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.endpoints: list[str] = []
        self.done = threading.Event()

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        with grpc.insecure_channel(f"unix:{os.path.join(self.dir, request.endpoint)}") as channel:
            pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=10)
        self.endpoints.append(request.endpoint)
        self.done.set()
        return pb.Empty()


@pytest.fixture
def lazy() -> Iterator[tuple[DpNode, LazyKubelet]]:
    with dp_node(bonds=2, kubelet=False) as d:
        os.makedirs(d.kubelet.dir, mode=0o750, exist_ok=True)
        servicer = LazyKubelet(d.kubelet.dir)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix:{d.kubelet.socket}")
        server.start()
        try:
            yield d, servicer
        finally:
            server.stop(grace=0).wait(5)


def test_ready_only_once_kubelet_took_the_registration_and_streams_the_devices(
    lazy: tuple[DpNode, LazyKubelet],
) -> None:
    d, kubelet = lazy
    mine = os.path.join(d.n.tmp, "pod", "status.json")
    d.start("--pod-status", mine, wait=False)
    assert kubelet.done.wait(60), f"no registration: {d.log_tail()}"
    wait_for(lambda: len(status(d).get("devices", [])) == 2, 30, "the status file with both bonds")
    # kubelet took the registration and has no list from this plugin yet: not ready
    threading.Event().wait(1.5)
    doc = status(d)
    assert doc["registered"] is False, doc
    assert read(mine) == doc
    endpoint = kubelet.endpoints[-1]
    with grpc.insecure_channel(f"unix:{os.path.join(kubelet.dir, endpoint)}") as channel:
        stream = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
        first = next(stream)
        assert len(first.devices) == 2
        wait_for(lambda: status(d).get("registered") is True, 10, "registered once the stream sent its list")
        assert status(d)["endpoint"] == endpoint
        wait_for(lambda: read(mine).get("registered") is True, 5, "the pod's copy says so too")
        stream.cancel()


def read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            doc: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return {}
    return doc


def owner(d: DpNode) -> tuple[int, bool]:
    doc = status(d)
    return int(doc.get("pid", 0)), bool(doc.get("registered"))


def test_the_old_plugins_stop_leaves_the_new_ones_status_and_registration() -> None:
    with dp_node(bonds=2) as d:
        old_copy, new_copy = (os.path.join(d.n.tmp, pod, "status.json") for pod in ("old", "new"))
        old = d.start("--pod-status", old_copy)
        first = d.endpoint()
        wait_for(lambda: owner(d) == (old.pid, True), 30, "the old plugin registered")
        new = d.start("--pod-status", new_copy, previous=first)
        second = d.endpoint()
        wait_for(lambda: owner(d) == (new.pid, True), 30, "the new plugin's status")
        wait_for(lambda: read(new_copy).get("registered") is True, 10, "the new pod's own copy")
        assert read(new_copy)["pid"] == new.pid and read(old_copy)["pid"] == old.pid
        assert d.stop(old, signal.SIGTERM) == 0
        threading.Event().wait(1.0)
        assert owner(d) == (new.pid, True), status(d)  # the old one's "registered: false" not written
        assert read(old_copy)["registered"] is False  # its own pod's copy says it stopped
        assert d.kubelet.endpoints[RESOURCE] is second and second.live
        latest = second.latest()
        assert latest is not None and len(latest) == 2 and all(x.health == "Healthy" for x in latest)


def test_when_the_new_plugin_dies_the_old_one_registers_again_and_takes_the_status_back() -> None:
    with dp_node(bonds=2) as d:
        old = d.start()
        first = d.endpoint()
        new = d.start(previous=first)
        second = d.endpoint()
        wait_for(lambda: owner(d) == (new.pid, True), 30, "the new plugin's status")
        os.kill(new.pid, signal.SIGKILL)
        new.wait(10)
        third = d.kubelet.wait_endpoint(RESOURCE, newer_than=second, timeout=30)
        wait_for(lambda: owner(d) == (old.pid, True), 30, "the old plugin's status again")
        assert status(d)["endpoint"] == third.endpoint
