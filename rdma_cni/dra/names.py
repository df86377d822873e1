"""Every name the Kubernetes API sees from this driver, and the API's limits, in one place (as
dranet's ``pkg/apis``).

Field names and limits are those of ``resource.k8s.io/v1`` as checked in
``k8s.io/api@v0.37.2/resource/v1/types.go`` (Go module cache): ``ResourceSliceMaxDevices = 128``,
``ResourceSliceMaxDevicesWithAdvancedFeatures = 64`` (any device with taints, counters or list
attributes), ``DeviceMaxIDLength = 32`` for an attribute's name, ``DeviceAttributeMaxValueLength = 64``
for a string value, ``ResourceSliceMaxAttributesAndCapacitiesPerDevice = 32``, a device name a DNS
label, taint effects ``None``/``NoSchedule``/``NoExecute``.
"""

from __future__ import annotations

import re

DRIVER = "rdma.tke.cloud.tencent.com"
API_VERSION = "resource.k8s.io/v1"

# Standard attributes (kubernetes.io "DRA standard device attributes"): what a claim aligns GPUs
# and NICs by (matchAttribute resource.kubernetes.io/pcieRoot).
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"
# Our own: unqualified names are in the driver's domain (rdma.tke.cloud.tencent.com/bond in CEL).
BOND, HCA, LINK_LAYER, GID_INDEX, IPV4_SUBNET = "bond", "hca", "linkLayer", "gidIndex", "ipv4Subnet"
# Shared mode: the consumable capacity each claim takes a share of (TKE's "1 of sharedCount").
SHARES = "shares"

UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
NO_SCHEDULE = "NoSchedule"

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_STRING = 64

# CDI: vendor/class of the devices this driver hands out (spec files <vendor>-<class>_<uid>.json).
CDI_KIND = f"{DRIVER}/bond"

_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


def device_name(bond_netdev: str) -> str:
    """The DRA device name of a bond: its netdev name as a DNS label (``bond0``; ``Bond_A`` ->
    ``bond-a``), at most 63 characters."""
    label = _NOT_LABEL.sub("-", bond_netdev.lower()).strip("-")[:63].strip("-")
    return label or "bond"


def device_names(netdevs: list[tuple[str, str]]) -> dict[str, str]:
    """device ID -> DRA device name for ``(device ID, bond netdev)`` pairs in the model's order; two
    netdevs that give the same label (``bond_a``, ``bond-a``) are told apart by a suffix, the later
    one in the model's order taking it, so the mapping is the same on every scan of the same node."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for device_id, netdev in netdevs:
        name = base = device_name(netdev)
        n = 1
        while name in taken:
            n += 1
            name = f"{base[: 63 - len(str(n)) - 1]}-{n}"
        taken.add(name)
        out[device_id] = name
    return out


# The config pool a device is of (``pools:`` or Mellanox's configList): its resource name, so a
# DeviceClass per pool selects ``device.attributes["rdma.tke.cloud.tencent.com"].pool == "rdma/ib"``.
# Left out in the default form (no pools listed: one pool).
POOL = "pool"
