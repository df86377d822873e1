"""The device plugin process: one scan, then the health watch and one registration loop per pool.

Threads: the caller's thread runs the first pool's registration loop
(:class:`~.registration.Lifecycle`), every further pool's loop has a thread of its own, one thread
runs the health watch (one scan for all pools), and gRPC has its own pool per socket. This process
never forks: gRPC's threads and a fork do not mix, which is why the plugin is not part of
``rdma-agent`` (it forks workers).

With ``--cdi`` (:mod:`.cdi`), each pool's CDI spec is written before its first registration,
synced on every change the health watch publishes, and left in place at stop. The NPWG device-info
files for Multus (:mod:`.devinfo`) follow the same changes, unless ``deviceInfoDir`` is ``""``.

Usage::

    stop = threading.Event()
    run(cfg, stop)     # until stop is set; the own sockets are removed and the status says so
    run(cfg, stop, cdi_config(cfg.pool_specs(), "/var/run/cdi"))   # Allocate answers CDI names
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from rdma_cni.deviceplugin.cdi import CdiConfig, PoolCdi, sweep_dropped
from rdma_cni.deviceplugin.devinfo import DeviceInfoDir
from rdma_cni.deviceplugin.registration import Lifecycle, socket_base
from rdma_cni.deviceplugin.server import Board
from rdma_cni.deviceplugin.status import StatusFile, status_path
from rdma_cni.deviceplugin.watch import HealthWatch
from rdma_cni.devices import inventory
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.inventory import NodeScan, Snapshot
from rdma_cni.devices.pools import PoolSnapshot, PoolSpec

log = logging.getLogger(__name__)


def socket_bases(specs: tuple[PoolSpec, ...]) -> dict[str, str]:
    """Each pool's socket name start: the resource's last part (``tke-shared-rdma``), or the whole
    name with ``/`` as ``_`` where two pools share a last part."""
    short = Counter(socket_base(s.resource_name) for s in specs)
    return {
        s.resource_name: socket_base(s.resource_name)
        if short[socket_base(s.resource_name)] == 1
        else s.resource_name.replace("/", "_")
        for s in specs
    }


def cdi_specs(cfg: PluginConfig, cdi: CdiConfig, scan: NodeScan) -> dict[str, PoolCdi]:
    """Each pool's CDI spec, written from the first scan (an OSError when the dir is not writable
    stops the start: Allocate could name nothing); dropped pools' specs swept."""
    specs = {name: PoolCdi(cfg, cdi.spec_dir, kind) for name, kind in cdi.kinds.items()}
    for name, spec in specs.items():
        held = spec.sync(scan.pools[name])
        log.info("%s: Allocate answers CDI devices of kind %s from %s (%d devices)", name, spec.kind,
                 spec.path, len(held))
    sweep_dropped(cdi.spec_dir, cdi.kinds.values(), cfg.pod_resources_dir)
    return specs


def run(cfg: PluginConfig, stop: threading.Event, cdi: CdiConfig | None = None, pod_status: str = "") -> None:
    """``pod_status``: where this process also writes its status document (status.py: the DaemonSet's
    readiness reads it; the node's status.json is the node's newest plugin's)."""
    specs = cfg.pool_specs()
    scan = inventory.first_scan(cfg)
    cdis = cdi_specs(cfg, cdi, scan) if cdi is not None else {}
    boards = {s.resource_name: Board(scan.pools[s.resource_name]) for s in specs}
    status = StatusFile(
        status_path(cfg.run_dir),
        cfg.resource_name,
        specs if cfg.pools or len(specs) > 1 or specs[0].shared else (),
        copy=pod_status,
    )
    pools = {s.resource_name: status.pool(s.resource_name) for s in specs}
    single = "pools" not in status.snapshot()
    names = [s.resource_name for s in specs]
    infos = DeviceInfoDir(cfg.device_info_dir, names) if cfg.device_info_dir else None
    current = dict(scan.pools)

    def changed(name: str, snap: PoolSnapshot) -> None:
        if single and isinstance(snap, Snapshot):
            status.devices(snap)
        else:
            pools[name].snapshot(snap)
        if name in cdis:
            try:
                cdis[name].sync(snap)
            except OSError as e:  # the next change or Allocate tries again (and says so to kubelet)
                log.warning("CDI spec %s not rewritten: %s", cdis[name].path, e)
        current[name] = snap
        if infos is not None:
            infos.sync(current)

    for s in specs:
        changed(s.resource_name, scan.pools[s.resource_name])
    watch = HealthWatch(cfg, boards, scan, on_change=changed)
    watcher = threading.Thread(target=watch.run, args=(stop,), name="dp-health", daemon=True)
    watcher.start()
    bases = socket_bases(specs)
    loops = [
        Lifecycle(
            cfg,
            boards[s.resource_name],
            status if single else pools[s.resource_name],
            s.resource_name,
            bases[s.resource_name],
            cdis.get(s.resource_name),
        )
        for s in specs
    ]
    others = [
        threading.Thread(target=loop.run, args=(stop,), name=f"dp-reg-{i + 1}", daemon=True)
        for i, loop in enumerate(loops[1:])
    ]
    for t in others:
        t.start()
    try:
        loops[0].run(stop)
    finally:
        stop.set()
        for t in others:
            t.join(5.0)
        watcher.join(cfg.rescan_interval_s + 2.0)
        status.close()  # the last state (registered: false) is on disk before the process exits
