"""What kubelet should pick (GetPreferredAllocation) and what a container gets (Allocate).

``preferred`` keeps ``must_include``, packs the rest onto the fewest NUMA nodes (those already used
by ``must_include`` first: kubelet's Topology Manager aligns them with the GPUs), then takes the
lowest bond numbers, so picks are deterministic. It never raises: kubelet fails the pod when this
call fails, so garbage in gives the first ``size`` available IDs out (and a log line).

``allocate`` answers one container request: the device nodes of each bond (``uverbsN`` always,
``umadN``/``issmN`` when the host has them, ``rdma_cm`` once), and the env NCCL and UCX read. The
GID index is read from the GID tables at that moment (never assumed to be 3): the RoCE v2 GID of
the bond's IPv4 address on the bond itself; for a bond whose address is lent to a pod being torn
down, the host index rdma-macvlan recorded when it moved the address. Set only when all the
allocated bonds agree (NCCL takes one index for every HCA).

    ids = preferred(snap, available, must_include=["mlx5_bond_4"], size=4)
    alloc = allocate(snap, ids, cfg)      # AllocationError for an unknown or unhealthy ID
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.inventory import host_ipv4
from rdma_cni.devices.model import RdmaBond, Snapshot, natural_key
from rdma_cni.rdma import records, sysfs
from rdma_cni.state import NodeState

log = logging.getLogger("rdma_cni.deviceplugin")

CONTAINER_DIR = "/dev/infiniband"
RDMA_CM = "rdma_cm"
PERMISSIONS = "rw"
MAX_NUMA_GROUPS = 12  # beyond this the exhaustive search is skipped (no real node has that many)


# --- GetPreferredAllocation ------------------------------------------------------------------------


def preferred(snap: Snapshot, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    """``size`` IDs from ``available``, ``must_include`` first. Never raises."""
    try:
        return _preferred(snap, available, must_include, size)
    except Exception:  # an error here fails the pod in kubelet: answer something
        log.exception("preferred allocation failed for available=%r must_include=%r size=%r; "
                      "answering the first available IDs", available, must_include, size)
        return _first_n(available, must_include, size)


def _first_n(available: object, must_include: object, size: object) -> list[str]:
    try:
        n = max(int(size), 0)  # type: ignore[call-overload]
        ids = [*list(must_include), *list(available)]  # type: ignore[call-overload]
        return list(dict.fromkeys(i for i in ids if isinstance(i, str)))[:n]
    except Exception:  # noqa: BLE001 - the last resort must not raise either
        return []


def _preferred(snap: Snapshot, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
    avail = list(dict.fromkeys(available))
    must = list(dict.fromkeys(must_include))
    if any(not isinstance(i, str) for i in [*avail, *must]) or isinstance(size, bool):
        raise TypeError("device IDs must be strings and size a number")
    if size <= len(must):
        if size < len(must):
            log.warning("preferred allocation: size %d is below must_include %r; keeping the first",
                        size, must)
        return must[: max(size, 0)]
    missing = [m for m in must if m not in avail]
    if missing:
        log.warning("preferred allocation: must_include %r not in available; kept anyway", missing)
    numa = {b.id: b.numa for b in snap.bonds}
    healthy = {h.id for h in snap.health if h.healthy}
    pool = [i for i in avail if i not in must]
    # Known healthy devices first; anything else kubelet offers only when those run out.
    good = [i for i in pool if i in healthy]
    rest = [i for i in pool if i not in healthy]
    need = size - len(must)
    picks = _pack(good, need, {numa.get(m) for m in must}, numa)
    if len(picks) < need:
        picks += sorted(rest, key=natural_key)[: need - len(picks)]
    return must + picks


def _pack(
    pool: list[str], need: int, must_nodes: set[int | None], numa: Mapping[str, int | None]
) -> list[str]:
    """``need`` IDs of ``pool`` on the fewest NUMA nodes, preferring ``must_nodes``, then the lowest
    numbers. ``None`` (no NUMA information) counts as one node of its own."""
    if need <= 0 or not pool:
        return []
    if len(pool) <= need:
        return sorted(pool, key=natural_key)
    groups: dict[int | None, list[str]] = {}
    for i in sorted(pool, key=natural_key):
        groups.setdefault(numa.get(i), []).append(i)
    keys = list(groups)
    if len(keys) > MAX_NUMA_GROUPS:
        return sorted(pool, key=natural_key)[:need]
    best: tuple[object, list[str]] | None = None
    for r in range(1, len(keys) + 1):
        for combo in itertools.combinations(keys, r):
            members = [i for k in combo for i in groups[k]]
            if len(members) < need:
                continue
            # Within the chosen nodes: those must_include already uses first, then bond order.
            members.sort(key=lambda i: (numa.get(i) not in must_nodes, natural_key(i)))
            picks = members[:need]
            nodes = {numa.get(i) for i in picks}
            score = (len(nodes | must_nodes), len(nodes - must_nodes), sorted(natural_key(i) for i in picks))
            if best is None or score < best[0]:  # type: ignore[operator]
                best = (score, picks)
        if best is not None:
            break  # more nodes in the combination can only add nodes
    assert best is not None
    return sorted(best[1], key=natural_key)


# --- Allocate --------------------------------------------------------------------------------------


class AllocationError(Exception):
    """An ID kubelet must not be given (unknown, unhealthy, no uverbs). The gRPC layer sends it
    back as an error naming the ID; nothing changes on the node."""

    def __init__(self, device_id: str, why: str) -> None:
        self.device_id = device_id
        self.why = why
        super().__init__(f"cannot allocate {device_id!r}: {why}")


@dataclass(frozen=True)
class DeviceSpec:
    container_path: str
    host_path: str
    permissions: str


@dataclass(frozen=True)
class ContainerAllocation:
    devices: tuple[DeviceSpec, ...]
    envs: Mapping[str, str]


def allocate(snap: Snapshot, ids: Sequence[str], cfg: PluginConfig) -> ContainerAllocation:
    """The answer for one container request of ``ids`` (see the module doc)."""
    bonds = _checked(snap, ids)
    devices: list[DeviceSpec] = []
    for bond in bonds:
        devices += _bond_devices(cfg, bond)
    cm = os.path.join(cfg.dev_root, "infiniband", RDMA_CM)
    if os.path.exists(cm):
        devices.append(dev_spec(cfg, RDMA_CM))
    else:  # a listed host device that does not exist fails the container's creation
        log.warning("%s is missing: containers get no rdma_cm (load rdma_ucm for librdmacm)", cm)
    return ContainerAllocation(devices=tuple(devices), envs=environment(cfg, bonds))


def _checked(snap: Snapshot, ids: Sequence[str]) -> list[RdmaBond]:
    if not ids:
        raise AllocationError("", "the request names no device")
    out: list[RdmaBond] = []
    for device_id in dict.fromkeys(ids):
        bond = snap.bond(device_id) if isinstance(device_id, str) else None
        if bond is None:
            known = ", ".join(b.id for b in snap.bonds) or "none"
            raise AllocationError(str(device_id), f"no such device on this node (devices: {known})")
        health = snap.health_of(device_id)
        if health is None or not health.healthy:
            why = health.reason if health is not None else "its health was never checked"
            raise AllocationError(device_id, f"it is unhealthy: {why}")
        if not bond.uverbs:
            raise AllocationError(device_id, "it has no uverbs device")
        out.append(bond)
    return sorted(out, key=lambda b: natural_key(b.id))


def dev_spec(cfg: PluginConfig, name: str) -> DeviceSpec:
    # The host numbering is kept in the container: NCCL/libibverbs find uverbsN through sysfs,
    # which the container sees unchanged (shared netns mode), so the names must match the host's.
    return DeviceSpec(
        container_path=f"{CONTAINER_DIR}/{name}",
        host_path=os.path.join(cfg.dev_root, "infiniband", name),
        permissions=PERMISSIONS,
    )


def _bond_devices(cfg: PluginConfig, bond: RdmaBond) -> list[DeviceSpec]:
    assert bond.uverbs is not None
    out = [dev_spec(cfg, bond.uverbs)]
    for name in (*bond.umad, *bond.issm):
        if os.path.exists(os.path.join(cfg.dev_root, "infiniband", name)):
            out.append(dev_spec(cfg, name))
    return out


# --- env -------------------------------------------------------------------------------------------


def environment(cfg: PluginConfig, bonds: Sequence[RdmaBond]) -> dict[str, str]:
    env: dict[str, str] = {}
    if cfg.env_nccl_ib_hca:
        env["NCCL_IB_HCA"] = "=" + ",".join(b.id for b in bonds)  # '=': exact names, not prefixes
    if cfg.env_ucx_net_devices:
        env["UCX_NET_DEVICES"] = ",".join(f"{b.id}:{b.port}" for b in bonds)
    if cfg.env_nccl_ib_gid_index or cfg.env_ucx_ib_gid_index:
        index = common_gid_index(cfg, bonds)
        if index is not None:
            if cfg.env_nccl_ib_gid_index:
                env["NCCL_IB_GID_INDEX"] = str(index)
            if cfg.env_ucx_ib_gid_index:
                env["UCX_IB_GID_INDEX"] = str(index)
    return env


def common_gid_index(cfg: PluginConfig, bonds: Sequence[RdmaBond]) -> int | None:
    """The one RoCE v2 IPv4 GID index of all ``bonds`` now, or None (logged) when they disagree or
    one has none."""
    indexes = host_gid_indexes(cfg, bonds)
    values = set(indexes.values())
    if len(values) == 1 and None not in values:
        return values.pop()
    log.warning("GID index env not set: the bonds' RoCE v2 IPv4 GID indexes differ or are unknown (%s)",
                ", ".join(f"{k}={v}" for k, v in indexes.items()))
    return None


def host_gid_indexes(cfg: PluginConfig, bonds: Sequence[RdmaBond]) -> dict[str, int | None]:
    """device ID -> the host's RoCE v2 IPv4 GID index, read now (see the module doc)."""
    addrs = host_ipv4(b.netdev for b in bonds)
    recorded: dict[str, int] | None = None
    out: dict[str, int | None] = {}
    for b in bonds:
        index = _live_index(cfg.sysfs_root, b, addrs.get(b.netdev, ()))
        if index is None:
            if recorded is None:
                recorded = recorded_host_indexes(cfg)
            index = recorded.get(b.netdev)
        out[b.id] = index
    return out


def _live_index(sysfs_root: str, bond: RdmaBond, ipv4: Sequence[str]) -> int | None:
    """Lowest RoCE v2 slot holding one of the bond's own IPv4 addresses, on the bond itself."""
    found = [sysfs.roce_v2_index(sysfs_root, bond.id, bond.port, ip, bond.netdev) for ip in ipv4]
    return min((i for i in found if i is not None), default=None)


def recorded_host_indexes(cfg: PluginConfig) -> dict[str, int]:
    """bond netdev -> the host GID index rdma-macvlan recorded before it moved the address into a
    pod (``hostGidIndex`` in the attachment record), else the one in ``runDir/gid/host.json``."""
    out: dict[str, int] = {}
    for port in records.read_host_record(cfg.run_dir).get("ports", []):
        if isinstance(port, dict) and isinstance(port.get("netdev"), str) and _is_index(port.get("gidIndex")):
            out[port["netdev"]] = port["gidIndex"]
    if os.path.isdir(cfg.data_dir):
        for rec in NodeState(cfg.data_dir).attachments():
            for b in rec.bonds:
                index = (b.rdma or {}).get("hostGidIndex")
                if isinstance(index, int) and _is_index(index):
                    out[b.bond] = index
    return out


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
