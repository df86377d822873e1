"""The device plugin process: one scan, then the health watch and the registration loop side by side.

Threads: the caller's thread runs the registration loop (:class:`~.registration.Lifecycle`), one
thread runs the health watch, and gRPC has its own pool. This process never forks: gRPC's threads
and a fork do not mix, which is why the plugin is not part of ``rdma-agent`` (it forks workers).

Usage::

    stop = threading.Event()
    run(cfg, stop)     # until stop is set; the own socket is removed and the status says so
"""

from __future__ import annotations

import logging
import threading

from rdma_cni.deviceplugin import inventory
from rdma_cni.deviceplugin.config import PluginConfig
from rdma_cni.deviceplugin.registration import Lifecycle
from rdma_cni.deviceplugin.server import Board
from rdma_cni.deviceplugin.status import StatusFile, status_path
from rdma_cni.deviceplugin.watch import HealthWatch

log = logging.getLogger(__name__)


def run(cfg: PluginConfig, stop: threading.Event) -> None:
    snap = inventory.scan(cfg)
    healthy = sum(1 for h in snap.health if h.healthy)
    log.info("%s: %d devices (%d healthy): %s", cfg.resource_name, len(snap.bonds), healthy,
             ", ".join(f"{b.id}={b.netdev}/numa{b.numa}" for b in snap.bonds) or "none")
    board = Board(snap)
    status = StatusFile(status_path(cfg.run_dir), cfg.resource_name)
    status.devices(snap)
    watch = HealthWatch(cfg, board, on_change=status.devices)
    watcher = threading.Thread(target=watch.run, args=(stop,), name="dp-health", daemon=True)
    watcher.start()
    try:
        Lifecycle(cfg, board, status).run(stop)
    finally:
        stop.set()
        watcher.join(cfg.rescan_interval_s + 2.0)
        status.close()  # the last state (registered: false) is on disk before the process exits
