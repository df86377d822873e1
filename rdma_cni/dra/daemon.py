"""The DRA driver process: one scan, the DRA and registration sockets, the health watch, and the
ResourceSlices kept current at no API cost while nothing changes.

The slices stay when the driver stops: a restart (an update, a crash) must not withdraw the node's
devices from the scheduler; they go with the Node, their owner.

Threads: the caller's thread watches the registration socket (re-served when something removed it:
kubelet's plugin watcher only sees sockets that exist), the watch (:class:`~.watch.NodeWatch`, the
device plugin's scan) re-scans on every link/address event and on the rescan timer and wakes the
publisher thread when the device table changed, which writes the slices (and retries every
``RETRY_S`` while the API server refuses or is away); the slice watch (:class:`~.live.SliceWatch`)
wakes it when our slices changed under us (kubelet wipes a node's slices at its start and after a
driver stayed away); gRPC has its own pools. Like the device plugin, the process never forks (gRPC's
threads).

Every config form the device plugin takes is served (:mod:`.table` says how each becomes devices):
without pools, the bonds of ``masters`` in both modes (TKE's ``mode: shared`` makes them
multi-allocatable instead of counting virtual devices); with ``pools:`` or Mellanox's
``config.json``, every member of every pool, bond or not, named by its pool. A config the device
plugin refuses at start, this driver refuses too: an HCA of an exclusive pool that another pool
selects stops the start with :class:`~rdma_cni.devices.errors.ConfigError` naming both (the CLI's
exit 2); one that appears later is left out of the other pool, as there.

    run(cfg, DriverPaths.under(cfg.kubelet_root_dir), "node-a", api, stop)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
from dataclasses import dataclass

from rdma_cni.cni.errors import CniError
from rdma_cni.devices import cdi, inventory
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.facts import BondFacts, read_facts
from rdma_cni.devices.inventory import NodeScan
from rdma_cni.dra import names
from rdma_cni.dra.driver import Driver
from rdma_cni.dra.kubeapi import ResourceClient
from rdma_cni.dra.live import LiveSlices, SliceWatch
from rdma_cni.dra.publish import SlicePublisher
from rdma_cni.dra.service import Registration, serve_dra, serve_registration
from rdma_cni.dra.slices import table_specs
from rdma_cni.dra.table import DeviceBoard, DeviceTable, scan_specs, table_for
from rdma_cni.dra.watch import NodeWatch
from rdma_cni.kube.sockets import socket_inode

log = logging.getLogger(__name__)

RETRY_S = 2.0  # a refused or failed publish is tried again this soon
# The bonds' facts are read again this often (a GID index or subnet may move without a link event);
# only local reads: the API server is asked nothing unless the slices must change.
REFRESH_S = 30.0
SOCKET_CHECK_S = 0.5
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL


@dataclass(frozen=True)
class DriverPaths:
    registration: str  # <kubelet root>/plugins_registry/<driver>-reg.sock
    dra: str  # <kubelet root>/plugins/<driver>/dra.sock
    state: str  # <kubelet root>/plugins/<driver>/claims: the prepared-claim records
    cdi_dir: str = cdi.SPEC_DIR

    @classmethod
    def under(cls, kubelet_root: str, cdi_dir: str = cdi.SPEC_DIR) -> DriverPaths:
        plugin = os.path.join(kubelet_root, "plugins", names.DRIVER)
        return cls(os.path.join(kubelet_root, "plugins_registry", f"{names.DRIVER}-reg.sock"),
                   os.path.join(plugin, "dra.sock"), os.path.join(plugin, "claims"), cdi_dir)


def sticky(before: dict[str, BondFacts], now: dict[str, BondFacts]) -> dict[str, BondFacts]:
    """``now``, keeping a bond's last known subnet while it has none: in exclusive mode the CNI lends
    the bond's address to the pod holding it, and the slice should not change at every pod start
    (nor lose the attribute a claim selected it by)."""
    out = {}
    for dev, facts in now.items():
        old = before.get(dev)
        if facts.ipv4_subnet is None and old is not None and old.ipv4_subnet is not None:
            facts = dataclasses.replace(facts, ipv4_subnet=old.ipv4_subnet)
        out[dev] = facts
    return out


class Publisher:
    """Publishes the board's table whenever :meth:`changed` is called, on its own thread."""

    def __init__(self, cfg: PluginConfig, board: DeviceBoard, slices: SlicePublisher,
                 refresh_s: float = REFRESH_S, retry_s: float = RETRY_S) -> None:
        self._cfg = cfg
        self._refresh_s = refresh_s
        self._retry_s = retry_s
        self._board = board
        self._slices = slices
        self._wake = threading.Event()
        self.published = threading.Event()  # set after the first successful publish
        self.failures = 0
        self.rounds = 0  # publishes tried, most of them compared and found the same
        self._facts: dict[str, BondFacts] = {}

    def changed(self) -> None:
        self._wake.set()

    def once(self) -> bool:
        """One publish of the current table; False (logged) when the API server failed it."""
        _, table = self._board.current()
        self.rounds += 1
        try:
            self._facts = sticky(self._facts, read_facts(self._cfg, table.bonds()))
            self._slices.publish(table_specs(self._slices.node, table, self._facts))
        except CniError as e:
            self.failures += 1
            log.warning("publishing ResourceSlices failed (%s); retrying in %gs", e.msg, self._retry_s)
            return False
        except Exception:  # netlink or sysfs half gone, or a bug: the thread must live on
            self.failures += 1
            log.exception("publishing ResourceSlices failed; retrying in %gs", self._retry_s)
            return False
        self.published.set()
        return True

    def run(self, stop: threading.Event) -> None:
        ok = False
        while not stop.is_set():
            self._wake.clear()
            ok = self.once()
            self._wake.wait(self._refresh_s if ok else self._retry_s)


def start_scan(cfg: PluginConfig) -> NodeScan:
    """The first scan: with pools, the device plugin's own (it refuses an HCA of an exclusive pool in
    another pool with a ConfigError and logs each pool); without, the bonds of masters."""
    if cfg.pools:
        return inventory.first_scan(cfg)
    return inventory.scan_pools(cfg, scan_specs(cfg))


def _log_devices(cfg: PluginConfig, first: NodeScan, table: DeviceTable) -> None:
    if not cfg.pools:
        bonds = first.bonds
        listed = ", ".join(f"{b.id}={b.netdev}/numa{b.numa}/{b.pcie_root}" for b in bonds.bonds)
        log.info("%d RDMA bonds (%d healthy), %s mode: %s", len(bonds.bonds),
                 sum(h.healthy for h in bonds.health), cfg.mode, listed or "none")
        return
    log.info("%d devices from %d pools (%d healthy): %s", len(table.devices), len(cfg.pools),
             sum(d.health.healthy for d in table.devices),
             ", ".join(f"{d.name}={d.device.id}/{d.pool}/numa{d.device.numa}/{d.device.pcie_root}"
                       for d in table.devices) or "none")


def run(cfg: PluginConfig, paths: DriverPaths, node: str, api: ResourceClient, stop: threading.Event) -> None:
    first = start_scan(cfg)
    board = DeviceBoard(table_for(cfg, first))
    _log_devices(cfg, first, board.current()[1])
    driver = Driver(cfg, node, board, api, paths.state, paths.cdi_dir)
    for path in driver.sweep_orphans():
        log.info("removed %s: a CDI spec of ours that no prepared claim names, or a cut-short write", path)
    live = LiveSlices()
    publisher = Publisher(cfg, board, SlicePublisher(api, node, live))
    watch = NodeWatch(cfg, board, first, on_change=publisher.changed)
    slice_watch = SliceWatch(api, node, live, on_change=publisher.changed)
    threads = [threading.Thread(target=watch.run, args=(stop,), name="dra-health", daemon=True),
               threading.Thread(target=publisher.run, args=(stop,), name="dra-publish", daemon=True),
               threading.Thread(target=slice_watch.run, args=(stop,), name="dra-slices", daemon=True)]
    for t in threads:
        t.start()
    for path in (paths.dra, paths.registration):
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise ValueError(f"{path} is longer than a unix socket path may be ({MAX_SOCKET_PATH} bytes): "
                             "use a shorter --kubelet-root-dir")
        os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
    _unlink(paths.dra)
    dra = serve_dra(driver, paths.dra, board)
    registration = Registration(paths.dra, with_health=True)
    reg = None
    try:
        while not stop.is_set():
            # reg[1] None: the socket was removed before its inode could be read, so serve again.
            if reg is None or reg[1] is None or socket_inode(paths.registration) != reg[1]:
                if reg is not None:
                    log.warning("%s was removed: serving it again for kubelet's plugin watcher",
                                paths.registration)
                    reg[0].stop(grace=0).wait(2.0)
                _unlink(paths.registration)
                server = serve_registration(registration, paths.registration)
                reg = (server, socket_inode(paths.registration))
                log.info("serving %s (DRA %s)", paths.registration, paths.dra)
            stop.wait(SOCKET_CHECK_S)
    finally:
        stop.set()
        publisher.changed()  # ends its wait for the next refresh
        slice_watch.stop()  # and the watch's wait for the server
        if reg is not None:
            reg[0].stop(grace=0).wait(2.0)
            if socket_inode(paths.registration) == reg[1]:
                _unlink(paths.registration)
        dra.stop(grace=1.0).wait(3.0)
        _unlink(paths.dra)
        for t in threads:
            t.join(cfg.rescan_interval_s + 2.0)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
