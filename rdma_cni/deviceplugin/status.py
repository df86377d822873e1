"""The device plugin's status file: what it told kubelet, for ``cni-tool doctor`` and the metrics.

``<run_dir>/device-plugin/status.json``, rewritten atomically (rdma_cni.durable) on every change, so
a reader in another process never sees a torn file::

    {"resourceName": "tke.cloud.tencent.com/tke-shared-rdma", "registered": true, "registrations": 3,
     "endpoint": "tke-shared-rdma-1700000000123.sock", "pid": 4242, "updated": 1700000000.5,
     "allocations": 7,
     "devices": [{"id": "mlx5_bond_0", "netdev": "bond0", "numa": 0, "healthy": true, "reason": ""}],
     "pools": [{"resourceName": ..., "mode": "exclusive", "count": 8, "healthy": true, "registered": true,
                "registrations": 3, "endpoint": ..., "allocations": 7, "devices": [...]},
               {"resourceName": "rdma/hca_shared_devices_a", "mode": "shared", "count": 200,
                "healthy": true, ..., "hcas": [{"id": "mlx5_4", "netdevs": ["ibs108"], "linkLayer":
                "InfiniBand", "pci": "0000:1b:00.0", "numa": 1, "healthy": true, "reason": ""}]}]}

The top-level fields are the first pool's (with one pool, the file reads as it always did);
``pools`` has every pool, each updated through its own :class:`PoolStatus`.

During a rolling update two plugin processes run on the node (the DaemonSet's surge pod beside the
old one) and share this path. The newest one owns it: a process does not write while the file is
another living process's that started after it (``pid``, ``started``), checked and written under
``status.json.lock``. So the old plugin's last words (``registered: false`` as it stops) never
overwrite the new one's; if the new one dies first, the old one's next change takes the file back.
The DaemonSet's readiness must know whether *its own* plugin registered, which the node's file cannot
say while the old plugin still runs: ``copy`` (``--pod-status``) is this process's document, written
on every change to a directory of the pod's own.

Usage::

    status = StatusFile(status_path(cfg.run_dir), cfg.resource_name, cfg.pool_specs())
    pool = status.pool("rdma/hca_shared_devices_a")
    pool.snapshot(snap); pool.registered("hca_shared_devices_a-1700….sock")
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rdma_cni import durable
from rdma_cni.devices.inventory import Snapshot
from rdma_cni.devices.pools import PoolSnapshot, PoolSpec, SharedSnapshot

log = logging.getLogger(__name__)


def status_path(run_dir: str) -> str:
    return os.path.join(run_dir, "device-plugin", "status.json")


def device_rows(snap: Snapshot) -> list[dict[str, Any]]:
    health = {h.id: h for h in snap.health}
    rows = []
    for bond in snap.bonds:
        h = health.get(bond.id)
        rows.append({"id": bond.id, "netdev": bond.netdev, "numa": bond.numa,
                     "healthy": bool(h and h.healthy), "reason": h.reason if h else "no health known"})
    return rows


def hca_rows(snap: SharedSnapshot) -> list[dict[str, Any]]:
    health = {h.id: h for h in snap.health}
    rows = []
    for hca in snap.hcas:
        h = health.get(hca.id)
        rows.append({"id": hca.id, "netdev": hca.netdev, "netdevs": list(hca.netdevs),
                     "linkLayer": hca.link_layer, "pci": hca.pci, "numa": hca.numa,
                     "healthy": bool(h and h.healthy), "reason": h.reason if h else "no health known"})
    return rows


def pool_fields(snap: PoolSnapshot) -> dict[str, Any]:
    """What a pool's entry says of its snapshot: its count, health and members."""
    if isinstance(snap, SharedSnapshot):
        return {"count": snap.count, "healthy": snap.healthy, "hcas": hca_rows(snap)}
    rows = device_rows(snap)
    return {"count": len(rows), "healthy": any(r["healthy"] for r in rows), "devices": rows}


class StatusFile:
    """The document in memory plus its file. ``update`` changes the document (only when a field really
    changed) and wakes a writer thread, which writes the latest document: an Allocate never waits for
    a file write, a burst of changes is one write, and readers always get a whole, recent file.
    ``close`` writes what is pending and stops the writer."""

    def __init__(self, path: str, resource_name: str, pools: Sequence[PoolSpec] = (), copy: str = "") -> None:
        self.path = path
        self.copy = copy  # this process's own copy (a pod's directory), "" for none: see the module doc
        self._cond = threading.Condition()
        first = pools[0].resource_name if pools else resource_name
        self._doc: dict[str, Any] = {
            "resourceName": first, "registered": False, "registrations": 0, "endpoint": "",
            "pid": os.getpid(), "started": time.time(), "updated": 0.0, "allocations": 0, "devices": [],
        }
        self._yielded = False
        if pools:
            self._doc["pools"] = [
                {"resourceName": p.resource_name, "mode": p.mode, "count": p.count,
                 "selection": p.selection(),
                 "healthy": False, "registered": False, "registrations": 0, "endpoint": "",
                 "allocations": 0}
                for p in pools
            ]
        self._version = 0
        self._closed = False
        self._failed = False
        self._writer = threading.Thread(target=self._write_loop, name="dp-status", daemon=True)
        self._writer.start()

    def snapshot(self) -> dict[str, Any]:
        with self._cond:
            return dict(self._doc)

    def update(self, **fields: Any) -> None:
        self._change(lambda doc: fields)

    def devices(self, snap: Snapshot) -> None:
        self.update(devices=device_rows(snap))

    def registered(self, endpoint: str) -> None:
        self._change(lambda doc: {"registered": True, "endpoint": endpoint,
                                  "registrations": doc["registrations"] + 1})

    def count_allocations(self, n: int) -> None:
        self._change(lambda doc: {"allocations": doc["allocations"] + n})

    def pool(self, resource_name: str) -> PoolStatus:
        return PoolStatus(self, resource_name)

    def change_pool(self, resource_name: str, fields_of: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Apply ``fields_of(entry)`` to the pool's entry; the first pool's also to the top level."""

        def change(doc: dict[str, Any]) -> dict[str, Any]:
            pools = [dict(p) for p in doc.get("pools", [])]
            top: dict[str, Any] = {}
            for i, entry in enumerate(pools):
                if entry["resourceName"] == resource_name:
                    new = fields_of(entry)
                    entry.update(new)
                    if i == 0:
                        top = {k: v for k, v in new.items() if k in doc or k == "hcas"}
                        if "hcas" in new:  # the top level's devices: a shared first pool's HCAs
                            top["devices"] = top.pop("hcas")
            return {**top, "pools": pools}

        self._change(change)

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._writer.join(timeout)

    def _change(self, fields_of: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Apply ``fields_of(current)`` under the lock: concurrent Allocates count right."""
        with self._cond:
            new = {**self._doc, **fields_of(self._doc)}
            if new == self._doc and self._doc["updated"]:
                return
            new["updated"] = time.time()
            self._doc = new
            self._version += 1
            self._cond.notify_all()

    def _write_loop(self) -> None:
        written = 0
        while True:
            with self._cond:
                while self._version == written and not self._closed:
                    self._cond.wait()
                if self._version == written:
                    return  # closed, nothing pending
                doc, written = dict(self._doc), self._version
            self._write(doc)

    def _write(self, doc: dict[str, Any]) -> None:
        self._write_node(doc)
        if self.copy:
            try:
                durable.atomic_write_json(self.copy, doc, mode=0o644, dir_mode=0o755, sync=False)
            except OSError as e:
                log.warning("cannot write %s (%s)", self.copy, e)

    def _write_node(self, doc: dict[str, Any]) -> None:
        try:
            with _locked(self.path + ".lock"):
                owner = newer_owner(self.path, doc["started"])
                if owner:
                    if not self._yielded:
                        log.info("%s is the newer device plugin's (pid %d): not written", self.path, owner)
                    self._yielded = True
                    return
                self._yielded = False
                # Readable by the doctor and the metrics (same node); sync=False: a reader survives
                # its loss.
                durable.atomic_write_json(self.path, doc, mode=0o644, dir_mode=0o755, sync=False)
        except OSError as e:  # the doctor loses its view, kubelet loses nothing
            if not self._failed:
                log.warning("cannot write %s (%s); the device plugin goes on without it", self.path, e)
            self._failed = True
        else:
            self._failed = False


def newer_owner(path: str, started: float) -> int:
    """The pid of the living plugin process that started after ``started`` and wrote ``path`` last;
    0 when there is none (the file is ours, an older one's, a dead one's, or unreadable)."""
    try:
        with open(path) as f:
            doc = json.load(f)
        pid, their_start = int(doc.get("pid", 0)), float(doc.get("started", 0.0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0
    if pid <= 0 or pid == os.getpid() or their_start <= started:
        return 0
    return pid if _alive(pid) else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """flock of ``path`` (created): one writer of the status file at a time across processes."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class PoolStatus:
    """One pool's part of the status file, with the calls the registration loop makes."""

    def __init__(self, status: StatusFile, resource_name: str) -> None:
        self._status = status
        self._name = resource_name

    def update(self, **fields: Any) -> None:
        self._status.change_pool(self._name, lambda entry: fields)

    def snapshot(self, snap: PoolSnapshot) -> None:
        self._status.change_pool(self._name, lambda entry: pool_fields(snap))

    def registered(self, endpoint: str) -> None:
        self._status.change_pool(self._name, lambda e: {"registered": True, "endpoint": endpoint,
                                                        "registrations": e["registrations"] + 1})

    def count_allocations(self, n: int) -> None:
        self._status.change_pool(self._name, lambda e: {"allocations": e["allocations"] + n})
