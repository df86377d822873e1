"""When a front end's watch (the device plugin's, the DRA driver's) scans the node again.

A bond going down, losing its address or disappearing is a netlink event: the watch scans at once.
What has no event is an RDMA port's state (InfiniBand's above all: RoCE's follows the bond's link),
an RDMA device appearing or leaving sysfs without its netdev changing, and a uverbs node under
/dev. A full scan (:func:`~rdma_cni.devices.inventory.scan_pools`) reads every bond's sysfs, the
records and a netlink dump: ~2-4 ms of CPU, which every 0.5 s was the device plugin's whole idle
cost (8 millicores). So on the timer the pacer only *looks* at what has no event (:func:`quiet_facts`:
one directory listing, one small read and one stat per device, ~0.2 ms) and asks for a full scan when
that changed, and every ``full_every`` seconds whatever it says (a safety net for what neither covers,
e.g. a device's NUMA node or PCI parent).

Usage (in a watch's loop)::

    pacer = RescanPacer(cfg, first_scan)
    evented = True  # what changed since the first scan sent the new subscription no event
    while not stop.is_set():
        if pacer.due(evented):
            pacer.scanned(rescan())
        evented = events.wait(cfg.rescan_interval_s)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.inventory import NodeScan, dev_path, is_char_device, port_state
from rdma_cni.devices.pools import SharedSnapshot
from rdma_cni.rdma import sysfs

FULL_EVERY_S = 60.0

Facts = tuple[tuple[str, ...], tuple[tuple[str, str, bool], ...]]


def quiet_facts(cfg: PluginConfig, scan: NodeScan) -> Facts:
    """What can change without a netlink event, for the devices ``scan`` knows: the RDMA devices in
    sysfs, and each known port's state and uverbs node."""
    present = tuple(sorted(sysfs.list_devices(cfg.sysfs_root)))
    seen: dict[str, tuple[int, str | None]] = {b.id: (b.port, b.uverbs) for b in scan.bonds.bonds}
    for snap in scan.pools.values():
        if isinstance(snap, SharedSnapshot):
            seen.update({h.id: (h.port, h.uverbs) for h in snap.hcas})
    looks = []
    for device, (port, uverbs) in sorted(seen.items()):
        node_ok = uverbs is not None and is_char_device(dev_path(cfg, uverbs))
        looks.append((device, port_state(cfg.sysfs_root, device, port), node_ok))
    return present, tuple(looks)


class RescanPacer:
    """Decides, after each wait of a watch, whether a full scan is due (see the module doc)."""

    def __init__(
        self,
        cfg: PluginConfig,
        first: NodeScan,
        full_every: float = FULL_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._cfg = cfg
        self._full_every = full_every
        self._clock = clock
        self.looks = 0  # quick looks that found nothing new: for the bench and the tests
        self._scan = first
        self._facts = quiet_facts(cfg, first)
        self._at = clock()

    def due(self, evented: bool) -> bool:
        """True when the watch should scan now: a netlink event came, what has no event changed, or
        the last full scan is ``full_every`` old. The look is taken before the scan it asks for, so a
        change that lands while that scan runs differs from it and is scanned at the next look."""
        facts = quiet_facts(self._cfg, self._scan)
        if evented or self._clock() - self._at >= self._full_every or facts != self._facts:
            self._facts = facts
            return True
        self.looks += 1
        return False

    def scanned(self, scan: NodeScan) -> None:
        """The watch scanned (successfully or not: ``scan`` is what it keeps)."""
        self._scan = scan
        self._at = self._clock()
