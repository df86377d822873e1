"""What a shared pool answers: its device list, GetPreferredAllocation and Allocate.

A shared pool's ``count`` virtual devices all stand for the same HCAs, so which IDs kubelet picks
does not matter: every allocation, of one ID or of ten, gets every HCA of the pool (``uverbsN``,
``umadN``/``issmN`` where the host has them, ``rdma_cm`` once), NCCL told exactly those HCAs
(``NCCL_IB_HCA==mlx5_0,mlx5_1``: NCCL matches names by prefix unless the list starts with ``=``)
and UCX the same (``UCX_NET_DEVICES=mlx5_0:1,...``). No GID-index env: in TKE's shared mode a pod's
own GID index exists only after its CNI ADD (its ipvlan address gets GIDs of its own), and on an
InfiniBand port NCCL needs none; NCCL >= 2.21 picks the RoCE v2 IPv4 GID by itself
(``NCCL_IB_GID_INDEX`` unset = -1 = dynamic), other programs read the pod's index from the
network-status annotation.

Every virtual device carries the pool's health (Healthy while any HCA is usable) and TopologyInfo
listing the NUMA nodes of all its HCAs (kubelet then treats the pool as spanning them). A pool
that selects no HCA lists no device at all.

    resp = device_list(snap)                     # count devices, one health, the HCAs' NUMA nodes
    alloc = allocate(snap, ["17"], cfg)          # AllocationError for an unknown ID or a dead pool
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from rdma_cni.devices.allocation import (
    RDMA_CM,
    AllocationError,
    ContainerAllocation,
    DeviceSpec,
    dev_spec,
)
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.hca import Hca
from rdma_cni.devices.pools import SharedSnapshot

log = logging.getLogger("rdma_cni.deviceplugin")


def preferred(available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """Any IDs do: ``must_include``, then the available ones in order. Never raises."""
    try:
        picks = list(dict.fromkeys(i for i in must_include if isinstance(i, str)))
        picks += [i for i in dict.fromkeys(available) if isinstance(i, str) and i not in picks]
        return picks[: max(int(size), len(must_include), 0)]
    except Exception:
        log.exception("shared preferred allocation failed for %r; answering none", available)
        return []


def _known(snap: SharedSnapshot, ids: Sequence[str]) -> None:
    if not ids:
        raise AllocationError("", "the request names no device")
    for device_id in ids:
        if not (
            isinstance(device_id, str)
            and device_id.isdigit()
            and int(device_id) < snap.count
            and str(int(device_id)) == device_id
        ):
            raise AllocationError(
                str(device_id), f"no such device in this pool (devices: 0..{snap.count - 1})"
            )
    if not snap.healthy:
        why = "; ".join(h.reason for h in snap.health) or "the pool selects no HCA"
        raise AllocationError(ids[0], f"it is unhealthy: no HCA of the pool is usable ({why})")


def _hca_devices(cfg: PluginConfig, hca: Hca) -> list[DeviceSpec]:
    names = [hca.uverbs] if hca.uverbs else []
    names += [
        n for n in (*hca.umad, *hca.issm) if os.path.exists(os.path.join(cfg.dev_root, "infiniband", n))
    ]
    return [dev_spec(cfg, n) for n in names]


def allocate(snap: SharedSnapshot, ids: Sequence[str], cfg: PluginConfig) -> ContainerAllocation:
    """The answer for one container request of ``ids`` (see the module doc)."""
    _known(snap, ids)
    hcas = [
        h
        for h in snap.hcas
        if h.uverbs and os.path.exists(os.path.join(cfg.dev_root, "infiniband", h.uverbs))
    ]
    gone = [h.id for h in snap.hcas if h not in hcas]
    if gone:  # a host path that does not exist fails the container's creation: leave it out
        log.warning("shared allocation leaves out %s: no uverbs node under %s/infiniband", gone, cfg.dev_root)
    devices: list[DeviceSpec] = []
    for hca in hcas:
        devices += _hca_devices(cfg, hca)
    if os.path.exists(os.path.join(cfg.dev_root, "infiniband", RDMA_CM)):
        devices.append(dev_spec(cfg, RDMA_CM))
    env: dict[str, str] = {}
    if hcas and cfg.env_nccl_ib_hca:
        env["NCCL_IB_HCA"] = "=" + ",".join(h.id for h in hcas)
    if hcas and cfg.env_ucx_net_devices:
        env["UCX_NET_DEVICES"] = ",".join(f"{h.id}:{h.port}" for h in hcas)
    return ContainerAllocation(devices=tuple(devices), envs=env)
