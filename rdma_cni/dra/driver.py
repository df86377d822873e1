"""NodePrepareResources and NodeUnprepareResources on the device model: what a claim's container
gets, as a CDI spec, recorded durably. No gRPC here but the status codes its errors carry.

Prepare of one claim, top to bottom:

1. a ``prepared`` record of that UID whose spec is on disk: answer it again (kubelet retries, and
   calls again after its own restart);
2. GET the claim from the API server; its UID must be the one kubelet named (a claim deleted and
   re-created under the same name is another claim);
3. the results allocated to this driver in this node's pool; each device name -> its device in the
   driver's table (:mod:`.table`, the one the slices were published from): a bond, or any HCA a
   pool of the config holds;
4. the model's answer for those devices, the one the device plugin's Allocate gives
   (:func:`rdma_cni.devices.allocation.allocate`: each device's ``uverbsN`` and its ``umadN``/``issmN``
   where the host has them, ``rdma_cm``, ``NCCL_IB_HCA``/``UCX_NET_DEVICES`` naming its HCAs),
   refused for an unknown or Unhealthy device before anything is written. The GID index env
   (``NCCL_IB_GID_INDEX``, the host's RoCE v2 index) only when every device is a bond of an
   exclusive pool: a shared device's pod gets a GID index of its own (its ipvlan's), and an HCA
   outside the bonds has none in the model, as the device plugin's shared pools give none;
5. write-ahead record (``preparing``), the CDI spec (one rename), the ``prepared`` record.

A kill -9 anywhere leaves either nothing, a ``preparing`` record (with or without a whole spec), or
the ``prepared`` record: kubelet's retry runs 2-5 again, rewriting the same spec file of the same name,
so exactly one spec and one record remain. Unprepare removes the spec, then the record; a claim never
prepared here succeeds.

    driver = Driver(cfg, node, board, api, state_dir, cdi_dir)
    results = driver.prepare([ClaimRef("default", uid, "gpu-nic")])   # {uid: [PreparedDevice] | ClaimError}
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc

from rdma_cni.cni.errors import CniError
from rdma_cni.devices import allocation, cdi
from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.model import Snapshot
from rdma_cni.dra import claims, names
from rdma_cni.dra.prepared import (
    PREPARED,
    PREPARING,
    PreparedClaim,
    PreparedClaims,
    PreparedDevice,
    valid_uid,
)
from rdma_cni.dra.table import DeviceTable, DraDevice, Source, as_table, default_shares
from rdma_cni.failpoints import Failpoints

log = logging.getLogger(__name__)

# Test-only crash points (RDMA_CNI_FAILPOINT, rdma_cni.failpoints): after the write-ahead record, after
# the CDI spec.
FP_WRITE_AHEAD = "dra-prepare-write-ahead"
FP_SPEC_WRITTEN = "dra-prepare-spec-written"


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


class ClaimError(Exception):
    """Why one claim could not be prepared or unprepared, with the gRPC status that says what kind
    of failure it is; the service turns it into the claim's ``error`` text (:mod:`.service`)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code = code
        self.message = message
        super().__init__(f"{code.name}: {message}")


class ClaimReader(Protocol):
    """What the driver needs of the API server (:class:`~rdma_cni.dra.kubeapi.ResourceClient`)."""

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...


PrepareResult = list[PreparedDevice] | ClaimError


class Driver:
    def __init__(self, cfg: PluginConfig, node: str, board: Source, api: ClaimReader, state_dir: str,
                 cdi_dir: str = cdi.SPEC_DIR, failpoints: Failpoints | None = None) -> None:
        self._cfg = cfg
        # A shared device: every pod has a GID index of its own (its ipvlan's), so no GID index env,
        # as the device plugin's shared pools give none (rdma_cni.devices.shared).
        self._shared_cfg = dataclasses.replace(cfg, env_nccl_ib_gid_index=False, env_ucx_ib_gid_index=False)
        self._shares = default_shares(cfg)  # a board of one bond snapshot: the default form's
        self.node = node
        self._board = board
        self._api = api
        self.records = PreparedClaims(state_dir)
        self.cdi_dir = cdi_dir
        self._fp = failpoints or Failpoints(os.environ)
        # One claim at a time: a claim's record and spec are its own, but two claims' Allocate
        # answers read the same bonds' GID tables and records.
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ kubelet's two calls
    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        return {ref.uid: self._each(ref, self._prepare_one) for ref in refs}

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimError | None]:
        out: dict[str, ClaimError | None] = {}
        for ref in refs:
            result = self._each(ref, self._unprepare_one)
            out[ref.uid] = result if isinstance(result, ClaimError) else None
        return out

    def _each(self, ref: ClaimRef, step: Callable[[ClaimRef], PrepareResult]) -> PrepareResult:
        """One claim's call; every failure becomes a ClaimError here and nowhere else."""
        if not valid_uid(ref.uid):
            return ClaimError(grpc.StatusCode.INVALID_ARGUMENT, f"claim uid {ref.uid!r} is not a UID")
        try:
            with self._lock:
                return step(ref)
        except ClaimError as e:
            log.warning("claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, e)
            return e
        except CniError as e:  # the API server: unreachable, or it refused
            log.warning("claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, e.msg)
            return ClaimError(grpc.StatusCode.UNAVAILABLE, e.msg)
        except allocation.AllocationError as e:
            log.warning("claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid, e)
            return ClaimError(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except Exception as e:  # a disk error or a bug of ours: this claim fails, not kubelet's call
            log.exception("claim %s/%s (%s) failed on the node", ref.namespace, ref.name, ref.uid)
            return ClaimError(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    # ------------------------------------------------------------------ prepare
    def _prepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        done = self.records.get(ref.uid)
        if done is not None and done.phase == PREPARED and self._spec_present(ref.uid, done):
            return list(done.devices)
        if done is not None:
            log.info("claim %s/%s (%s): finishing a prepare cut short (%s)", ref.namespace, ref.name,
                     ref.uid, done.phase)
        obj = self._api.get_claim(ref.namespace, ref.name)
        if obj is None:
            raise ClaimError(grpc.StatusCode.NOT_FOUND,
                             f"ResourceClaim {ref.namespace}/{ref.name} does not exist")
        if claims.uid_of(obj) != ref.uid:
            raise ClaimError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"ResourceClaim {ref.namespace}/{ref.name} has uid {claims.uid_of(obj)!r}, "
                             f"not {ref.uid!r}: it was deleted and created again")
        try:
            ours = claims.allocated(obj, names.DRIVER, self.node)
            claims.driver_config(obj, names.DRIVER)  # user input: decoded strictly, before any write
        except claims.ClaimShapeError as e:
            raise ClaimError(grpc.StatusCode.FAILED_PRECONDITION,
                             f"ResourceClaim {ref.namespace}/{ref.name}: {e}") from None
        table = self._table()
        unknown = [a.device for a in ours if a.device not in table.by_name]
        if unknown:
            raise ClaimError(grpc.StatusCode.FAILED_PRECONDITION, f"devices {unknown} are not on node "
                             f"{self.node} (devices: {sorted(table.by_name)})")
        chosen = [table.by_name[a.device] for a in ours]
        # The model's answer first: a device it refuses (Unhealthy) fails the claim before anything
        # is written.
        alloc = self._allocate(table, chosen) if ours else None
        self.records.put(PreparedClaim(ref.uid, ref.namespace, ref.name, PREPARING, ()))
        self._fp.hit(FP_WRITE_AHEAD)
        devices = self._write_spec(ref.uid, table, chosen, ours, alloc)
        self._fp.hit(FP_SPEC_WRITTEN)
        self.records.put(PreparedClaim(ref.uid, ref.namespace, ref.name, PREPARED, tuple(devices)))
        log.info("prepared claim %s/%s (%s): %s", ref.namespace, ref.name, ref.uid,
                 ", ".join(f"{d.device}" for d in devices) or "no device of ours")
        return devices

    def _table(self) -> DeviceTable:
        _, value = self._board.current()
        table = as_table(value, self._shares)
        if table is None:
            raise ClaimError(grpc.StatusCode.INTERNAL, "the driver's device list is not one it knows")
        return table

    @staticmethod
    def _carried(table: DeviceTable, chosen: Sequence[DraDevice]) -> list[DraDevice]:
        """Each RDMA device of ``chosen`` once (a claim may hold one HCA through two pools), in the
        table's order: the order its nodes go into the spec."""
        pick: dict[str, DraDevice] = {}
        for d in chosen:
            pick.setdefault(d.device.id, d)
        order = dict.fromkeys(d.device.id for d in table.devices if d.device.id in pick)
        return [pick[i] for i in order]

    def _allocate(self, table: DeviceTable, chosen: Sequence[DraDevice]) -> allocation.ContainerAllocation:
        carried = self._carried(table, chosen)
        snap = Snapshot(tuple(d.device for d in carried), tuple(d.health for d in carried))
        exclusive = all(d.shares is None for d in chosen)
        return allocation.allocate(snap, [d.device.id for d in carried],
                                   self._cfg if exclusive else self._shared_cfg)

    def _write_spec(self, uid: str, table: DeviceTable, chosen: Sequence[DraDevice],
                    ours: list[claims.Allocated],
                    alloc: allocation.ContainerAllocation | None) -> list[PreparedDevice]:
        if alloc is None:  # a claim with nothing of ours on this node: nothing to hand out
            cdi.remove_spec(self.cdi_dir, names.CDI_KIND, uid)
            return []
        carried = [d.device for d in self._carried(table, chosen)]
        ids = cdi.write_spec(self.cdi_dir, names.CDI_KIND, uid, alloc, carried)
        return [PreparedDevice(a.request, self.node, a.device, (ids[d.device.id],), a.share_id)
                for a, d in zip(ours, chosen, strict=True)]

    def _spec_present(self, uid: str, rec: PreparedClaim) -> bool:
        return not rec.devices or os.path.exists(cdi.spec_path(self.cdi_dir, names.CDI_KIND, uid))

    # ------------------------------------------------------------------ unprepare
    def _unprepare_one(self, ref: ClaimRef) -> list[PreparedDevice]:
        self.records.refuse_newer(ref.uid)  # a newer version's record: its spec stays, with it
        removed = cdi.remove_spec(self.cdi_dir, names.CDI_KIND, ref.uid)
        known = self.records.remove(ref.uid)
        if removed or known:
            log.info("unprepared claim %s/%s (%s)", ref.namespace, ref.name, ref.uid)
        return []

    # ------------------------------------------------------------------ start
    def sweep_orphans(self) -> list[str]:
        """Remove CDI specs of ours that no record names (see :mod:`.prepared`), and the temp files of
        record writes a kill cut short; their paths."""
        known = set(self.records.uids())
        prefix = cdi.spec_path(self.cdi_dir, names.CDI_KIND, "")
        removed = self.records.sweep_temp()
        for path in glob.glob(glob.escape(prefix) + "*.json"):
            uid = path[len(prefix): -len(".json")]
            if uid not in known:
                cdi.remove_spec(self.cdi_dir, names.CDI_KIND, uid)
                removed.append(path)
        return removed

    def prepared(self) -> Mapping[str, PreparedClaim]:
        return {uid: rec for uid in self.records.uids() if (rec := self.records.get(uid)) is not None}
