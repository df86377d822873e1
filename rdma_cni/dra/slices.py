"""The ResourceSlice ``spec`` documents of one scan: a pure function of the driver's device table
(:mod:`.table`, made from the device model) and the bonds' facts, tested without sockets.

One device per table entry: a bond (named after its netdev, ``bond0``) or, when the config lists
pools, any HCA a pool holds (``mlx5-4``). Each carries the standard attributes
``resource.kubernetes.io/{pcieRoot,pciBusID,numaNode}`` from the model's PCI facts (numaNode left out
where sysfs says -1 or nothing) and our own: ``hca`` and ``linkLayer`` for every device; ``bond``,
``gidIndex`` and ``ipv4Subnet`` for a bond; ``pool`` (its pool's resource name) when the config lists
pools. Each is left out when unknown. Every device also carries what upstream Multus's DRA path
(after v4.3.0) matches a NAD by: ``k8s.cni.cncf.io/resourceName`` (the pool's resource name, or the
config's ``resourceName``) and ``k8s.cni.cncf.io/deviceID`` (the RDMA device name, ``mlx5_bond_3``,
which becomes the delegate's ``deviceID``). A device the model calls Unhealthy carries the taint
``rdma.tke.cloud.tencent.com/unhealthy:NoSchedule`` (with the model's reason as its value, cut to
the API's 63 characters): the scheduler then never allocates it, as kubelet never hands out a device
the device plugin lists Unhealthy. A shared device (TKE's ``mode: shared``: every bond with
``sharedCount``; a shared pool's members with the pool's count) is ``allowMultipleAllocations`` with
a consumable capacity ``shares`` of that count (default request 1): TKE's "1 of 1000".

Slices hold at most 128 devices, 64 when any of them is tainted (the API's limits); the pool (named
after the node) spans as many slices as that needs, each saying how many there are.

    specs = table_specs("node-a", table, facts)          # [{"driver": ..., "devices": [...]}]
    specs = slice_specs("node-a", snap, facts, None)     # the default form, from a bond snapshot
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rdma_cni.devices.config import DEFAULT_RESOURCE
from rdma_cni.devices.facts import BondFacts
from rdma_cni.devices.hca import ETHERNET, INFINIBAND
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot
from rdma_cni.dra import names
from rdma_cni.dra.table import DeviceTable, DraDevice, of_bonds

Doc = dict[str, Any]


def _string(value: str) -> Doc:
    return {"string": value[: names.MAX_STRING]}


def placement(device: RdmaBond) -> Doc:
    """The standard attributes: where the device sits on PCI and which NUMA node it is on."""
    out: Doc = {}
    if device.pcie_root:
        out[names.PCIE_ROOT] = _string(device.pcie_root)
    if device.pci:
        out[names.PCI_BUS_ID] = _string(device.pci)
    if device.numa is not None and device.numa >= 0:
        out[names.NUMA_NODE] = {"int": device.numa}
    return out


def attributes(bond: RdmaBond, facts: BondFacts | None) -> Doc:
    """A bond's attributes: only what is known (an attribute must hold exactly one value)."""
    out: Doc = {names.BOND: _string(bond.netdev), names.HCA: _string(bond.id), **placement(bond)}
    if facts is not None:
        if facts.link_layer:
            out[names.LINK_LAYER] = _string(facts.link_layer)
        if facts.gid_index is not None:
            out[names.GID_INDEX] = {"int": facts.gid_index}
        if facts.ipv4_subnet:
            out[names.IPV4_SUBNET] = _string(facts.ipv4_subnet)
    return out


def taint(reason: str) -> Doc:
    """The taint of an Unhealthy device. A taint's value is a label value (63 characters of
    ``[A-Za-z0-9_.-]``), so the model's sentence is reduced to that; the full reason is in the log."""
    value = "".join(c if c.isalnum() or c in "_.-" else "-" for c in reason)[:63].strip("-_.")
    out: Doc = {"key": names.UNHEALTHY_TAINT, "effect": names.NO_SCHEDULE}
    if value:
        out["value"] = value
    return out


def _link_layer(dev: DraDevice) -> Doc | None:
    """The link layer the HCA read gave, when it is one the API should see (not ``UNKNOWN``)."""
    return _string(dev.link_layer) if dev.link_layer in (ETHERNET, INFINIBAND) and dev.link_layer else None


def hca_attributes(dev: DraDevice) -> Doc:
    """An HCA outside the bonds: its name, place and link layer (no GID index: nothing in the model
    gives one to a device the CNI does not address)."""
    out: Doc = {names.HCA: _string(dev.device.id), **placement(dev.device)}
    layer = _link_layer(dev)
    if layer is not None:
        out[names.LINK_LAYER] = layer
    return out


def multus_attributes(dev: DraDevice) -> Doc:
    """What upstream Multus's DRA path matches a NAD by and hands its delegate: the resource the
    device counts under (the NAD's ``resourceName``, the same name as under the device plugin) and
    the RDMA device name as ``deviceID`` (``mlx5_bond_3``: the device plugin's ID for that bond, and
    a name rdma-macvlan maps to its bond)."""
    return {
        names.MULTUS_DEVICE_ID: _string(dev.device.id),
        names.MULTUS_RESOURCE_NAME: _string(dev.resource_name),
    }


def table_device(dev: DraDevice, facts: BondFacts | None) -> Doc:
    """The slice's entry for ``dev`` (``facts``: its bond's, when it is a bond)."""
    attrs = attributes(dev.device, facts) if dev.bond else hca_attributes(dev)
    layer = _link_layer(dev)
    if names.LINK_LAYER not in attrs and layer is not None:  # a bond whose facts are not read yet
        attrs[names.LINK_LAYER] = layer
    if dev.pool is not None:
        attrs[names.POOL] = _string(dev.pool)
    attrs.update(multus_attributes(dev))
    return _document(dev.name, attrs, dev.health, dev.shares)


def _document(name: str, attrs: Doc, health: DeviceHealth, shared_count: int | None) -> Doc:
    out: Doc = {"name": name, "attributes": attrs}
    if shared_count is not None:
        out["allowMultipleAllocations"] = True
        out["capacity"] = {names.SHARES: {
            "value": str(shared_count),
            "requestPolicy": {"default": "1", "validRange": {"min": "1", "step": "1"}},
        }}
    if not health.healthy:
        out["taints"] = [taint(health.reason)]
    return out


def table_devices(table: DeviceTable, facts: Mapping[str, BondFacts]) -> list[Doc]:
    """One entry per device of ``table``, in its order."""
    return [table_device(d, facts.get(d.device.id) if d.bond else None) for d in table.devices]


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
                generation: int = 1, resource_name: str = DEFAULT_RESOURCE) -> list[Doc]:
    """The default form's slices: one device per bond of ``snap`` (see :func:`table_specs`)."""
    return table_specs(node, of_bonds(snap, shared_count, resource_name), facts, generation)


def table_specs(node: str, table: DeviceTable, facts: Mapping[str, BondFacts],
                generation: int = 1) -> list[Doc]:
    """The ``spec`` of each of the node's slices (see the module doc); a node without devices has one
    empty slice, which tells the scheduler the pool exists and is empty."""
    parts = chunks(table_devices(table, facts))
    return [
        {
            "driver": names.DRIVER,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": len(parts)},
            "nodeName": node,
            "devices": part,
        }
        for part in parts
    ]
