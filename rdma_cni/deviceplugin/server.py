"""The kubelet DevicePlugin service (v1beta1): carries the device model's answers over gRPC.

Nothing here decides anything about devices: the list, the health, the preferred set and the
allocation come from :mod:`rdma_cni.devices.inventory` and :mod:`rdma_cni.devices.allocation`.
This layer only turns them into kubelet's messages and keeps kubelet's rules:

- ``ListAndWatch`` sends the full list at once and again on every change, and never ends while the
  plugin runs (kubelet marks every device unhealthy when it does); all open streams see each change.
- ``GetPreferredAllocation`` never fails: kubelet fails the pod on an error instead of falling back.
- ``Allocate`` answers one response per container request; an unknown or unhealthy ID is a gRPC
  error naming it (``INVALID_ARGUMENT`` / ``FAILED_PRECONDITION``) and changes nothing.
- A malformed request is answered, never a crash: the service's own surprises become ``INTERNAL``.
- With ``--cdi`` (:mod:`.cdi`), Allocate answers the pool's CDI device names and the env, and no
  ``DeviceSpec``: the runtime injects the nodes from the pool's spec, synced before the answer.

Usage::

    board = Board(inventory.scan(cfg))
    service = DevicePluginService(board, cfg)
    server = serve(service, "/var/lib/kubelet/device-plugins/tke-shared-rdma-1700000000.sock")
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from typing import NoReturn

import grpc

from rdma_cni.deviceplugin.cdi import PoolCdi
from rdma_cni.devices import allocation, shared
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.pools import PoolSnapshot, SharedSnapshot, virtual_ids
from rdma_cni.kube import sockets
from rdma_cni.proto import deviceplugin_v1beta1_pb2 as pb
from rdma_cni.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)
# Each open ListAndWatch holds a worker thread of the sync server; kubelet keeps one, a reconnect
# briefly two. The cap keeps workers free for Allocate and for kubelet's call back during Register.
MAX_STREAMS = 8
WORKERS = 16
# How often a waiting stream re-checks that its client is still there: a safety net only, as a
# cancelled stream's callback wakes it at once (context.add_callback in ListAndWatch).
_POLL_S = 10.0


class Board:
    """The current device snapshot, written by the health watch and read by every stream.

    ``publish`` bumps the version only when the snapshot differs, so streams wake for real changes.
    """

    def __init__(self, snap: PoolSnapshot) -> None:
        self._cond = threading.Condition()
        self._snap = snap
        self._version = 0

    def current(self) -> tuple[int, PoolSnapshot]:
        with self._cond:
            return self._version, self._snap

    def publish(self, snap: PoolSnapshot) -> bool:
        """Make ``snap`` current; True when it changed (and every waiting stream was woken)."""
        with self._cond:
            if snap == self._snap:
                return False
            self._snap = snap
            self._version += 1
            self._cond.notify_all()
            return True

    def wait_newer(self, seen: int, timeout: float) -> tuple[int, PoolSnapshot] | None:
        """The snapshot after version ``seen``, or None when none came within ``timeout`` (or a poke)."""
        with self._cond:
            if self._version == seen:
                self._cond.wait(timeout)
            if self._version == seen:
                return None
            return self._version, self._snap

    def poke(self) -> None:
        """Wake every waiting stream so it re-checks its client (a cancelled stream ends at once)."""
        with self._cond:
            self._cond.notify_all()


def device_list(snap: PoolSnapshot) -> pb.ListAndWatchResponse:
    """kubelet's view of ``snap``: every bond, its health, its NUMA node when it has one (numa >= 0);
    for a shared pool, its ``count`` virtual devices (:mod:`rdma_cni.devices.shared`)."""
    if isinstance(snap, SharedSnapshot):
        return shared_device_list(snap)
    healthy = {h.id: h.healthy for h in snap.health}
    out = pb.ListAndWatchResponse()
    for bond in snap.bonds:
        dev = out.devices.add(ID=bond.id, health=HEALTHY if healthy.get(bond.id, False) else UNHEALTHY)
        if bond.numa is not None and bond.numa >= 0:
            dev.topology.nodes.add(ID=bond.numa)
    return out


def shared_device_list(snap: SharedSnapshot) -> pb.ListAndWatchResponse:
    """``count`` devices, all with the pool's health and the NUMA nodes of all its HCAs; none while it
    selects no HCA (as Mellanox's plugin: nothing to share). Built once per change; 1000 devices
    are ~20 kB on the wire."""
    if not snap.hcas:
        return pb.ListAndWatchResponse()
    health = HEALTHY if snap.healthy else UNHEALTHY
    topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=n) for n in snap.numa_nodes()])
    devices = [pb.Device(ID=i, health=health, topology=topology if topology.nodes else None)
               for i in virtual_ids(snap.count)]
    return pb.ListAndWatchResponse(devices=devices)


def _first_available(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """The answer when the model itself failed: must_include, then available in order, ``size`` long."""
    picks = list(dict.fromkeys(must_include))
    picks += [d for d in dict.fromkeys(available) if d not in picks]
    return picks[: max(size, len(must_include))]


class StreamCount:
    """Open ListAndWatch streams of one service; ``on_last_closed`` fires when the count drops to 0."""

    def __init__(self, on_last_closed: Callable[[], None] | None) -> None:
        self._lock = threading.Lock()
        self._open = 0
        self._on_last_closed = on_last_closed

    @property
    def open(self) -> int:
        with self._lock:
            return self._open

    def enter(self) -> bool:
        with self._lock:
            if self._open >= MAX_STREAMS:
                return False
            self._open += 1
            return True

    def leave(self, notify: bool) -> None:
        with self._lock:
            self._open -= 1
            last = self._open == 0
        if last and notify and self._on_last_closed is not None:
            self._on_last_closed()


class DevicePluginService(pb_grpc.DevicePluginServicer):
    """One generation of the plugin's gRPC service (a new one per socket, see registration.py).

    ``on_streams_gone``: called when kubelet's last stream of this generation ended from its side
    (kubelet restarted or dropped us: re-register). ``on_streaming``: called once a stream's first
    list was sent (gRPC asks for the next message only after the last one went out): kubelet has
    the devices from this generation, so the plugin may say it is ready. ``on_allocated``: called
    with the number of container responses of every successful Allocate (the status file counts
    them). ``cdi``: the pool's CDI spec when Allocate answers CDI names (``--cdi``); None:
    DeviceSpecs, as by default.
    """

    def __init__(
        self,
        board: Board,
        cfg: PluginConfig,
        on_streams_gone: Callable[[], None] | None = None,
        on_allocated: Callable[[int], None] | None = None,
        cdi: PoolCdi | None = None,
        on_streaming: Callable[[], None] | None = None,
    ) -> None:
        self._board = board
        self._on_streaming = on_streaming
        self._cfg = cfg
        self._cdi = cdi
        self._stopping = threading.Event()
        self.streams = StreamCount(on_streams_gone)
        self._on_allocated = on_allocated

    def stop(self) -> None:
        """End every stream of this generation (the plugin stops or starts over); no restart signal."""
        self._stopping.set()
        self._board.poke()

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        if not self.streams.enter():
            _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                   f"{MAX_STREAMS} ListAndWatch streams are already open on this plugin; close one")
        context.add_callback(self._board.poke)  # a cancelled client wakes its stream at once
        try:
            seen, snap = self._board.current()
            last = device_list(snap)
            yield last
            if self._on_streaming is not None:
                self._on_streaming()
            while context.is_active() and not self._stopping.is_set():
                newer = self._board.wait_newer(seen, _POLL_S)
                if newer is None:
                    continue
                seen, snap = newer
                resp = device_list(snap)
                if resp != last:  # a new reason behind the same health is not news to kubelet
                    yield resp
                    last = resp
        finally:
            self.streams.leave(notify=not self._stopping.is_set())

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        _, snap = self._board.current()
        out = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            available, must = list(req.available_deviceIDs), list(req.must_include_deviceIDs)
            size = req.allocation_size
            try:
                if isinstance(snap, SharedSnapshot):
                    picks = shared.preferred(available, must, size)
                else:
                    picks = allocation.preferred(snap, available, must, size)
            except Exception:  # never fail kubelet's allocation for a bug of ours: answer plainly
                log.exception("preferred allocation failed for %s of %s; answering the first ones", size,
                              available)
                picks = _first_available(available, must, size)
            out.container_responses.add(deviceIDs=picks)
        return out

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        _, snap = self._board.current()
        out = pb.AllocateResponse()
        for req in request.container_requests:
            ids = list(req.devices_ids)
            try:
                if isinstance(snap, SharedSnapshot):
                    alloc = shared.allocate(snap, ids, self._cfg)
                else:
                    alloc = allocation.allocate(snap, ids, self._cfg)
                names = self._cdi.answer(snap, ids) if self._cdi is not None else None
            except allocation.AllocationError as e:
                code, text = _allocation_status(snap, e)
                log.warning("Allocate %s refused: %s", ids, text)
                _abort(context, code, text)
            except Exception as e:
                log.exception("Allocate %s failed", ids)
                _abort(context, grpc.StatusCode.INTERNAL, f"allocating {ids} failed: {e}")
            resp = out.container_responses.add(envs=dict(alloc.envs))
            if names is not None:  # the runtime injects the nodes: listing them too would double them
                resp.cdi_devices.extend(pb.CDIDevice(name=n) for n in names)
                continue
            for spec in alloc.devices:
                resp.devices.add(container_path=spec.container_path, host_path=spec.host_path,
                                 permissions=spec.permissions)
        log.info("Allocate %s", [list(r.devices_ids) for r in request.container_requests])
        if self._on_allocated is not None:
            self._on_allocated(len(out.container_responses))
        return out

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()  # pre_start_required is false: nothing to prepare


def _allocation_status(snap: PoolSnapshot, e: allocation.AllocationError) -> tuple[grpc.StatusCode, str]:
    """Unknown ID -> INVALID_ARGUMENT (kubelet asked for what we never listed); a known one that cannot
    be given now (unhealthy) -> FAILED_PRECONDITION. The text always names the ID."""
    if isinstance(snap, SharedSnapshot):
        known = set(virtual_ids(snap.count))
    else:
        known = {b.id for b in snap.bonds}
    code = grpc.StatusCode.FAILED_PRECONDITION if e.device_id in known else grpc.StatusCode.INVALID_ARGUMENT
    text = str(e)
    if e.device_id not in text:
        text = f"device {e.device_id!r}: {text}"
    return code, text


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, text: str) -> NoReturn:
    context.abort(code, text)
    raise AssertionError("unreachable: grpc's abort raises")


def serve(service: DevicePluginService, socket_path: str) -> grpc.Server:
    """Start a gRPC server for ``service`` on the unix socket ``socket_path`` (RuntimeError if it
    cannot bind). The pool has spare workers beyond ``MAX_STREAMS``: kubelet's call back during
    Register and Allocate always find one."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="dp-grpc"))
    pb_grpc.add_DevicePluginServicer_to_server(service, server)
    server.add_insecure_port(f"unix:{socket_path}")
    sockets.make_private(socket_path)  # before start(): nobody else may ask for an allocation
    server.start()
    return server
