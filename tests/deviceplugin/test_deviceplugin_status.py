"""The device plugin's status file: every change reaches the file, concurrent Allocates count right,
readers never see a torn file, and the last state is on disk once ``close`` returns."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from rdma_cni.deviceplugin.status import StatusFile, status_path
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot


def test_concurrent_changes_all_land_and_close_flushes(tmp_path: Path) -> None:
    path = status_path(str(tmp_path / "run"))
    status = StatusFile(path, "tke.cloud.tencent.com/tke-shared-rdma")
    snap = Snapshot(bonds=(RdmaBond("mlx5_bond_0", "bond0", 1, 1, "uverbs0"),),
                    health=(DeviceHealth("mlx5_bond_0", False, "bond bond0 is down"),))
    status.devices(snap)
    torn: list[str] = []
    stop = threading.Event()

    def read() -> None:  # a doctor reading while the plugin writes
        while not stop.is_set():
            try:
                json.loads(Path(path).read_text())
            except FileNotFoundError:
                continue
            except ValueError as e:
                torn.append(str(e))

    reader = threading.Thread(target=read)
    reader.start()
    workers = [threading.Thread(target=lambda: [status.count_allocations(1) for _ in range(200)])
               for _ in range(8)]
    for w in workers:
        w.start()
    status.registered("tke-shared-rdma-1.sock")
    for w in workers:
        w.join()
    status.update(registered=False)
    status.close()
    stop.set()
    reader.join()
    doc = json.loads(Path(path).read_text())
    assert torn == []
    assert doc["allocations"] == 1600 and doc["registrations"] == 1
    assert doc["registered"] is False and doc["endpoint"] == "tke-shared-rdma-1.sock"
    assert doc["devices"] == [{"id": "mlx5_bond_0", "netdev": "bond0", "numa": 1, "healthy": False,
                               "reason": "bond bond0 is down"}]
    assert (Path(path).stat().st_mode & 0o777) == 0o644
