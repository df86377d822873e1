"""Keep every pool's snapshot current: re-scan on every link/address event and on a short timer.

The bond going down, losing its IPv4 address or disappearing arrives as a netlink event within
milliseconds; the RDMA port state and the uverbs node have no event, so a rescan every
``cfg.rescan_interval_s`` (0.5 s by default) looks for them (:mod:`rdma_cni.devices.rescan`: a quick look,
a full scan when it changed or every minute). One scan serves every pool
(:func:`~rdma_cni.devices.inventory.scan_pools`); each pool's change is published to its
:class:`~rdma_cni.deviceplugin.server.Board` (which wakes its ListAndWatch streams) only when its
snapshot differs, well within kubelet's 1 s budget.

Usage::

    HealthWatch(cfg, boards, on_change=lambda name, snap: ...).run(stop_event)   # on its own thread
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from rdma_cni.deviceplugin.server import Board
from rdma_cni.devices import inventory
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.inventory import NodeScan, Snapshot
from rdma_cni.devices.pools import PoolSnapshot, SharedSnapshot
from rdma_cni.devices.rescan import RescanPacer
from rdma_cni.net.events import LinkEvents

log = logging.getLogger(__name__)


class HealthWatch:
    """Re-runs :func:`inventory.scan_pools` on events and on the rescan timer; publishes real changes.
    ``boards``: resource name -> its pool's board; ``first``: the scan the boards were made from."""

    def __init__(
        self,
        cfg: PluginConfig,
        boards: Mapping[str, Board],
        first: NodeScan,
        on_change: Callable[[str, PoolSnapshot], None] | None = None,
    ) -> None:
        self._cfg = cfg
        self._specs = cfg.pool_specs()
        self._boards = boards
        self._last = first
        self._on_change = on_change
        self._failing = False
        self.scans = 0  # for the bench and the logs

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
        """One scan; True when it changed any pool's published snapshot."""
        try:
            scan = inventory.scan_pools(self._cfg, self._specs, previous=self._last)
        except Exception as e:  # a half-written sysfs or a vanished netdev: keep the last good lists
            if not self._failing:
                log.warning(
                    "device scan failed (%s); keeping the last lists until a scan succeeds", e, exc_info=True
                )
            self._failing = True
            return False
        if self._failing:
            log.info("device scan works again")
            self._failing = False
        self.scans += 1
        before, self._last = self._last, scan
        changed = False
        for name, board in self._boards.items():
            snap = scan.pools[name]
            if not board.publish(snap):
                continue
            changed = True
            _log_changes(name, before.pools.get(name), snap)
            if self._on_change is not None:
                self._on_change(name, snap)
        return changed


def _log_changes(name: str, old: PoolSnapshot | None, new: PoolSnapshot) -> None:
    if isinstance(new, Snapshot):
        for dev, health in inventory.health_changes(old if isinstance(old, Snapshot) else None, new).items():
            log.info("device %s: %s", dev, "Healthy" if health.healthy else f"Unhealthy ({health.reason})")
        return
    was = {h.id: h for h in old.health} if isinstance(old, SharedSnapshot) else {}
    for h in new.health:
        if was.get(h.id) != h:
            log.info("%s: HCA %s %s", name, h.id, "Healthy" if h.healthy else f"Unhealthy ({h.reason})")
    if not isinstance(old, SharedSnapshot) or old.healthy != new.healthy:
        log.log(
            logging.INFO if new.healthy else logging.WARNING,
            "%s: %d devices %s (%d of %d HCAs usable)",
            name,
            new.count,
            "Healthy" if new.healthy else "Unhealthy",
            sum(h.healthy for h in new.health),
            len(new.hcas),
        )
