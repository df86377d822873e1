"""The device plugin's device-info files kept current in one directory (``--device-info-dir``,
default ``/var/run/k8s.cni.cncf.io/devinfo/dp``; ``""`` turns them off).

What the files hold and which devices get one is the device model's
(:mod:`rdma_cni.devices.devinfo`); this module writes them. Every change the health watch publishes
syncs the whole directory for all pools at once: a file is rewritten only when its content differs
(atomically: Multus may copy it at any moment), and a file of ours that no pool wants any more (a
bond gone, a pool shrunk, a pool dropped from the config) is removed. Ours are the files of the
pools served now (:func:`rdma_cni.devices.devinfo.is_ours`) and those an earlier run listed in
:data:`OWN_LIST` (``.rdma-device-plugin.json`` beside them), which is how a dropped pool's files are
known after a restart. Files of other device plugins are never touched. They stay
when the plugin stops: pods keep running and a restarted plugin rewrites the same content, while
removing them would leave an ADD in between without ``device-info``.

Best effort: a directory that cannot be written costs Multus's network-status its ``device-info``,
never a device, so an OSError is logged (once per cause) and the next change tries again.

    files = DeviceInfoDir("/var/run/k8s.cni.cncf.io/devinfo/dp", ["rdma/hca_shared_devices_a"])
    files.sync({"rdma/hca_shared_devices_a": snap})   # (written, removed) counts
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping

from rdma_cni import durable
from rdma_cni.devices import devinfo
from rdma_cni.devices.pools import PoolSnapshot

log = logging.getLogger(__name__)

OWN_LIST = ".rdma-device-plugin.json"  # the names this plugin wrote; Multus reads only *-device.json
FILE_MODE = 0o644  # Multus (root) reads them; they hold nothing secret
DIR_MODE = 0o755


class DeviceInfoDir:
    """The device-info files of ``resource_names`` in ``directory``."""

    def __init__(self, directory: str, resource_names: Iterable[str]) -> None:
        self.directory = directory
        self._resources = tuple(resource_names)
        self._failed = ""

    def sync(self, pools: Mapping[str, PoolSnapshot]) -> tuple[int, int]:
        """Make the directory hold exactly the files ``pools`` want among ours; (written, removed)."""
        wanted = devinfo.wanted_files(pools)
        written = removed = 0
        own = os.path.join(self.directory, OWN_LIST)
        try:
            os.makedirs(self.directory, mode=DIR_MODE, exist_ok=True)
            listed = _listed(own)
            if listed != sorted(wanted):  # listed first: a crash between leaves no file unowned
                durable.atomic_write_json(own, sorted(set(listed) | set(wanted)), mode=FILE_MODE,
                                          dir_mode=DIR_MODE, sync=False)
            for name, doc in wanted.items():
                data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode() + b"\n"
                path = os.path.join(self.directory, name)
                if _read(path) != data:
                    # /var/run is a tmpfs: no fsync, the files go with a reboot and are made again
                    durable.atomic_write(path, data, mode=FILE_MODE, dir_mode=DIR_MODE, sync=False)
                    written += 1
            for name in os.listdir(self.directory):
                if name in wanted or not (name in listed or devinfo.is_ours(name, self._resources)):
                    continue
                if not name.endswith(devinfo.SUFFIX):
                    continue
                try:
                    os.unlink(os.path.join(self.directory, name))
                    removed += 1
                except FileNotFoundError:
                    pass
            if listed != sorted(wanted):
                durable.atomic_write_json(own, sorted(wanted), mode=FILE_MODE, dir_mode=DIR_MODE, sync=False)
        except OSError as e:
            cause = f"{type(e).__name__}:{e.errno}"
            if cause != self._failed:
                log.warning("device-info files in %s not kept current (%s); Multus's network-status "
                            "lacks device-info until a later change succeeds", self.directory, e)
            self._failed = cause
            return written, removed
        if self._failed:
            log.info("device-info files in %s current again", self.directory)
        self._failed = ""
        if written or removed:
            log.info("device-info files in %s: %d written, %d removed (%d held)", self.directory,
                     written, removed, len(wanted))
        return written, removed


def _listed(path: str) -> list[str]:
    """The names an earlier sync wrote; [] when the list is absent or unreadable."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return []
    return sorted(n for n in doc if isinstance(n, str) and "/" not in n) if isinstance(doc, list) else []


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None
