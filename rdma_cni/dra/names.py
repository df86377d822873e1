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

# The driver name and the bond -> device name mapping live in the device model, where rdma-multus
# (policy too, so never importing this package) reads them as well.
from rdma_cni.devices.dra_names import DRIVER, device_name, device_names

__all__ = ["DRIVER", "device_name", "device_names"]

API_VERSION = "resource.k8s.io/v1"

# Standard attributes (kubernetes.io "DRA standard device attributes"): what a claim aligns GPUs
# and NICs by (matchAttribute resource.kubernetes.io/pcieRoot).
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
NUMA_NODE = "resource.kubernetes.io/numaNode"
# Our own: unqualified names are in the driver's domain (rdma.tke.cloud.tencent.com/bond in CEL).
BOND, HCA, LINK_LAYER, GID_INDEX, IPV4_SUBNET = "bond", "hca", "linkLayer", "gidIndex", "ipv4Subnet"
# Upstream Multus's DRA path (its main branch after v4.3.0) finds a claim's devices in the slices by
# these two: the NAD's k8s.v1.cni.cncf.io/resourceName must equal the second, and the first becomes the
# delegate's deviceID. Devices without them it skips.
MULTUS_DEVICE_ID = "k8s.cni.cncf.io/deviceID"
MULTUS_RESOURCE_NAME = "k8s.cni.cncf.io/resourceName"
# Shared mode: the consumable capacity each claim takes a share of (TKE's "1 of sharedCount").
SHARES = "shares"

UNHEALTHY_TAINT = f"{DRIVER}/unhealthy"
NO_SCHEDULE = "NoSchedule"

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_STRING = 64

# CDI: vendor/class of the devices this driver hands out (spec files <vendor>-<class>_<uid>.json).
CDI_KIND = f"{DRIVER}/bond"


# The config pool a device is of (``pools:`` or Mellanox's configList): its resource name, so a
# DeviceClass per pool selects ``device.attributes["rdma.tke.cloud.tencent.com"].pool == "rdma/ib"``.
# Left out in the default form (no pools listed: one pool).
POOL = "pool"
