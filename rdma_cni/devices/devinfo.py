"""The device-info files a device plugin leaves for Multus: which files, holding what, for each device
it serves. A pure function of the pools' snapshots; :mod:`rdma_cni.deviceplugin.devinfo` writes them.

The NPWG Device Information spec lets a device plugin describe each device it hands out in
``/var/run/k8s.cni.cncf.io/devinfo/dp/<resourceName, "/" as "-">-<deviceID>-device.json``. Upstream
Multus copies the file of the device ID it passes to a delegate (a NAD with
``k8s.v1.cni.cncf.io/resourceName``) and puts it into the pod's network-status as ``device-info``.
Multus reads the file into the NPWG client's ``DeviceInfo`` type, whose only kind naming an RDMA
device is ``pci`` (``pci-address`` and ``rdma-device``): an ``rdma`` object of its own would be
dropped on the way, so each file is ``pci``, as rdma-multus's own ``device-info`` is.

Which devices get one:

- an exclusive pool's (and the default form's) devices: one file per ID, the RDMA device name
  (``mlx5_bond_3``), naming that device;
- a shared pool's virtual IDs (``0`` .. ``count-1``) when the pool holds exactly one HCA: each of
  them is that HCA. A pool of several HCAs mounts all of them in every pod, and a ``pci`` entry
  names one device, so its IDs get none (better no ``device-info`` than a wrong one).

    files = wanted_files({"rdma/hca_shared_devices_a": snap})   # {file name: document}
    is_ours("rdma-hca_shared_devices_a-7-device.json", ["rdma/hca_shared_devices_a"])   # True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rdma_cni.devices.pools import PoolSnapshot, SharedSnapshot, virtual_ids

DEFAULT_DIR = "/var/run/k8s.cni.cncf.io/devinfo/dp"
SUFFIX = "-device.json"
TYPE = "pci"
VERSION = "1.1.0"  # the NPWG client's DeviceInfoVersion (network-attachment-definition-client v1.7)


def _safe(text: str) -> str:
    return text.replace("/", "-")


def file_name(resource_name: str, device_id: str) -> str:
    """The name Multus looks for: ``<resourceName "/"→"-">-<deviceID "/"→"-">-device.json``."""
    return f"{_safe(resource_name)}-{_safe(device_id)}{SUFFIX}"


def document(rdma_device: str, pci: str | None) -> dict[str, Any]:
    """One device's Device Information: type ``pci`` with its RDMA device (and PCI address when it
    has one: a virtual device such as Soft-RoCE has none)."""
    inner = {"pci-address": pci, "rdma-device": rdma_device} if pci else {"rdma-device": rdma_device}
    return {"type": TYPE, "version": VERSION, TYPE: inner}


def pool_files(resource_name: str, snap: PoolSnapshot) -> dict[str, dict[str, Any]]:
    """The files of one pool (see the module doc for which devices get one)."""
    if isinstance(snap, SharedSnapshot):
        if len(snap.hcas) != 1:
            return {}
        hca = snap.hcas[0]
        doc = document(hca.id, hca.pci)
        return {file_name(resource_name, i): doc for i in virtual_ids(snap.count)}
    return {file_name(resource_name, b.id): document(b.id, b.pci) for b in snap.bonds}


def wanted_files(pools: Mapping[str, PoolSnapshot]) -> dict[str, dict[str, Any]]:
    """Every pool's files, by file name."""
    out: dict[str, dict[str, Any]] = {}
    for name, snap in pools.items():
        out.update(pool_files(name, snap))
    return out


def is_ours(name: str, resource_names: Iterable[str]) -> bool:
    """Whether ``name`` is a device-info file of one of ``resource_names``. Other device plugins
    (SR-IOV's) write into the same directory, so ownership is the exact shape: our resource's
    prefix, then one ID without ``-`` (RDMA device names and virtual IDs have none), so pool
    ``rdma/hca`` never claims pool ``rdma/hca-b``'s files, nor another plugin's."""
    if not name.endswith(SUFFIX):
        return False
    for resource in resource_names:
        prefix = f"{_safe(resource)}-"
        if name.startswith(prefix):
            device = name[len(prefix) : -len(SUFFIX)]
            if device and "-" not in device:
                return True
    return False
