"""Keep the node's ResourceSlices equal to what the device model says, through the API server.

Called on start, after every rescan that changed the node, and whenever the watch saw our slices
change under us (:mod:`.daemon`, :mod:`.live`). It compares the wanted specs
(:func:`~rdma_cni.dra.slices.slice_specs`) with what the API server last showed of this driver's slices
of the node (:class:`~rdma_cni.dra.live.LiveSlices`: the answers to our writes and the watch's events;
listed only when nothing is known yet or a write was refused), and when they differ writes all of them
with the pool's generation raised by one (the scheduler only trusts the slices of a pool's highest
generation, so a half-written update is never mixed with the old one) and deletes those no longer
needed. Nothing the same: no request at all. Slice names are fixed
(``<node>-rdma.tke.cloud.tencent.com-<i>``), so a driver killed mid-publish and started again
updates the same objects instead of adding more. Each slice is owned by the Node: deleting the node
deletes them.

    pub = SlicePublisher(api, "node-a", live)
    pub.publish(slice_specs("node-a", snap, facts, None))    # True when anything was written
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Protocol

from rdma_cni.cni.errors import CniError
from rdma_cni.dra import names
from rdma_cni.dra.live import LiveSlices

log = logging.getLogger(__name__)

Doc = dict[str, Any]


class SliceApi(Protocol):
    def get_node(self, name: str) -> Doc | None: ...
    def list_slices_at(self, node: str) -> tuple[list[Doc], str]: ...
    def create_slice(self, obj: Doc) -> Doc: ...
    def update_slice(self, obj: Doc) -> Doc: ...
    def delete_slice(self, name: str) -> Doc: ...


def slice_name(node: str, index: int) -> str:
    suffix = f"-{names.DRIVER}-{index}"
    return node[: 253 - len(suffix)] + suffix


def _without_generation(spec: Doc) -> Doc:
    """A slice's spec as compared: no pool generation (ours to bump), capacities as numbers."""
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    devices = [_by_quantity(d) for d in spec.get("devices") or []]
    return {**spec, "pool": pool, "devices": devices}


_SI = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
       "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


_QUANTITY = re.compile(r"(\d+)(|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)")


def quantity(q: object) -> object:
    """A whole-number quantity as its number ("1k" and "1000" are one), anything else as it is.
    kube-apiserver stores a slice's capacities canonical ("1000" comes back "1k"): compared as sent,
    a shared-mode slice differed from the live one at every refresh and was written again (1.85
    updates per idle node-minute, measured on the test cluster)."""
    m = _QUANTITY.fullmatch(str(q))
    return int(m.group(1)) * _SI[m.group(2)] if m else q


def _by_quantity(device: Doc) -> Doc:
    caps = device.get("capacity")
    if not caps:
        return device
    out: dict[str, Any] = {}
    for name, cap in caps.items():
        cap = {**cap, "value": quantity(cap.get("value"))}
        policy = cap.get("requestPolicy")
        if policy:
            policy = {k: (quantity(v) if k == "default" else v) for k, v in policy.items()}
            if policy.get("validRange"):
                policy["validRange"] = {k: quantity(v) for k, v in policy["validRange"].items()}
            cap["requestPolicy"] = policy
        out[name] = cap
    return {**device, "capacity": out}


class SlicePublisher:
    def __init__(self, api: SliceApi, node: str, live: LiveSlices | None = None) -> None:
        self._api = api
        self.node = node
        self.live = live if live is not None else LiveSlices()  # without a watch: only our own writes
        self._owner: list[Doc] | None = None
        self._generation = 0  # the last one written: a pool's generation never goes back in one run
        self.writes = 0  # objects created, updated or deleted, for the logs and the tests

    def _owner_refs(self) -> list[Doc]:
        """The Node as owner, looked up once (a node is not re-created under a running driver)."""
        if self._owner is None:
            try:
                node = self._api.get_node(self.node)
            except CniError as e:  # the slices matter more than their garbage collection
                log.warning("cannot read node %s (%s): its ResourceSlices get no owner for now",
                            self.node, e.msg)
                return []
            uid = (node or {}).get("metadata", {}).get("uid")
            if not uid:
                log.warning("node %s not found: its ResourceSlices get no owner", self.node)
                return []
            self._owner = [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid,
                            "controller": True}]
        return self._owner

    def publish(self, specs: Sequence[Doc]) -> bool:
        """Make the node's slices hold ``specs``; True when anything was written. Raises the API's
        :class:`~rdma_cni.cni.errors.CniError` (the caller retries on its next change or timer), after
        which the next call lists again: a refused write means what we knew was wrong."""
        self.live.sync(lambda: self._api.list_slices_at(self.node))
        existing = self.live.current()
        wanted = {slice_name(self.node, i): spec for i, spec in enumerate(specs)}
        same = set(existing) == set(wanted) and all(
            _without_generation(existing[n].get("spec") or {}) == _without_generation(wanted[n])
            for n in wanted)
        if same:
            return False
        try:
            self._write(existing, wanted)
        except CniError:
            self.live.invalidate()
            raise
        log.info("published %d ResourceSlice(s) of node %s, generation %d: %d devices", len(wanted),
                 self.node, self._generation, sum(len(s.get("devices", [])) for s in specs))
        return True

    def _write(self, existing: dict[str, Doc], wanted: dict[str, Doc]) -> None:
        generation = 1 + max([self._generation, *(
            int((s.get("spec") or {}).get("pool", {}).get("generation", 0) or 0) for s in existing.values())])
        owner = self._owner_refs()
        for name, spec in wanted.items():
            spec = {**spec, "pool": {**spec["pool"], "generation": generation}}
            meta: Doc = {"name": name}
            if owner:
                meta["ownerReferences"] = owner
            obj: Doc = {"apiVersion": names.API_VERSION, "kind": "ResourceSlice", "metadata": meta,
                        "spec": spec}
            old = existing.get(name)
            if old is None:
                answer = self._api.create_slice(obj)
            else:
                meta["resourceVersion"] = old.get("metadata", {}).get("resourceVersion", "")
                answer = self._api.update_slice(obj)
            self.live.apply(answer)
            self.writes += 1
        self._generation = generation
        for name in sorted(set(existing) - set(wanted)):
            answer = self._api.delete_slice(name)
            # Without the deleted object's version (a Status, or 404), "deleted, whatever came before".
            self.live.remove(name, str(answer.get("metadata", {}).get("resourceVersion", "")))
            self.writes += 1
