"""A stand-in NVIDIA GPU device plugin (``nvidia.com/gpu``) for the test cluster's kubelets.

Why it exists: the seed pod asks for ``nvidia.com/gpu: "4"`` next to
``tke.cloud.tencent.com/tke-shared-rdma: "4"`` on a kubelet with ``topologyManagerPolicy:
best-effort``. kubelet aligns the two resources by NUMA node only when *both* plugins report
``TopologyInfo``; the machines here have no GPU, so this plugin reports 8 fake ones with the NUMA
nodes and PCIe roots of the simulated RDMA node. It serves kubelet's real device-plugin API
(v1beta1, the project's generated stubs in :mod:`rdma_cni.proto`) on a unix socket, so kubelet
cannot tell it from NVIDIA's plugin as far as admission goes; it answers no device nodes (there is
nothing to open) but names each GPU's PCIe root and NUMA node in the container's env, so a test can
check that GPUs and RDMA bonds ended up aligned.

The node layout (:func:`layout`, defaults: 8 GPUs, 2 NUMA nodes, 4 PCIe roots): root ``r`` holds
GPUs ``2r, 2r+1`` and bonds ``2r, 2r+1`` (``mlx5_bond_2r``, ``mlx5_bond_2r+1``), and sits on NUMA node
``r // 2``. The roots are named as the simulated sysfs names them (:func:`rdma_cni.sim.tree.pcie_root`:
2 PCI functions per root, ``pci0000:00``, ``pci0000:20``, ``pci0000:40``, ``pci0000:60``), so GPU i
and bond i share a root by name; GPUs and bonds 0-3 are on NUMA 0, 4-7 on NUMA 1, as the demo's
``--bonds 8`` (numa ``i // 4``) and tests/cluster/topology.py's ``bond_numa`` have them.

kubelet's rules it keeps (deviceplugin-facts.md 1.4-1.6): serve first, prove the socket answers,
then Register; ``ListAndWatch`` sends the full list and never ends on its own; GetPreferredAllocation
never fails; one ``ContainerAllocateResponse`` per container request. A restarted kubelet deletes
every socket in the directory and re-creates ``kubelet.sock``, and never dials a plugin again on its
own: the plugin watches its own socket and ``kubelet.sock``'s inode (an ``lstat`` every
``WATCH_S``, as Mellanox's plugin does; the deletion and re-creation are both caught) and, on
either sign, starts over: new server, new socket, Register again. A socket that kubelet's start-up
cleanup deletes before it answered is a reason to start over too. Each generation's socket has a
name of its own (``nvidia-gpu-<ns>.sock``, as rdma-cni's plugin and k8s' sample plugin do): an old
and a new instance never share a path (k8s #121994), and a client's gRPC reconnect backoff for a
path that just failed never applies to the new server.

CLI (logs to stderr, SIGTERM/SIGINT end it cleanly and remove its socket)::

    PYTHONPATH=tests python -m cluster.gpu_plugin --device-plugin-dir DIR [--count 8] \\
        [--numa-nodes 2] [--roots 4]

In Python::

    plugin = GpuPlugin(layout(), "/var/lib/kubelet/device-plugins")
    plugin.start()          # a thread: serve, register, re-register on every kubelet restart
    ...
    plugin.stop()           # socket removed
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

import grpc

from rdma_cni.kube.sockets import socket_inode
from rdma_cni.proto import deviceplugin_v1beta1_pb2 as pb
from rdma_cni.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from rdma_cni.sim import tree as sim_tree

log = logging.getLogger("gpu-plugin")

RESOURCE = "nvidia.com/gpu"
VERSION = "v1beta1"
DEFAULT_DIR = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = "kubelet.sock"
SOCKET_BASE = "nvidia-gpu"  # NVIDIA's plugin's socket is nvidia-gpu.sock; ours nvidia-gpu-<ns>.sock
HEALTHY = "Healthy"
ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_ROOTS = "RDMA_CNI_TEST_GPU_PCIE_ROOTS"  # one root per GPU, in NVIDIA_VISIBLE_DEVICES' order
ENV_NUMA = "RDMA_CNI_TEST_GPU_NUMA_NODES"  # one NUMA node per GPU, same order
OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

WATCH_S = 0.1  # how often the sockets are looked at (two lstat): a restart is noticed within this
REGISTER_TIMEOUT_S = 10.0  # kubelet dials back within Register for up to 10 s itself
PROVE_TIMEOUT_S = 5.0
PROVE_TRY_S = 0.25
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 2.0
WORKERS = 8  # one per open ListAndWatch (kubelet keeps one) plus Allocate and the call back in Register
MAX_COMBINATIONS = 20000  # beyond this many candidate sets, GetPreferredAllocation picks greedily


# --------------------------------------------------------------------------- the layout


@dataclass(frozen=True)
class Gpu:
    """One fake GPU: its device ID, index, NUMA node and PCIe root (``pci0000:40``)."""

    id: str
    index: int
    numa: int
    root: str


def root_name(r: int) -> str:
    """PCIe root ``r`` (``pci<domain>:<bus>``), the name the simulated sysfs gives the root of its PCI
    functions ``2r, 2r+1`` (bonds ``2r, 2r+1``): ``pci0000:00``, ``pci0000:20``, ... ``pci0000:e0``."""
    return sim_tree.pcie_root(r * sim_tree.FUNCTIONS_PER_ROOT)


MAX_ROOTS = 0x100 // 0x20  # the simulated sysfs's root names repeat after 8


def check_shape(count: int, numa_nodes: int, roots: int) -> None:
    """ValueError unless ``count`` GPUs split evenly over ``roots`` roots and those over the NUMA nodes."""
    if count < 1 or numa_nodes < 1 or not 1 <= roots <= MAX_ROOTS:
        raise ValueError(
            f"need count >= 1, numa-nodes >= 1, 1 <= roots <= {MAX_ROOTS} (got {count}, "
            f"{numa_nodes}, {roots})"
        )
    if count % roots or roots % numa_nodes:
        raise ValueError(f"{count} GPUs do not split evenly over {roots} roots on {numa_nodes} NUMA nodes")


def layout(count: int = 8, numa_nodes: int = 2, roots: int = 4) -> list[Gpu]:
    """The node's GPUs: ``count // roots`` consecutive GPUs per root, ``roots // numa_nodes``
    consecutive roots per NUMA node (defaults: root r = GPUs 2r, 2r+1, NUMA r // 2)."""
    check_shape(count, numa_nodes, roots)
    per_root, roots_per_numa = count // roots, roots // numa_nodes
    return [
        Gpu(f"gpu-{i}", i, (i // per_root) // roots_per_numa, root_name(i // per_root)) for i in range(count)
    ]


def bond_layout(bonds: int = 8, numa_nodes: int = 2) -> dict[str, tuple[str, int]]:
    """The RDMA bonds' side of the same node: ``mlx5_bond_<i>`` -> (PCIe root, NUMA node), roots as
    the simulated sysfs puts them (2 per root), NUMA nodes in equal consecutive blocks, so a test
    can tell whether a pod's GPUs and bonds share NUMA nodes and roots."""
    per_numa = -(-bonds // numa_nodes)
    return {f"mlx5_bond_{i}": (sim_tree.pcie_root(i), i // per_numa) for i in range(bonds)}


# --------------------------------------------------------------------------- preferred allocation


def preferred(
    gpus: Sequence[Gpu], available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """The GPUs kubelet should take: ``must_include`` plus the best completion from ``available``.

    Best = fewest NUMA nodes spanned, then fewest PCIe roots spanned (whole roots: 4 GPUs are 2 roots,
    never 3), then the fewest roots and NUMA nodes left half-taken among the remaining available ones
    (best fit: a 1- or 2-GPU request goes where it breaks nothing whole), then the lowest indices.
    Unknown IDs sort last, as if on a NUMA node and root of their own. Never raises: kubelet fails
    the pod on an error (deviceplugin-facts.md 1.6); a request larger than what is offered is
    answered with all of it."""
    by_id = {g.id: g for g in gpus}
    picks = list(dict.fromkeys(must_include))
    pool = [d for d in dict.fromkeys(available) if d not in picks]
    needed = size - len(picks)
    if needed <= 0:
        return picks
    if needed >= len(pool):
        return picks + pool

    def where(dev: str) -> tuple[str, str]:
        g = by_id.get(dev)
        return (f"numa{g.numa}", g.root) if g is not None else (f"?{dev}", f"?{dev}")

    def order(dev: str) -> tuple[int, str]:
        g = by_id.get(dev)
        return (g.index, "") if g is not None else (len(by_id), dev)

    offered = picks + pool
    numa_total = _counts(where(d)[0] for d in pool)
    root_total = _counts(where(d)[1] for d in pool)

    def score(chosen: tuple[str, ...]) -> tuple[int, int, int, int, list[tuple[int, str]]]:
        taken = picks + list(chosen)
        numas = _counts(where(d)[0] for d in chosen)
        roots = _counts(where(d)[1] for d in chosen)
        half_roots = sum(1 for r, n in roots.items() if n < root_total[r])
        half_numas = sum(1 for m, n in numas.items() if n < numa_total[m])
        return (
            len({where(d)[0] for d in taken}),
            len({where(d)[1] for d in taken}),
            half_roots,
            half_numas,
            sorted(order(d) for d in chosen),
        )

    pool.sort(key=order)
    if math.comb(len(pool), needed) > MAX_COMBINATIONS:  # a big node: NUMA, root, index order
        pool.sort(key=lambda d: (where(d), order(d)))
        return picks + pool[:needed]
    best = min(itertools.combinations(pool, needed), key=score)
    log.debug("preferred %d of %s (must %s): %s", size, offered, picks, best)
    return picks + sorted(best, key=order)


def _counts(items: Iterator[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


# --------------------------------------------------------------------------- the gRPC service


def device_list(gpus: Sequence[Gpu]) -> pb.ListAndWatchResponse:
    """Every GPU, Healthy, with its NUMA node (what makes kubelet align it with the RDMA bonds)."""
    return pb.ListAndWatchResponse(
        devices=[
            pb.Device(ID=g.id, health=HEALTHY, topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=g.numa)]))
            for g in gpus
        ]
    )


def allocation_envs(gpus: Sequence[Gpu], ids: Sequence[str]) -> dict[str, str]:
    """The container's env for ``ids`` (KeyError for an unknown one): the GPUs in index order, and
    each one's PCIe root and NUMA node in the same order."""
    by_id = {g.id: g for g in gpus}
    chosen = sorted((by_id[i] for i in dict.fromkeys(ids)), key=lambda g: g.index)
    return {
        ENV_VISIBLE: ",".join(g.id for g in chosen),
        ENV_ROOTS: ",".join(g.root for g in chosen),
        ENV_NUMA: ",".join(str(g.numa) for g in chosen),
    }


class GpuService(pb_grpc.DevicePluginServicer):
    """One generation's DevicePlugin service; :meth:`stop` ends its ListAndWatch streams."""

    def __init__(self, gpus: Sequence[Gpu]) -> None:
        self._gpus = list(gpus)
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def GetDevicePluginOptions(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(
        self, request: pb.Empty, context: grpc.ServicerContext
    ) -> Iterator[pb.ListAndWatchResponse]:
        yield device_list(self._gpus)
        # The devices never change: hold the stream open (kubelet marks every device unhealthy when
        # it ends) until kubelet cancels it or this generation stops.
        while context.is_active() and not self._stopping.wait(0.2):
            pass

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        out = pb.PreferredAllocationResponse()
        for req in request.container_requests:
            available, must = list(req.available_deviceIDs), list(req.must_include_deviceIDs)
            try:
                picks = preferred(self._gpus, available, must, req.allocation_size)
            except Exception:  # never fail kubelet's allocation for a bug of ours
                log.exception("preferred allocation failed; answering the first ones")
                picks = must + [d for d in available if d not in must]
                picks = picks[: max(req.allocation_size, len(must))]
            log.info(
                "GetPreferredAllocation %d of %s (must %s): %s", req.allocation_size, available, must, picks
            )
            out.container_responses.add(deviceIDs=picks)
        return out

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        out = pb.AllocateResponse()
        for req in request.container_requests:
            ids = list(req.devices_ids)
            try:
                envs = allocation_envs(self._gpus, ids)
            except KeyError as e:
                _abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unknown GPU {e.args[0]!r} (have {', '.join(g.id for g in self._gpus)})",
                )
            out.container_responses.add(envs=envs)
            log.info("Allocate %s: %s", ids, envs)
        return out

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, text: str) -> NoReturn:
    context.abort(code, text)
    raise AssertionError("unreachable: grpc's abort raises")


# --------------------------------------------------------------------------- lifecycle


def remove_stale_sockets(directory: str, base: str) -> list[str]:
    """Remove ``<base>-<ns>.sock`` files in ``directory`` nobody answers on (a killed run's)."""
    removed = []
    shape = re.compile(re.escape(base) + r"-\d+\.sock")
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if not shape.fullmatch(name) or socket_inode(path) is None:
                continue
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                try:
                    s.connect(path)
                    continue  # someone serves it: another instance's
                except OSError:
                    pass
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
    return removed


@dataclass
class _Generation:
    """One server on one socket; replaced as a whole on every restart, never repaired."""

    path: str
    inode: int | None  # None: deleted (kubelet's cleanup) before it could be looked at
    service: GpuService
    server: grpc.Server

    def stop(self) -> None:
        self.service.stop()
        self.server.stop(grace=0).wait(2.0)
        if socket_inode(self.path) == self.inode:  # kubelet's cleanup may have removed it already
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


class GpuPlugin:
    """Serve ``gpus`` in ``device_plugin_dir`` and keep them registered with the kubelet there.

    ``registrations`` counts successful Register calls (a test waits for the second one after a
    kubelet restart)."""

    def __init__(
        self,
        gpus: Sequence[Gpu],
        device_plugin_dir: str = DEFAULT_DIR,
        resource_name: str = RESOURCE,
        socket_base: str = SOCKET_BASE,
    ) -> None:
        self.gpus = list(gpus)
        self.dir = device_plugin_dir
        self.resource_name = resource_name
        self.socket_base = socket_base
        self.kubelet_socket = os.path.join(device_plugin_dir, KUBELET_SOCKET)
        self.registrations = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._current: _Generation | None = None

    # ------------------------------------------------------------------ public
    def start(self) -> GpuPlugin:
        """Run :meth:`run` on a thread (for tests and embedding)."""
        self._thread = threading.Thread(target=self.run, name="gpu-plugin", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """End :meth:`run` (its socket removed) and wait for its thread, if :meth:`start` made one."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def socket_path(self) -> str | None:
        """The socket the current generation serves on; None between generations."""
        gen = self._current
        return gen.path if gen is not None else None

    def run(self) -> None:
        """Until :meth:`stop`: serve, register, watch; start over whenever kubelet forgot us."""
        for path in remove_stale_sockets(self.dir, self.socket_base):
            log.info("removed %s: a socket of an earlier run that no one answers on", path)
        try:
            while not self._stop.is_set():
                gen = self._serve()
                if gen is None:
                    break
                reason = self._register_and_watch(gen)
                self._stop_current()
                if reason:
                    log.warning("starting over: %s", reason)
        finally:
            self._stop_current()
            log.info("stopped")

    # ------------------------------------------------------------------ steps
    def _serve(self) -> _Generation | None:
        """A new server on the socket, proven to answer; retried while the directory is unusable."""
        while not self._stop.is_set():
            service = GpuService(self.gpus)
            path = os.path.join(self.dir, f"{self.socket_base}-{time.time_ns()}.sock")
            try:
                os.makedirs(self.dir, mode=0o750, exist_ok=True)
                server = grpc.server(
                    futures.ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="gpu-grpc")
                )
                pb_grpc.add_DevicePluginServicer_to_server(service, server)
                server.add_insecure_port(f"unix:{path}")
                server.start()
            except (OSError, RuntimeError) as e:
                log.error("cannot serve %s (%s); retrying in 1 s", path, e)
                self._stop.wait(1.0)
                continue
            gen = _Generation(path, socket_inode(path), service, server)
            self._current = gen
            problem = self._prove(gen)
            if problem:
                log.warning("%s; starting over", problem)
                self._stop_current()
                self._stop.wait(0.05)
                continue
            log.info("serving %d GPUs as %s on %s", len(self.gpus), self.resource_name, gen.path)
            return gen
        return None

    def _prove(self, gen: _Generation) -> str:
        """ "" once ``gen`` answers a real call on its socket (a bound socket is not yet a serving one,
        and kubelet dials back inside Register); else why not. Short tries with a look at the socket
        between them: a kubelet starting up deletes every socket in the directory, maybe the one
        just bound, and a call on a deleted path would only time out."""
        deadline = time.monotonic() + PROVE_TIMEOUT_S
        while True:
            if gen.inode is None or socket_inode(gen.path) != gen.inode:
                return f"own socket {gen.path} was deleted before it answered"
            try:
                with grpc.insecure_channel(f"unix:{gen.path}") as channel:
                    pb_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                        pb.Empty(), timeout=PROVE_TRY_S, wait_for_ready=True
                    )
                return ""
            except grpc.RpcError as e:
                if time.monotonic() > deadline:
                    return f"own socket {gen.path} does not answer ({e.code()})"

    def _register_and_watch(self, gen: _Generation) -> str:
        """Register ``gen`` (retrying with backoff) and watch; the reason to start over, "" on stop."""
        registered: int | None = None  # kubelet.sock's inode when kubelet took us
        tried: int | None = None
        backoff, next_try = BACKOFF_MIN_S, 0.0
        absent_noted = False
        while not self._stop.is_set():
            if socket_inode(gen.path) != gen.inode:
                return f"own socket {gen.path} was deleted (kubelet restarted and cleaned its directory)"
            kubelet = socket_inode(self.kubelet_socket)
            if registered is not None:
                if kubelet != registered:
                    return f"{self.kubelet_socket} was re-created or removed (kubelet restarted)"
            elif kubelet is None:
                if not absent_noted:
                    log.warning("no kubelet at %s yet; registering when it appears", self.kubelet_socket)
                    absent_noted = True
            else:
                if kubelet != tried:  # a new kubelet: try at once, backoff anew
                    tried, backoff, next_try = kubelet, BACKOFF_MIN_S, 0.0
                if time.monotonic() >= next_try:
                    if self._register(gen):
                        registered = kubelet
                        continue
                    next_try = time.monotonic() + backoff
                    backoff = min(backoff * 2, BACKOFF_MAX_S)
            self._stop.wait(WATCH_S)
        return ""

    def _register(self, gen: _Generation) -> bool:
        request = pb.RegisterRequest(
            version=VERSION,
            endpoint=os.path.basename(gen.path),
            resource_name=self.resource_name,
            options=OPTIONS,
        )
        started = time.monotonic()
        try:
            with grpc.insecure_channel(f"unix:{self.kubelet_socket}") as channel:
                pb_grpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.RpcError as e:
            log.warning(
                "kubelet at %s did not take the registration (%s: %s); retrying",
                self.kubelet_socket,
                e.code(),
                e.details(),
            )
            return False
        self.registrations += 1
        log.info(
            "registered %s as %s with kubelet in %.0f ms",
            self.resource_name,
            request.endpoint,
            (time.monotonic() - started) * 1000,
        )
        return True

    def _stop_current(self) -> None:
        gen, self._current = self._current, None
        if gen is not None:
            gen.stop()


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cluster.gpu_plugin``: serve until SIGTERM/SIGINT, then remove the socket, exit 0."""
    p = argparse.ArgumentParser(
        prog="python -m cluster.gpu_plugin",
        description="A stand-in NVIDIA GPU device plugin for the test cluster.",
    )
    p.add_argument(
        "--device-plugin-dir",
        default=DEFAULT_DIR,
        help=f"kubelet's device-plugin directory (default {DEFAULT_DIR})",
    )
    p.add_argument("--count", type=int, default=8, help="GPUs (default 8)")
    p.add_argument("--numa-nodes", type=int, default=2, help="NUMA nodes (default 2)")
    p.add_argument("--roots", type=int, default=4, help="PCIe roots (default 4)")
    p.add_argument("--resource-name", default=RESOURCE, help=f"default {RESOURCE}")
    p.add_argument(
        "--socket-base",
        default=SOCKET_BASE,
        help=f"the socket's name up to -<ns>.sock (default {SOCKET_BASE})",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    a = p.parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if a.verbose else logging.INFO,
        format="%(asctime)s gpu-plugin %(levelname)s %(message)s",
    )
    try:
        gpus = layout(a.count, a.numa_nodes, a.roots)
    except ValueError as e:
        p.error(str(e))
    plugin = GpuPlugin(gpus, a.device_plugin_dir, a.resource_name, a.socket_base)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: stopping", signal.Signals(signum).name)
        plugin.stop(timeout=0)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("GPUs: %s", ", ".join(f"{g.id} (NUMA {g.numa}, {g.root})" for g in gpus))
    plugin.run()  # on the main thread: the signal handler runs between its short waits
    return 0


if __name__ == "__main__":
    sys.exit(main())
