"""The device plugin's status file: what it told kubelet, for ``cni-tool doctor`` and the metrics.

``<run_dir>/device-plugin/status.json``, rewritten atomically (rdma_cni.durable) on every change, so
a reader in another process never sees a torn file::

    {"resourceName": "tke.cloud.tencent.com/tke-shared-rdma", "registered": true, "registrations": 3,
     "endpoint": "tke-shared-rdma-1700000000123.sock", "pid": 4242, "updated": 1700000000.5,
     "allocations": 7,
     "devices": [{"id": "mlx5_bond_0", "netdev": "bond0", "numa": 0, "healthy": true, "reason": ""}]}

Usage::

    status = StatusFile(status_path(cfg.run_dir), cfg.resource_name)
    status.devices(snap); status.update(registered=True, endpoint="...")
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from rdma_cni import durable
from rdma_cni.deviceplugin.inventory import Snapshot


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


class StatusFile:
    """The document in memory plus its file; ``update`` writes only when a field really changed."""

    def __init__(self, path: str, resource_name: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._doc: dict[str, Any] = {
            "resourceName": resource_name, "registered": False, "registrations": 0, "endpoint": "",
            "pid": os.getpid(), "updated": 0.0, "allocations": 0, "devices": [],
        }

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
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

    def _change(self, fields_of: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Apply ``fields_of(current)`` and write, all under the lock: concurrent Allocates count right."""
        with self._lock:
            new = {**self._doc, **fields_of(self._doc)}
            if new == self._doc and self._doc["updated"]:
                return
            new["updated"] = time.time()
            self._doc = new
            # Readable by the doctor and the metrics (same node); sync=False: a reader survives its loss.
            durable.atomic_write_json(self.path, new, mode=0o644, dir_mode=0o755, sync=False)
