"""The ResourceSlice ``spec`` documents of one scan: a pure function of the device model's snapshot
and the bonds' facts, tested without sockets.

One device per RDMA bond, named after the bond netdev (:func:`~rdma_cni.dra.names.device_names`),
with the standard attributes ``resource.kubernetes.io/{pcieRoot,pciBusID,numaNode}`` (numaNode left
out where sysfs says -1 or nothing) and our own (``bond``, ``hca``, ``linkLayer``, ``gidIndex``,
``ipv4Subnet``), each left out when unknown. A bond the model calls Unhealthy carries the taint
``rdma.tke.cloud.tencent.com/unhealthy:NoSchedule`` (with the model's reason as its value, cut to
the API's 63 characters): the scheduler then never allocates it, as kubelet never hands out a device
the device plugin lists Unhealthy. In shared mode every bond is ``allowMultipleAllocations`` with a
consumable capacity ``shares`` of ``sharedCount`` (default request 1): TKE's "1 of 1000".

Slices hold at most 128 devices, 64 when any of them is tainted (the API's limits); the pool (named
after the node) spans as many slices as that needs, each saying how many there are.

    specs = slice_specs("node-a", snap, facts, shared_count=None)   # [{"driver": ..., "devices": [...]}]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rdma_cni.devices.facts import BondFacts
from rdma_cni.devices.model import RdmaBond, Snapshot
from rdma_cni.dra import names

Doc = dict[str, Any]


def _string(value: str) -> Doc:
    return {"string": value[: names.MAX_STRING]}


def attributes(bond: RdmaBond, facts: BondFacts | None) -> Doc:
    """The device's attributes: only what is known (an attribute must hold exactly one value)."""
    out: Doc = {names.BOND: _string(bond.netdev), names.HCA: _string(bond.id)}
    if bond.pcie_root:
        out[names.PCIE_ROOT] = _string(bond.pcie_root)
    if bond.pci:
        out[names.PCI_BUS_ID] = _string(bond.pci)
    if bond.numa is not None and bond.numa >= 0:
        out[names.NUMA_NODE] = {"int": bond.numa}
    if facts is not None:
        if facts.link_layer:
            out[names.LINK_LAYER] = _string(facts.link_layer)
        if facts.gid_index is not None:
            out[names.GID_INDEX] = {"int": facts.gid_index}
        if facts.ipv4_subnet:
            out[names.IPV4_SUBNET] = _string(facts.ipv4_subnet)
    return out


def taint(reason: str) -> Doc:
    """The taint of an Unhealthy bond. A taint's value is a label value (63 characters of
    ``[A-Za-z0-9_.-]``), so the model's sentence is reduced to that; the full reason is in the log."""
    value = "".join(c if c.isalnum() or c in "_.-" else "-" for c in reason)[:63].strip("-_.")
    out: Doc = {"key": names.UNHEALTHY_TAINT, "effect": names.NO_SCHEDULE}
    if value:
        out["value"] = value
    return out


def device(bond: RdmaBond, name: str, healthy: bool, reason: str, facts: BondFacts | None,
           shared_count: int | None) -> Doc:
    out: Doc = {"name": name, "attributes": attributes(bond, facts)}
    if shared_count is not None:
        out["allowMultipleAllocations"] = True
        out["capacity"] = {names.SHARES: {
            "value": str(shared_count),
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
        }}
    if not healthy:
        out["taints"] = [taint(reason)]
    return out


def devices(snap: Snapshot, facts: Mapping[str, BondFacts], shared_count: int | None) -> list[Doc]:
    """One device per bond of ``snap``, in the model's order."""
    by_id = names.device_names([(b.id, b.netdev) for b in snap.bonds])
    out = []
    for bond in snap.bonds:
        health = snap.health_of(bond.id)
        healthy = health is not None and health.healthy
        reason = health.reason if health is not None else "health never checked"
        out.append(device(bond, by_id[bond.id], healthy, reason, facts.get(bond.id), shared_count))
    return out


def chunks(devs: Sequence[Doc]) -> list[list[Doc]]:
    """``devs`` cut into slices the API takes: 128 a slice, 64 where any device is tainted."""
    out: list[list[Doc]] = []
    current: list[Doc] = []
    for dev in devs:
        tainted = any("taints" in d for d in [*current, dev])
        limit = names.MAX_DEVICES_ADVANCED if tainted else names.MAX_DEVICES
        if len(current) + 1 > limit:
            out.append(current)
            current = []
        current.append(dev)
    if current or not out:
        out.append(current)
    return out


def slice_specs(node: str, snap: Snapshot, facts: Mapping[str, BondFacts], shared_count: int | None,
                generation: int = 1) -> list[Doc]:
    """The ``spec`` of each of the node's slices (see the module doc); a node without bonds has one
    empty slice, which tells the scheduler the pool exists and is empty."""
    parts = chunks(devices(snap, facts, shared_count))
    return [
        {
            "driver": names.DRIVER,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(parts)},
            "nodeName": node,
            "devices": part,
        }
        for part in parts
    ]
