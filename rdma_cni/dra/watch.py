"""Keep the driver's device table current: re-scan on every link/address event and on the rescan
timer, as the device plugin's :class:`~rdma_cni.deviceplugin.watch.HealthWatch` does, with the same
scan (:func:`rdma_cni.devices.inventory.scan_pools`).

Why not that watch itself: it hands each pool's snapshot to that pool's board, while a DRA table is
made of the whole scan (a shared pool's HCA is a bond only by the node's bonds, and names are
unique across pools). One scan, one table (:func:`rdma_cni.dra.table.table_for`), published to the
board only when it differs; ``on_change`` then wakes the slice publisher.

    NodeWatch(cfg, board, first, on_change=publisher.changed).run(stop_event)   # on its own thread
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from rdma_cni.devices import inventory
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.inventory import NodeScan
from rdma_cni.devices.rescan import RescanPacer
from rdma_cni.dra.table import DeviceBoard, DeviceTable, scan_specs, table_for
from rdma_cni.net.events import LinkEvents

log = logging.getLogger(__name__)


class NodeWatch:
    """``cfg``: what to scan (:func:`~rdma_cni.dra.table.scan_specs`) and which table form; ``first``:
    the scan ``board``'s table was made from."""

    def __init__(self, cfg: PluginConfig, board: DeviceBoard, first: NodeScan,
                 on_change: Callable[[], None] | None = None) -> None:
        self._cfg = cfg
        self._specs = scan_specs(cfg)
        self._board = board
        self._last = first
        self._on_change = on_change
        self._failing = False
        self.scans = 0

    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set (checked at least every rescan interval)."""
        with LinkEvents() as events:
            # On the timer a quick look, a full scan if needed (RescanPacer). First a scan: what
            # changed between the first scan and this subscription sent it no event.
            pacer = RescanPacer(self._cfg, self._last)
            evented = True
            while not stop.is_set():
                if pacer.due(evented):
                    self.rescan()
                    pacer.scanned(self._last)
                evented = events.wait(self._cfg.rescan_interval_s)

    def rescan(self) -> bool:
        """One scan; True when it changed the table."""
        try:
            scan = inventory.scan_pools(self._cfg, self._specs, previous=self._last)
        except Exception as e:  # a half-written sysfs or a vanished netdev: keep the last good table
            if not self._failing:
                log.warning("device scan failed (%s); keeping the last devices until a scan succeeds", e,
                            exc_info=True)
            self._failing = True
            return False
        if self._failing:
            log.info("device scan works again")
            self._failing = False
        self.scans += 1
        self._last = scan
        _, before = self._board.current()
        table = table_for(self._cfg, scan)
        if not self._board.publish(table):
            return False
        log_changes(before, table)
        if self._on_change is not None:
            self._on_change()
        return True


def log_changes(before: DeviceTable, after: DeviceTable) -> None:
    """One line per device that came, went, or changed health."""
    old = before.by_name
    for dev in after.devices:
        was = old.get(dev.name)
        if was is None:
            log.info("device %s (%s) appeared%s", dev.name, dev.device.id,
                     f" in pool {dev.pool}" if dev.pool else "")
        if was is None or was.health != dev.health:
            log.info("device %s: %s", dev.name,
                     "Healthy" if dev.health.healthy else f"Unhealthy ({dev.health.reason})")
    for name in old.keys() - after.by_name.keys():
        log.info("device %s (%s) is gone", name, old[name].device.id)
