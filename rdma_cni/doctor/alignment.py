"""Which of a pod's GPUs and RDMA NICs share a PCIe root: a pure function of what kubelet allocated
(PodResources), what the devices' ResourceSlices say and where the node's bonds sit, tested without
sockets.

GPU and NIC under one root complex is what lets GPUDirect RDMA skip the CPU's interconnect (dranet's
B200 figures: +58-60 % busbw against unaligned placement); a device plugin can promise only NUMA
(kubelet's Topology Manager), a DRA claim can ask for the root (``matchAttribute:
resource.kubernetes.io/pcieRoot``). So, per container:

- each GPU with its root and NUMA node, the NICs under the same root, and the NICs only on the same
  NUMA node;
- the NICs under no GPU's root;
- a verdict: aligned by root (every GPU has a NIC under its root, every NIC a GPU), by NUMA only
  (the same with NUMA nodes), unaligned, or unknown (a place that nothing tells). A container
  holding every bond (TKE's shared mode, a DRA claim with ``allocationMode: All``) is judged by its
  GPUs only: its other NICs were not chosen, NCCL picks the nearest per GPU.

Where the places come from: a DRA device's from its slice's standard attributes
(``resource.kubernetes.io/pcieRoot``, ``numaNode``; its ``pciBusID`` looked up in sysfs for what the
slice leaves out); a device-plugin GPU's NUMA node from kubelet's topology, its root only when its ID
is a PCI address sysfs knows (NVIDIA's plugin names GPUs by UUID: root unknown); our NICs' from the
node's sysfs, whichever front end allocated them. A place may hold several roots or NUMA nodes (list
attributes, KEP-5491): two places meet when they share one.

    for c in align(containers, facts, bonds, pci, Kinds()):
        print(c.pod, c.container, c.verdict, [(g.gpu.name, [n.name for n in g.same_root]) for g in c.gpus])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rdma_cni.devices.dra_names import DRIVER as RDMA_DRIVER
from rdma_cni.kube.podresources import ClaimDevice

ROOT = "aligned by PCIe root"
NUMA = "aligned by NUMA node only"
UNALIGNED = "unaligned"
UNKNOWN = "alignment unknown"
NO_NIC = "GPUs without an RDMA NIC"
NO_GPU = "RDMA NICs without a GPU"

ROOT_UNKNOWN_PLUGIN = "root unknown (device plugin GPU)"


@dataclass(frozen=True)
class Place:
    """Where a device sits: its PCIe root complexes (``pci0000:20``) and NUMA nodes; empty = unknown."""

    roots: tuple[str, ...] = ()
    numa: tuple[int, ...] = ()

    def merged(self, other: Place) -> Place:
        """This place with what it lacks taken from ``other`` (a slice's attribute wins over sysfs)."""
        return Place(self.roots or other.roots, self.numa or other.numa)


@dataclass(frozen=True)
class DeviceFacts:
    """A DRA device's attributes that say where it is (from its ResourceSlice)."""

    place: Place
    bus_id: str = ""  # resource.kubernetes.io/pciBusID (or the driver's own pcieBusID)
    bond: str = ""  # our driver's ``bond`` attribute: the bond netdev


@dataclass(frozen=True)
class NodeBond:
    """One bond of this node as sysfs shows it: its DRA device name, RDMA device and netdev."""

    name: str
    device: str
    netdev: str
    place: Place


@dataclass(frozen=True)
class Container:
    """What kubelet gave one container: device-plugin IDs by resource (with each ID's NUMA nodes, as
    kubelet's topology reports them) and DRA claim devices."""

    pod: str  # "namespace/name"
    name: str
    devices: Mapping[str, Sequence[str]]
    claims: Sequence[ClaimDevice] = ()
    numa: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # device ID -> NUMA nodes


@dataclass(frozen=True)
class Kinds:
    """Which devices are GPUs and which are our NICs. ``shared_resources``: device-plugin resources
    of a shared pool, whose IDs ("0".."999") name no bond: such a pod gets every bond (TKE's shared
    mode mounts every device)."""

    gpu_drivers: frozenset[str] = frozenset({"gpu.nvidia.com"})
    gpu_resources: frozenset[str] = frozenset({"nvidia.com/gpu"})
    nic_driver: str = RDMA_DRIVER
    shared_resources: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Endpoint:
    """A GPU or NIC as the doctor shows it: its name, how it was allocated, where it sits and, where
    the place is (partly) unknown, why."""

    name: str
    source: str  # "claim default/pairs" or the device plugin's resource name
    place: Place
    unknown: str = ""


@dataclass(frozen=True)
class GpuPairing:
    gpu: Endpoint
    same_root: tuple[Endpoint, ...]  # the container's NICs under the GPU's root
    same_numa: tuple[Endpoint, ...]  # its NICs on the GPU's NUMA node(s), under another root

    @property
    def lacks_root_nic(self) -> bool:
        """The GPU's root is known and no NIC of the container is under it."""
        return bool(self.gpu.place.roots) and not self.same_root


@dataclass(frozen=True)
class ContainerAlignment:
    pod: str
    container: str
    gpus: tuple[GpuPairing, ...]
    nics: tuple[Endpoint, ...]
    apart: tuple[Endpoint, ...]  # NICs whose root is known to be no GPU's of the container
    verdict: str
    every_bond: bool = False  # it holds every bond of the node (shared mode): no NIC is apart


# ------------------------------------------------------------------------------ places meeting


def _meet(a: tuple[object, ...], b: tuple[object, ...]) -> bool | None:
    """True: they share one; False: both known, none shared; None: either unknown."""
    if not a or not b:
        return None
    return bool(set(a) & set(b))


def _near(a: Place, b: Place) -> bool | None:
    """Same root or same NUMA node (True), known to be neither (False), or cannot tell (None)."""
    root, numa = _meet(a.roots, b.roots), _meet(a.numa, b.numa)
    if root or numa:
        return True
    if numa is False:
        return False
    return None


def _judge(gpus: Sequence[Endpoint], nics: Sequence[Endpoint], every_bond: bool) -> str:
    """Every GPU near a NIC and, unless the container holds every bond (then the strays are the
    point: NCCL picks per GPU), every NIC near a GPU: by root, else by NUMA node."""
    if not nics:
        return NO_NIC
    if not gpus:
        return NO_GPU
    gpu_root = [[_meet(g.place.roots, n.place.roots) for n in nics] for g in gpus]
    nic_root = [] if every_bond else [list(col) for col in zip(*gpu_root, strict=True)]
    if all(any(row) for row in gpu_root + nic_root):
        return ROOT
    gpu_near = [[_near(g.place, n.place) for n in nics] for g in gpus]
    nic_near = [] if every_bond else [list(col) for col in zip(*gpu_near, strict=True)]
    rows = gpu_near + nic_near
    if all(any(row) for row in rows):
        return NUMA
    if all(any(row) or None in row for row in rows):
        return UNKNOWN
    return UNALIGNED


# ------------------------------------------------------------------------------ the devices


def _claim(c: ClaimDevice) -> str:
    return f"claim {c.claim_namespace}/{c.claim_name}"


def _dra_gpu(c: ClaimDevice, facts: Mapping[tuple[str, str, str], DeviceFacts],
             pci: Mapping[str, Place], slices_error: str) -> Endpoint:
    f = facts.get((c.driver, c.pool, c.device))
    if f is None:
        why = slices_error or f"no ResourceSlice of {c.driver} pool {c.pool} lists it"
        return Endpoint(c.device, _claim(c), Place(), why)
    place = f.place.merged(pci.get(f.bus_id, Place()))
    return Endpoint(c.device, _claim(c), place, "" if place.roots else f"{c.driver} publishes no pcieRoot")


def _plugin_gpu(resource: str, dev: str, numa: tuple[int, ...], pci: Mapping[str, Place]) -> Endpoint:
    place = Place(numa=numa).merged(pci.get(dev.lower(), Place()))
    return Endpoint(dev, resource, place, "" if place.roots else ROOT_UNKNOWN_PLUGIN)


def _dra_nic(c: ClaimDevice, facts: Mapping[tuple[str, str, str], DeviceFacts],
             by_name: Mapping[str, NodeBond], by_netdev: Mapping[str, NodeBond]) -> Endpoint:
    f = facts.get((c.driver, c.pool, c.device))
    bond = (by_netdev.get(f.bond) if f is not None and f.bond else None) or by_name.get(c.device)
    place = (f.place if f is not None else Place()).merged(bond.place if bond is not None else Place())
    name = bond.netdev if bond is not None else (f.bond if f is not None and f.bond else c.device)
    return Endpoint(name, _claim(c), place, "" if place.roots else "neither its slice nor sysfs says")


def _plugin_nic(resource: str, bond: NodeBond) -> Endpoint:
    return Endpoint(bond.netdev, resource, bond.place, "" if bond.place.roots else "sysfs gives no PCIe root")


def _endpoints(c: Container, facts: Mapping[tuple[str, str, str], DeviceFacts], bonds: Sequence[NodeBond],
               pci: Mapping[str, Place], kinds: Kinds, slices_error: str) -> (
    tuple[list[Endpoint], list[Endpoint]]
):  # fmt: skip
    """The container's GPUs and NICs, each once, in the order kubelet reported them."""
    by_name = {b.name: b for b in bonds}
    by_netdev = {b.netdev: b for b in bonds}
    by_id = {**by_netdev, **{b.device: b for b in bonds}}
    gpus: dict[str, Endpoint] = {}
    nics: dict[str, Endpoint] = {}
    for resource, ids in c.devices.items():
        for dev in ids:
            if resource in kinds.gpu_resources:
                gpus.setdefault(f"{resource}/{dev}", _plugin_gpu(resource, dev, c.numa.get(dev, ()), pci))
            elif dev in by_id:
                nics.setdefault(by_id[dev].netdev, _plugin_nic(resource, by_id[dev]))
        if resource in kinds.shared_resources and ids and not any(d in by_id for d in ids):
            for b in bonds:
                nics.setdefault(b.netdev, _plugin_nic(f"{resource} (shared: every bond)", b))
    for claim in c.claims:
        if claim.driver in kinds.gpu_drivers:
            key = f"{claim.driver}/{claim.pool}/{claim.device}"
            gpus.setdefault(key, _dra_gpu(claim, facts, pci, slices_error))
        elif claim.driver == kinds.nic_driver:
            nic = _dra_nic(claim, facts, by_name, by_netdev)
            nics.setdefault(nic.name, nic)
    return list(gpus.values()), list(nics.values())


def _pairing(gpu: Endpoint, nics: Sequence[Endpoint]) -> GpuPairing:
    same_root = tuple(n for n in nics if _meet(gpu.place.roots, n.place.roots))
    same_numa = tuple(n for n in nics if n not in same_root and _meet(gpu.place.numa, n.place.numa))
    return GpuPairing(gpu, same_root, same_numa)


def align_container(c: Container, facts: Mapping[tuple[str, str, str], DeviceFacts],
                    bonds: Sequence[NodeBond], pci: Mapping[str, Place], kinds: Kinds,
                    slices_error: str = "") -> ContainerAlignment | None:
    """The container's alignment; None when it has neither a GPU nor an RDMA NIC."""
    gpus, nics = _endpoints(c, facts, bonds, pci, kinds, slices_error)
    if not gpus and not nics:
        return None
    pairings = tuple(_pairing(g, nics) for g in gpus)
    # known to share no root: beside a GPU of unknown root, a NIC is not called apart
    every = bool(bonds) and {n.name for n in nics} >= {b.netdev for b in bonds}
    apart = () if every else tuple(
        n for n in nics if gpus and all(_meet(n.place.roots, g.place.roots) is False for g in gpus)
    )  # fmt: skip
    return ContainerAlignment(c.pod, c.name, pairings, tuple(nics), apart, _judge(gpus, nics, every), every)


def align(containers: Sequence[Container], facts: Mapping[tuple[str, str, str], DeviceFacts],
          bonds: Sequence[NodeBond], pci: Mapping[str, Place], kinds: Kinds, slices_error: str = "") -> (
    list[ContainerAlignment]
):  # fmt: skip
    """Every container with a GPU or an RDMA NIC, in the order given.

    ``facts``: (driver, pool, device) -> what the device's slice says; ``bonds``: the node's bonds;
    ``pci``: PCI address (lower case) -> its place in sysfs, for GPUs named by address or bus ID;
    ``slices_error``: why the slices could not be read (what a DRA GPU without facts is told)."""
    out = []
    for c in containers:
        got = align_container(c, facts, bonds, pci, kinds, slices_error)
        if got is not None:
            out.append(got)
    return out
