"""Serve, prove, register, and start over whenever kubelet forgets us.

kubelet's rules (deviceplugin-facts.md 1.4-1.5) and what this module does about each:

- The plugin must already serve its socket when it calls ``Register``, and kubelet dials back (10 s
  timeout) and calls ``GetDevicePluginOptions`` *inside* Register: the server runs on its own thread
  pool and is proven to answer (a real call on the socket) before Register is sent from this thread.
- kubelet never re-dials. A restarted kubelet deletes every socket in the directory and re-creates
  ``kubelet.sock``; a kubelet that drops the stream forgets the endpoint. Each of the three signs
  (own socket gone, ``kubelet.sock`` with a new inode, the last ListAndWatch closed by kubelet) starts
  a new *generation*: a new server on a new socket, registered again. The loop sleeps until one of
  them may have happened: the directory is watched with inotify (:mod:`rdma_cni.kube.dirwatch`: a
  socket deleted or created wakes it at once) and a stream's end wakes it from the gRPC thread; it
  then looks (two ``lstat``). Without inotify it looks every 100 ms instead, as a poll.
- A unique socket name per generation (``tke-shared-rdma-<ns>.sock``) keeps a rolling update's old
  and new plugin apart (k8s #121994); sockets of our own earlier runs that no one answers on any
  more (a kill -9) are removed at start.
- While kubelet is absent or refuses, Register is retried with backoff; the log says so once per
  state change, not once per try.
- Two instances at once (a rolling update's surge pod): a kubelet that keeps one endpoint per socket
  keeps both streams, and the older instance's exit removes only its own endpoint; the old one
  stops without sending another list (no empty or unhealthy one). A kubelet that keeps one per
  resource drops the older one's stream instead: the older sees another instance answering on its
  socket and stands by (no registration ping-pong) until that one is gone, then registers again.
- Ready (the status file's ``registered``, which the DaemonSet's readiness reads) only once kubelet
  took the registration *and* the first device list went out on its ListAndWatch stream: before
  that kubelet may still have no device of this instance.

Usage::

    Lifecycle(cfg, board, status).run(stop_event)   # returns when stop_event is set, socket removed
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from rdma_cni.deviceplugin.cdi import PoolCdi
from rdma_cni.deviceplugin.server import OPTIONS, Board, DevicePluginService, serve
from rdma_cni.deviceplugin.status import PoolStatus, StatusFile
from rdma_cni.devices.config import PluginConfig
from rdma_cni.kube.dirwatch import DirWatch
from rdma_cni.kube.sockets import socket_inode
from rdma_cni.proto import deviceplugin_v1beta1_pb2 as pb
from rdma_cni.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
POLL_S = 0.1  # without inotify: how often the sockets are looked at
WATCH_CAP_S = 30.0  # with inotify: the longest sleep without an event (a safety net, never needed;
# every wake-up is CPU an idle node pays: once a second was a tenth of the plugin's idle cost)
REGISTER_TIMEOUT_S = 12.0  # kubelet's own dial back may take its full 10 s
PROVE_TIMEOUT_S = 5.0
PROVE_TRY_S = 0.25
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 2.0
STANDBY_CHECK_S = 1.0


def socket_base(resource_name: str) -> str:
    """``tke.cloud.tencent.com/tke-shared-rdma`` -> ``tke-shared-rdma``."""
    return resource_name.rsplit("/", 1)[-1]


def _nobody_listens(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError as e:
            return e.errno in (errno.ECONNREFUSED, errno.ENOENT)
    return False


def own_sockets(directory: str, base: str) -> list[str]:
    """``<base>-<ns>.sock`` files in ``directory``: this resource's, of any run. Exactly that shape, so
    pool ``hca`` never takes pool ``hca-b``'s socket (``hca-b-1700….sock``) for one of its own."""
    shape = re.compile(re.escape(base) + r"-\d+\.sock")
    found = glob.glob(os.path.join(glob.escape(directory), f"{glob.escape(base)}-*.sock"))
    return sorted(p for p in found if shape.fullmatch(os.path.basename(p)))


def remove_stale_sockets(directory: str, base: str) -> list[str]:
    """Remove ``<base>-*.sock`` files nobody answers on (left by a killed run); a live one stays."""
    removed = []
    for path in own_sockets(directory, base):
        if socket_inode(path) is not None and _nobody_listens(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
    return removed


def other_live_instance(directory: str, base: str, own: str) -> str | None:
    """Another ``<base>-*.sock`` in ``directory`` that someone answers on (another plugin instance)."""
    for path in own_sockets(directory, base):
        if path != own and socket_inode(path) is not None and not _nobody_listens(path):
            return path
    return None


def prove_answers(socket_path: str, timeout: float = PROVE_TIMEOUT_S) -> None:
    """A real GetDevicePluginOptions on our own socket: a bound socket is not yet a serving one."""
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(pb.Empty(), timeout=timeout,
                                                                  wait_for_ready=True)


def register(kubelet_socket: str, endpoint: str, resource_name: str,
             timeout: float = REGISTER_TIMEOUT_S, abandon: Callable[[], bool] | None = None) -> bool:
    """v1beta1 Register of ``endpoint`` (a file name in kubelet's directory): True when kubelet took
    it, grpc.RpcError when it refused, False when ``abandon()`` turned true meanwhile (checked every
    100 ms: a kubelet dialing back a socket its own start-up just deleted would wait its full 10 s)."""
    with grpc.insecure_channel(f"unix:{kubelet_socket}") as channel:
        request = pb.RegisterRequest(version=VERSION, endpoint=endpoint, resource_name=resource_name,
                                     options=OPTIONS)
        call = pb_grpc.RegistrationStub(channel).Register.future(request, timeout=timeout)
        while True:
            try:
                call.result(timeout=POLL_S)
                return True
            except grpc.FutureTimeoutError:
                if abandon is not None and abandon():
                    call.cancel()
                    return False


def _wake_on(stop: threading.Event, watch: DirWatch) -> None:
    stop.wait()
    watch.wake()


@dataclass
class Generation:
    """One server on one socket; replaced as a whole, never repaired."""

    endpoint: str
    path: str
    inode: int | None  # None: deleted before it could be looked at (never registered)
    service: DevicePluginService
    server: grpc.Server
    accepted: bool = False  # kubelet answered Register
    streaming: bool = False  # a ListAndWatch stream sent its first list
    announced: bool = False  # the status file says registered

    def stop(self) -> None:
        self.service.stop()
        self.server.stop(grace=0).wait(2.0)
        if socket_inode(self.path) == self.inode:  # kubelet's cleanup may have removed it already
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


class Lifecycle:
    """One pool's registration loop (runs on the thread that calls :meth:`run`). ``resource_name``
    and ``base`` (the socket name's start) default to ``cfg.resource_name`` and its last part."""

    def __init__(self, cfg: PluginConfig, board: Board, status: StatusFile | PoolStatus,
                 resource_name: str | None = None, base: str | None = None,
                 cdi: PoolCdi | None = None) -> None:
        self._cfg = cfg
        self._cdi = cdi  # every generation's service answers CDI names with it (--cdi)
        self._board = board
        self._status = status
        self._resource = resource_name or cfg.resource_name
        self._base = base or socket_base(self._resource)
        self._dir = cfg.device_plugin_dir
        self._kubelet = os.path.join(self._dir, KUBELET_SOCKET)
        self._kick = threading.Event()
        self._ready_lock = threading.Lock()
        self._current: Generation | None = None
        self._state = ""
        self._watch: DirWatch | None = None

    # ------------------------------------------------------------------ the loop
    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: a generation, registered, watched; a new one whenever kubelet forgot us."""
        base = self._base
        for path in remove_stale_sockets(self._dir, base):
            log.info("removed %s: a socket of an earlier run that no one answers on", path)
        with DirWatch(self._dir, POLL_S) as watch:
            self._watch = watch
            # A stop (a signal handler on this thread, or another thread) must end a long wait too.
            threading.Thread(target=_wake_on, args=(stop, watch), name="dp-stop", daemon=True).start()
            try:
                while not stop.is_set():
                    gen = self._start(base, stop)
                    if gen is None:
                        break
                    reason = self._register_and_watch(gen, stop, watch)
                    self._stop_current()
                    if reason:
                        log.warning("starting over on a new socket: %s", reason)
            finally:
                self._watch = None
                self._stop_current()
                self._status.update(registered=False, endpoint="")

    def _start(self, base: str, stop: threading.Event) -> Generation | None:
        """Serve a new socket and prove it answers; retried while the directory is not usable."""
        while not stop.is_set():
            endpoint = f"{base}-{time.time_ns()}.sock"
            path = os.path.join(self._dir, endpoint)
            self._kick.clear()
            service = DevicePluginService(self._board, self._cfg, on_streams_gone=self._streams_gone,
                                          on_allocated=self._status.count_allocations, cdi=self._cdi,
                                          on_streaming=functools.partial(self._streaming, endpoint))
            try:
                os.makedirs(self._dir, mode=0o750, exist_ok=True)
                server = serve(service, path)
            except (OSError, RuntimeError) as e:
                self._note("no-socket", logging.ERROR, "cannot serve %s (%s); retrying every second", path, e)
                stop.wait(1.0)
                continue
            gen = Generation(endpoint, path, socket_inode(path), service, server)
            self._current = gen
            problem = self._prove(gen) if gen.inode is not None else f"own socket {path} vanished at once"
            if problem:
                self._note("no-answer", logging.WARNING, "%s; starting over", problem)
                self._stop_current()
                stop.wait(0.05)
                continue
            log.info("serving %s", path)
            return gen
        return None

    def _prove(self, gen: Generation) -> str:
        """"" once ``gen`` answers on its socket; else why not. Short tries, so that a socket deleted
        meanwhile (a kubelet starting up cleans its directory) is noticed at once, not after 5 s."""
        deadline = time.monotonic() + PROVE_TIMEOUT_S
        while True:
            if socket_inode(gen.path) != gen.inode:
                return f"own socket {gen.path} was deleted before it answered"
            try:
                prove_answers(gen.path, PROVE_TRY_S)
                return ""
            except grpc.RpcError as e:
                if time.monotonic() > deadline:
                    return f"own socket {gen.path} does not answer ({e.code()})"

    def _register_and_watch(self, gen: Generation, stop: threading.Event, watch: DirWatch) -> str:
        """Register ``gen`` (retrying) and watch it; the reason to start over, "" on stop."""
        registered_inode: int | None = None
        tried_inode: int | None = None
        backoff, next_try, next_check = BACKOFF_MIN_S, 0.0, 0.0
        while not stop.is_set():
            pause = WATCH_CAP_S  # until the directory changes or a stream ends (see the module doc)
            if socket_inode(gen.path) != gen.inode:
                return f"own socket {gen.path} was deleted (kubelet restarted and cleaned its directory)"
            kubelet = socket_inode(self._kubelet)
            if registered_inode is not None:
                if kubelet != registered_inode:
                    return f"{self._kubelet} was re-created or removed (kubelet restarted)"
                if self._kick.is_set() and time.monotonic() >= next_check:
                    other = other_live_instance(self._dir, self._base, gen.path)
                    if other is None:
                        return "kubelet closed its ListAndWatch stream"
                    # A newer plugin of the same resource replaced us (a rolling update): registering
                    # again would take it back, and so on. Stand by (checking every second) until it
                    # is gone.
                    next_check = time.monotonic() + STANDBY_CHECK_S
                    self._status.update(registered=False)
                    self._note(f"standby-{other}", logging.WARNING, "kubelet dropped our stream for %s, "
                               "another rdma-device-plugin; standing by until it stops", other)
                if self._kick.is_set():
                    pause = min(pause, next_check - time.monotonic())
            elif kubelet is None:
                self._note("absent", logging.WARNING, "no kubelet at %s yet; registering when it appears",
                           self._kubelet)
            else:
                if kubelet != tried_inode:  # a new kubelet: try at once, backoff anew
                    tried_inode, backoff, next_try = kubelet, BACKOFF_MIN_S, 0.0
                if time.monotonic() >= next_try:
                    if self._try_register(gen):
                        registered_inode = kubelet
                        continue
                    next_try = time.monotonic() + backoff
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
                pause = min(pause, next_try - time.monotonic())
            watch.wait(pause)
        return ""

    def _try_register(self, gen: Generation) -> bool:
        started = time.monotonic()
        self._kick.clear()  # kubelet opens its stream after Register returns
        inode = socket_inode(self._kubelet)

        def moot() -> bool:  # the registration can no longer hold: start over instead of waiting
            return socket_inode(gen.path) != gen.inode or socket_inode(self._kubelet) != inode

        try:
            if not register(self._kubelet, gen.endpoint, self._resource, abandon=moot):
                log.info("registration of %s abandoned: a socket changed meanwhile", gen.endpoint)
                return False
        except grpc.RpcError as e:
            self._note(f"refused-{e.code()}", logging.WARNING,
                       "kubelet at %s did not take the registration (%s: %s); retrying, backoff up to %ss",
                       self._kubelet, e.code(), e.details(), BACKOFF_MAX_S)
            return False
        self._note(f"registered-{gen.endpoint}", logging.INFO, "registered %s as %s with kubelet in %.0f ms",
                   self._resource, gen.endpoint, (time.monotonic() - started) * 1000)
        gen.accepted = True
        self._maybe_ready(gen)
        return True

    def _streaming(self, endpoint: str) -> None:
        """From a gRPC thread: a stream of ``endpoint`` sent kubelet its first list."""
        with self._ready_lock:
            gen = self._current
            if gen is None or gen.endpoint != endpoint:
                return
            gen.streaming = True
        self._maybe_ready(gen)

    def _maybe_ready(self, gen: Generation) -> None:
        """Say registered once kubelet took ``gen`` and streams its devices (in either order: kubelet
        opens the stream on its own goroutine, maybe before Register has answered)."""
        with self._ready_lock:
            if not (gen.accepted and gen.streaming) or gen.announced or self._current is not gen:
                return
            gen.announced = True
        self._status.registered(gen.endpoint)
        log.info("kubelet streams %s's devices from %s: ready", self._resource, gen.endpoint)

    # ------------------------------------------------------------------ helpers
    def _streams_gone(self) -> None:
        """From a gRPC thread: kubelet's last stream of *some* generation ended from its side."""
        current, watch = self._current, self._watch
        if current is not None and current.service.streams.open == 0:
            self._kick.set()
            if watch is not None:
                watch.wake()

    def _stop_current(self) -> None:
        gen, self._current = self._current, None
        if gen is not None:
            self._status.update(registered=False)
            gen.stop()

    def _note(self, state: str, level: int, msg: str, *args: object) -> None:
        """Log ``msg`` only when the state differs from the last one noted (not once per retry)."""
        if state != self._state:
            self._state = state
            log.log(level, msg, *args)
