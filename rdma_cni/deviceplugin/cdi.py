"""CDI answers of the device plugin (``rdma-device-plugin --cdi``; off by default).

With ``--cdi``, Allocate names CDI devices (``ContainerAllocateResponse.cdi_devices``) and the runtime
injects their nodes from a spec file, instead of kubelet passing ``DeviceSpec``s. Off by default, as
Mellanox's ``--use-cdi`` is: containerd 1.6 has no CDI and 1.7 has it off (``enable_cdi``), and a
runtime without CDI drops the names silently, so a pod would start with no RDMA device at all.
kubelet passes the names since 1.28 (gate ``DevicePluginCDIDevices``, GA in 1.31). The spec is laid
out and written by the DRA driver's writer (:mod:`rdma_cni.devices.cdi`: CDI 0.6.0, temp file +
rename). What we decided, and why:

- **One spec per pool**, ``<spec dir>/<domain>-<name>_rdma-device-plugin.json`` (``--cdi-dir``,
  default ``/var/run/cdi``, which containerd and CRI-O read), written at start and rewritten in one
  rename whenever its content would change: on every change the health watch publishes and, before
  answering, on every Allocate (so the nodes that appear without an inventory event, ``rdma_cm``,
  ``umadN``/``issmN``, are in the spec when a container is created). Health alone never rewrites it.
- **Kind = the pool's resource name** (``tke.cloud.tencent.com/tke-shared-rdma``,
  ``rdma/hca_shared_devices_a``), as NVIDIA's plugin names ``nvidia.com/gpu``: unique per pool, so a
  device name need not carry the pool, and two pools sharing an HCA never conflict (Mellanox's one
  kind ``nvidia.com/net-rdma`` for all pools does). A resource name the CDI library would refuse as a
  kind (a part starting with a digit), and any in the DRA driver's vendor
  ``rdma.tke.cloud.tencent.com`` (whose kind is ``…/bond``, whose files
  ``rdma.tke.cloud.tencent.com-bond_<uid>.json`` its start-up sweep removes), stop the start (exit 2).
- **Device names**: exclusive, one device per bond named by its device ID (``…=mlx5_bond_3``, the ID
  kubelet and PodResources know), holding ``uverbsN`` and the ``umadN``/``issmN`` the host has; shared,
  one device ``all`` holding every HCA of the pool (any of the ``count`` virtual IDs means the whole
  set, as in TKE's shared mode). ``rdma_cm`` is the spec's own edit: the runtime adds it once per
  container whichever devices it gets. A bond without a uverbs node is left out (the CDI library
  refuses a device with no edits, and such a bond is Unhealthy); a pool with no device has no spec.
- **Nothing else beside the names**: no ``DeviceSpec``s (the runtime injects the nodes; both would
  list each node twice) and no mounts (the plugin sends none). **The env stays in Allocate's
  ``envs``** (``NCCL_IB_HCA``, ``UCX_NET_DEVICES``, exclusive ``NCCL_IB_GID_INDEX``): it depends on the
  set allocated (a per-device env would be overwritten by the next device's, as one key) and the GID
  index is read from the GID tables at that moment; a spec written per pool holds neither.
- **Never removed at stop** (nor at a kubelet restart): kubelet keeps the names in its checkpoint and
  passes them again whenever it re-creates a container of a running pod (a crash, a liveness
  restart), and the runtime resolves them then; a removed spec fails that container's creation. The
  spec only says where the node's devices are, which stays true while the plugin is down. At start,
  the specs of this owner for pools no longer configured are removed once kubelet's PodResources
  says no pod holds that resource (kept, and logged, while one does or kubelet cannot be asked).
  Running without ``--cdi`` touches no spec at all.

    cfg_cdi = cdi_config(cfg.pool_specs(), "/var/run/cdi", reserved_vendors=("rdma.tke.cloud.tencent.com",))
    spec = PoolCdi(cfg, cfg_cdi.spec_dir, cfg_cdi.kinds["rdma/hca_shared_devices_a"])
    spec.sync(snap)                      # written when it differs from what is on disk
    names = spec.answer(snap, ["17"])    # ["rdma/hca_shared_devices_a=all"]
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rdma_cni import durable
from rdma_cni.cni.errors import CniError
from rdma_cni.devices import cdi
from rdma_cni.devices.allocation import RDMA_CM, AllocationError, DeviceSpec, dev_spec
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.errors import ConfigError
from rdma_cni.devices.model import natural_key
from rdma_cni.devices.pools import PoolSnapshot, PoolSpec, SharedSnapshot
from rdma_cni.kube import podresources

log = logging.getLogger(__name__)

OWNER = "rdma-device-plugin"  # the file name's end: <domain>-<name>_rdma-device-plugin.json
SHARED_DEVICE = "all"


@dataclass(frozen=True)
class CdiConfig:
    """``--cdi`` checked: where the specs go and each pool's CDI kind (resource name -> kind)."""

    spec_dir: str
    kinds: Mapping[str, str]


def cdi_config(specs: Sequence[PoolSpec], spec_dir: str, reserved_vendors: Collection[str] = ()) -> CdiConfig:
    """Check ``--cdi-dir`` and every pool's kind; ConfigError (one sentence) for the first bad one.
    ``reserved_vendors``: CDI vendors another writer owns (the DRA driver's)."""
    if not os.path.isabs(spec_dir):
        raise ConfigError("--cdi-dir", spec_dir, "give an absolute directory (the runtime reads "
                          "/var/run/cdi and /etc/cdi)")
    if os.path.exists(spec_dir) and not os.path.isdir(spec_dir):
        raise ConfigError("--cdi-dir", spec_dir, "it exists and is not a directory; name a directory")
    kinds: dict[str, str] = {}
    for spec in specs:
        kind = spec.resource_name
        problem = cdi.kind_problem(kind)
        if problem is not None:
            raise ConfigError(spec.origin or "resourceName", kind,
                              f"with --cdi the resource name is the pool's CDI kind, and {problem}; "
                              "rename the pool or run without --cdi")
        vendor = kind.split("/", 1)[0]
        if vendor in reserved_vendors:
            raise ConfigError(spec.origin or "resourceName", kind,
                              f"with --cdi the resource name is the pool's CDI kind, and the CDI vendor "
                              f"{vendor} is the DRA driver's (its spec files would clash with this "
                              "pool's); use another domain or run without --cdi")
        kinds[spec.resource_name] = kind
    files: dict[str, str] = {}
    for name, kind in kinds.items():
        other = files.setdefault(cdi.spec_path(spec_dir, kind, OWNER), name)
        if other != name:  # <vendor>-<class>: a/b-c and a-b/c name the same file
            raise ConfigError("resourceName", name, f"with --cdi its spec file would be pool {other}'s "
                              f"({os.path.basename(cdi.spec_path(spec_dir, kind, OWNER))}); rename one "
                              "of the two pools or run without --cdi")
    return CdiConfig(spec_dir, kinds)


def _nodes(cfg: PluginConfig, uverbs: str | None, extra: Sequence[str]) -> list[DeviceSpec]:
    """What Allocate gives for one device (:mod:`rdma_cni.devices.allocation`, ``shared``): its uverbs
    node, then the umad/issm nodes the host has; nothing when there is no uverbs node (the CDI
    library refuses an empty device, and such a device is Unhealthy anyway)."""
    present = [n for n in (uverbs, *extra) if n and _exists(cfg, n)]
    if not uverbs or uverbs not in present:
        return []
    return [dev_spec(cfg, n) for n in present]


def _exists(cfg: PluginConfig, name: str) -> bool:
    return os.path.exists(os.path.join(cfg.dev_root, "infiniband", name))


def pool_devices(cfg: PluginConfig, snap: PoolSnapshot) -> tuple[
        dict[str, list[DeviceSpec]], list[DeviceSpec]]:
    """CDI device name -> its nodes now, and the nodes of no one device (``rdma_cm``); see the module doc."""
    named: dict[str, list[DeviceSpec]] = {}
    if isinstance(snap, SharedSnapshot):
        nodes = [s for h in snap.hcas for s in _nodes(cfg, h.uverbs, (*h.umad, *h.issm))]
        if nodes:
            named[SHARED_DEVICE] = nodes
    else:
        for bond in snap.bonds:
            problem = cdi.name_problem(bond.id)
            if problem is not None:
                log.warning("device %s has no CDI device: %s", bond.id, problem)
                continue
            nodes = _nodes(cfg, bond.uverbs, (*bond.umad, *bond.issm))
            if nodes:
                named[bond.id] = nodes
    common = [dev_spec(cfg, RDMA_CM)] if _exists(cfg, RDMA_CM) else []
    return named, common


class PoolCdi:
    """The CDI spec of one pool, kept equal to the pool's devices now. Thread-safe: the health watch
    and the gRPC threads both sync it."""

    def __init__(self, cfg: PluginConfig, spec_dir: str, kind: str) -> None:
        self._cfg = cfg
        self._dir = spec_dir
        self.kind = kind
        self.path = cdi.spec_path(spec_dir, kind, OWNER)
        self._lock = threading.Lock()
        self._written: dict[str, Any] | None = None  # the document on disk, as this process wrote it
        self.writes = 0

    def sync(self, snap: PoolSnapshot) -> frozenset[str]:
        """Make the file say what ``snap`` and the dev root say now (rewritten only when that differs
        or the file is gone; removed when the pool has no device); the device names it holds."""
        named, common = pool_devices(self._cfg, snap)
        with self._lock:
            if not named:
                if self._written is not None or os.path.exists(self.path):
                    cdi.remove_spec(self._dir, self.kind, OWNER)
                    log.info("CDI spec %s removed: the pool has no device", self.path)
                self._written = None
                return frozenset()
            doc = cdi.named_document(self.kind, named, common)
            if self._written is None:  # a restart over an unchanged node rewrites nothing
                self._written = cdi.read_document(self.path)
            if doc != self._written or not os.path.exists(self.path):
                cdi.write_document(self._dir, self.kind, OWNER, doc)
                self._written = doc
                self.writes += 1
                log.info("CDI spec %s: %s", self.path, ", ".join(named))
            return frozenset(named)

    def answer(self, snap: PoolSnapshot, ids: Sequence[str]) -> list[str]:
        """The CDI IDs for a container request of ``ids`` that the model already accepted, after a sync;
        AllocationError for a device the spec cannot hold."""
        held = self.sync(snap)
        if isinstance(snap, SharedSnapshot):
            names = [SHARED_DEVICE]
        else:
            names = sorted(dict.fromkeys(ids), key=natural_key)
        for name in names:
            if name not in held:
                device = ids[0] if name == SHARED_DEVICE else name
                raise AllocationError(device, f"the CDI spec {self.path} holds no device {name!r} "
                                      "(no uverbs node, or a name CDI refuses)")
        return [cdi.qualified(self.kind, n) for n in names]


def sweep_dropped(spec_dir: str, kinds: Collection[str], pod_resources_dir: str) -> list[str]:
    """Remove this owner's specs of kinds no longer configured that no pod holds (module doc); the
    removed paths."""
    keep = {cdi.spec_path(spec_dir, k, OWNER) for k in kinds}
    stale = [p for p in cdi.owner_specs(spec_dir, OWNER) if p not in keep]
    if not stale:
        return []
    held = _resources_held(pod_resources_dir)
    removed = []
    for path in stale:
        kind = cdi.read_kind(path)
        if kind is not None and (held is None or kind in held):
            why = "kubelet's PodResources cannot be asked" if held is None else "a pod holds that resource"
            log.info("CDI spec %s of pool %s (no longer configured) kept: %s", path, kind, why)
            continue
        # One without a readable kind is removed too: the runtime cannot read it either.
        if durable.remove(path):
            log.info("CDI spec %s of a pool no longer configured removed (no pod holds it)", path)
            removed.append(path)
    return removed


def _resources_held(pod_resources_dir: str) -> set[str] | None:
    """Every resource some pod on the node holds devices of; None when kubelet cannot be asked."""
    socket = podresources.socket_path(pod_resources_dir)
    if not podresources.available(socket):
        return None
    try:
        pods = podresources.list_pods(socket)
    except CniError as e:
        log.warning("PodResources: %s", e)
        return None
    return {res for devices in pods.values() for res, ids in devices.items() if ids}
