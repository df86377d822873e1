"""A simulated kubelet: the device manager's side of the v1beta1 device plugin API, on real unix sockets.

No registry reachable here ships a kubelet, so this one follows kubelet's code as
deviceplugin-facts.md 1.4-1.6 describes it, not a convenient subset:

- at start it makes the socket dir (0750) and runs CleanupPluginDirectory (every file but
  ``kubelet_internal_checkpoint`` removed), then serves ``v1beta1.Registration`` on ``kubelet.sock``;
- ``Register`` checks the version (only ``v1beta1``) and that the resource is an extended resource
  name, then, *inside the call*, dials ``<dir>/<endpoint>`` (blocking, 10 s) and calls
  ``GetDevicePluginOptions``; only then does it answer, and start ListAndWatch on its own thread;
- a newer registration of the same resource replaces the older endpoint (its stream is cancelled);
- every ListAndWatch message is recorded with its arrival time; when a stream ends the endpoint is
  stopped (kubelet never re-dials: the plugin must register again);
- ``restart()`` is a kubelet restart: the process's connections die, the directory is cleaned
  (the plugin's socket is deleted) and ``kubelet.sock`` is created anew;
- GetPreferredAllocation and Allocate are called on request, as admission would.

A PodResources server can be attached (``pod_resources=``: a function that adds its servicer to a
``grpc.Server``); it is then served on ``<root>/pod-resources/kubelet.sock``.

The tests and the demo (``scripts/demo``) drive the real plugin process against it.

    with TestKubelet(tmp_path / "kubelet") as kubelet:
        ... start the plugin with --kubelet-root-dir <that> ...
        ep = kubelet.wait_endpoint("tke.cloud.tencent.com/tke-shared-rdma")
        devices = ep.wait_list(lambda devs: len(devs) == 8)
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from rdma_cni.proto import deviceplugin_v1beta1_pb2 as pb
from rdma_cni.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

SUPPORTED_VERSIONS = ("v1beta1",)
CHECKPOINT = "kubelet_internal_checkpoint"
DIAL_TIMEOUT_S = 10.0
_QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_extended_resource_name(name: str) -> bool:
    """kubelet's v1helper.IsExtendedResourceName: not native (has a '/' and is outside kubernetes.io),
    not 'requests.'-prefixed, and 'requests.<name>' is a qualified name (DNS prefix / 63-char name)."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, short = ("requests." + name).partition("/")
    return (len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.match(prefix))
            and len(short) <= 63 and bool(_QUALIFIED_NAME.match(short)))


@dataclass(frozen=True)
class Dev:
    """A device as kubelet sees it in one ListAndWatch message."""

    id: str
    health: str
    numa: tuple[int, ...]


@dataclass
class Endpoint:
    """One registered plugin: its connection, options and every list it sent."""

    resource: str
    endpoint: str
    channel: grpc.Channel
    options: pb.DevicePluginOptions
    registered_at: float
    lists: list[tuple[float, list[Dev]]] = field(default_factory=list)
    stream_error: str | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stream: Any = None
    _thread: threading.Thread | None = None
    ended: bool = False

    @property
    def stub(self) -> pb_grpc.DevicePluginStub:
        return pb_grpc.DevicePluginStub(self.channel)

    # --------------------------------------------------------------- the stream
    def start_stream(self) -> None:
        self._stream = self.stub.ListAndWatch(pb.Empty())
        self._thread = threading.Thread(target=self._read, name=f"law-{self.endpoint}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for msg in self._stream:
                devs = [Dev(d.ID, d.health, tuple(n.ID for n in d.topology.nodes)) for d in msg.devices]
                with self._cond:
                    self.lists.append((time.monotonic(), devs))
                    self._cond.notify_all()
        except grpc.RpcError as e:
            with self._cond:
                self.stream_error = f"{e.code()}: {e.details()}"
        finally:
            with self._cond:
                self.ended = True
                self._cond.notify_all()

    @property
    def live(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """kubelet stops an endpoint: cancel the stream, close the connection."""
        if self._stream is not None:
            self._stream.cancel()
        self.channel.close()
        if self._thread is not None:
            self._thread.join(5)

    def latest(self) -> list[Dev] | None:
        with self._cond:
            return self.lists[-1][1] if self.lists else None

    def wait_list(self, pred: Callable[[list[Dev]], bool], timeout: float = 10.0,
                  after: int = 0) -> tuple[float, list[Dev]]:
        """The first list (from message number ``after`` on) that satisfies ``pred``: (arrival, devs)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for t, devs in self.lists[after:]:
                    if pred(devs):
                        return t, devs
                left = deadline - time.monotonic()
                if left <= 0 or self.ended:
                    raise AssertionError(f"no matching list from {self.endpoint} within {timeout}s "
                                         f"(ended={self.ended}, error={self.stream_error}); last: "
                                         f"{self.lists[-1][1] if self.lists else None}")
                self._cond.wait(left)

    # --------------------------------------------------------------- admission
    def allocate(self, *containers: list[str], timeout: float = 10.0) -> pb.AllocateResponse:
        req = pb.AllocateRequest()
        for ids in containers:
            req.container_requests.add(devices_ids=ids)
        return self.stub.Allocate(req, timeout=timeout)

    def preferred(self, available: list[str], must_include: list[str], size: int,
                  timeout: float = 10.0) -> list[str]:
        req = pb.PreferredAllocationRequest()
        req.container_requests.add(available_deviceIDs=available, must_include_deviceIDs=must_include,
                                   allocation_size=size)
        resp = self.stub.GetPreferredAllocation(req, timeout=timeout)
        assert len(resp.container_responses) == 1, resp
        return list(resp.container_responses[0].deviceIDs)


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: TestKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        k = self._kubelet
        k.register_calls += 1
        if request.version not in SUPPORTED_VERSIONS:
            k.rejected.append(f"version {request.version}")
            context.abort(grpc.StatusCode.UNKNOWN, f"invalid version {request.version!r}, supported: "
                          f"{SUPPORTED_VERSIONS}")
        if not is_extended_resource_name(request.resource_name):
            k.rejected.append(f"resource {request.resource_name}")
            context.abort(grpc.StatusCode.UNKNOWN, f"invalid resource name {request.resource_name!r}")
        path = os.path.join(k.dir, request.endpoint)
        channel = grpc.insecure_channel(f"unix:{path}")
        try:  # kubelet's connectClient: a blocking dial with a 10 s timeout, inside Register
            grpc.channel_ready_future(channel).result(timeout=DIAL_TIMEOUT_S)
            options = pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(),
                                                                                timeout=DIAL_TIMEOUT_S)
        except (grpc.FutureTimeoutError, grpc.RpcError) as e:
            channel.close()
            k.rejected.append(f"dial {request.endpoint}: {e!r}")
            context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin {path}: {e!r}")
        ep = Endpoint(request.resource_name, request.endpoint, channel, options, time.monotonic())
        k._add(ep)
        return pb.Empty()


class TestKubelet:
    """See the module doc. ``root`` plays kubelet's --root-dir (device-plugins/, pod-resources/)."""

    __test__ = False  # not a pytest class

    def __init__(self, root: str | Path,
                 pod_resources: Callable[[grpc.Server], None] | None = None) -> None:
        self.root = str(root)
        self.dir = os.path.join(self.root, "device-plugins")
        self.pod_resources_dir = os.path.join(self.root, "pod-resources")
        self.socket = os.path.join(self.dir, "kubelet.sock")
        self._pod_resources = pod_resources
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.endpoints: dict[str, Endpoint] = {}
        self.history: list[Endpoint] = []  # every endpoint ever registered, in order
        self.register_calls = 0
        self.rejected: list[str] = []
        self.restarts = 0
        self._server: grpc.Server | None = None
        self._pr_server: grpc.Server | None = None

    # --------------------------------------------------------------- life
    def start(self) -> TestKubelet:
        os.makedirs(self.dir, mode=0o750, exist_ok=True)
        self.cleanup_plugin_directory()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="kubelet"))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server
        if self._pod_resources is not None:
            os.makedirs(self.pod_resources_dir, mode=0o750, exist_ok=True)
            path = os.path.join(self.pod_resources_dir, "kubelet.sock")
            if os.path.exists(path):
                os.unlink(path)
            pr = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="podres"))
            self._pod_resources(pr)
            pr.add_insecure_port(f"unix:{path}")
            pr.start()
            self._pr_server = pr
        return self

    def stop(self) -> None:
        """kubelet exits: its servers stop and its connections to plugins close."""
        for server in (self._server, self._pr_server):
            if server is not None:
                server.stop(grace=0).wait(5)
        self._server = self._pr_server = None
        with self._lock:
            eps, self.endpoints = list(self.endpoints.values()), {}
        for ep in eps:
            ep.stop()

    def restart(self) -> None:
        """A kubelet restart: stop, clean the directory (the plugin's socket goes), serve again."""
        self.stop()
        self.restarts += 1
        self.start()

    def cleanup_plugin_directory(self) -> None:
        """CleanupPluginDirectory: remove every file but the checkpoint (sub-directories stay)."""
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if name == CHECKPOINT or (os.path.isdir(path) and not os.path.islink(path)):
                continue
            with contextlib.suppress(FileNotFoundError):  # a plugin may remove its own meanwhile
                os.unlink(path)

    def __enter__(self) -> TestKubelet:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # --------------------------------------------------------------- registrations
    def _add(self, ep: Endpoint) -> None:
        with self._lock:
            old = self.endpoints.get(ep.resource)
            self.endpoints[ep.resource] = ep
            self.history.append(ep)
        if old is not None:  # "always accepts newest device plugin"
            old.stop()
        ep.start_stream()
        with self._changed:
            self._changed.notify_all()

    def drop(self, resource: str) -> Endpoint:
        """kubelet stops an endpoint without restarting (its stream failed): it forgets the plugin and
        never dials it again; only a new Register brings the resource back."""
        with self._lock:
            ep = self.endpoints.pop(resource)
        ep.stop()
        return ep

    def wait_endpoint(self, resource: str, newer_than: Endpoint | None = None,
                      timeout: float = 20.0) -> Endpoint:
        """The registered endpoint of ``resource`` (one registered after ``newer_than``, if given)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                ep = self.endpoints.get(resource)
                if ep is not None and (newer_than is None or ep is not newer_than):
                    return ep
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{resource} did not register within {timeout}s "
                                         f"(calls={self.register_calls}, rejected={self.rejected})")
                self._changed.wait(min(left, 0.2))

    def live_streams(self) -> int:
        """ListAndWatch streams still open across every endpoint ever registered."""
        with self._lock:
            return sum(1 for ep in self.history if ep.live)
