"""Keep the device snapshot current: re-scan on every link/address event and on a short timer.

The bond going down, losing its IPv4 address or disappearing arrives as a netlink event within
milliseconds; the RDMA port state and the uverbs node have no event, so a rescan every
``cfg.rescan_interval_s`` (0.5 s by default) catches them. Either way a change is published to the
:class:`~rdma_cni.deviceplugin.server.Board` (which wakes every ListAndWatch stream) only when the
snapshot differs, well within kubelet's 1 s budget.

Usage::

    HealthWatch(cfg, board, on_change=status.devices).run(stop_event)   # on its own thread
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from rdma_cni.deviceplugin import inventory
from rdma_cni.deviceplugin.config import PluginConfig
from rdma_cni.deviceplugin.inventory import Snapshot
from rdma_cni.deviceplugin.server import Board
from rdma_cni.net.events import LinkEvents

log = logging.getLogger(__name__)


class HealthWatch:
    """Re-runs :func:`inventory.scan` on events and on the rescan timer; publishes real changes."""

    def __init__(self, cfg: PluginConfig, board: Board,
                 on_change: Callable[[Snapshot], None] | None = None) -> None:
        self._cfg = cfg
        self._board = board
        self._on_change = on_change
        self._failing = False
        self.scans = 0  # for the bench and the logs

    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set (checked at least every rescan interval)."""
        with LinkEvents() as events:
            while not stop.is_set():
                events.wait(self._cfg.rescan_interval_s)
                self.rescan()

    def rescan(self) -> bool:
        """One scan; True when it changed the published snapshot."""
        _, old = self._board.current()
        try:
            snap = inventory.scan(self._cfg, previous=old)  # a vanished bond stays, Unhealthy
        except Exception as e:  # a half-written sysfs or a vanished netdev: keep the last good list
            if not self._failing:
                log.warning("device scan failed (%s); keeping the last list until a scan succeeds", e,
                            exc_info=True)
            self._failing = True
            return False
        if self._failing:
            log.info("device scan works again")
            self._failing = False
        self.scans += 1
        if not self._board.publish(snap):
            return False
        for dev, health in inventory.health_changes(old, snap).items():
            log.info("device %s: %s", dev, "Healthy" if health.healthy else f"Unhealthy ({health.reason})")
        if self._on_change is not None:
            self._on_change(snap)
        return True
