"""What ``cni-tool doctor --pods`` reads to show each pod's GPU and NIC alignment, once per run:

- kubelet's PodResources: every container's device-plugin devices (with kubelet's NUMA nodes, from
  ``GetAllocatableResources``) and DRA claim devices (``dynamic_resources``);
- from the API server, only when a container holds DRA devices of a GPU driver or ours: the
  ResourceSlices of the pools those devices come from (``fieldSelector spec.driver,spec.pool.name``),
  for their ``pcieRoot``/``numaNode``/``pciBusID``;
- sysfs: the node's bonds and the PCI functions GPUs are named by.

Anything that cannot be read is said in the view (``kubelet_error``, ``slices_error``) and never
raised: a doctor on a node without kubelet or without API access still shows what it can (our NICs'
places come from sysfs whichever front end allocated them).

The API server is found as a client in the cluster would: ``--kubeconfig``, else the pod's
ServiceAccount (the DaemonSet's refresh container, whose rdma-cni account may list resourceslices in
the DRA variant, conf/k8s/dra/rdma-dra-rbac.yaml), else the meta plugin's installed kubeconfig (the
same account's token, written by install.sh).

    view = observe_pods(observe(paths), api_config("", "/etc/cni/net.d", os.environ))
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rdma_cni.cni.errors import CniError
from rdma_cni.devices import pci
from rdma_cni.devices.dra_names import node_bonds
from rdma_cni.doctor.alignment import Container, DeviceFacts, Kinds, NodeBond, Place
from rdma_cni.doctor.node import DELEGATE_SUBDIR, NodeSnapshot
from rdma_cni.dra import names
from rdma_cni.dra.kubeapi import in_cluster
from rdma_cni.kube import kubeconfig, podresources
from rdma_cni.kube.client import PodClient
from rdma_cni.kube.kubeconfig import KubeConfig

ABSENT = "absent"
INSTALLED_KUBECONFIG = "rdma-multus.kubeconfig"  # install.sh --kubeconfig-from-serviceaccount
API_TIMEOUT = 5.0  # the whole list, retries included: a readiness-probe-sized wait
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
LIST_RBAC = (
    "grant the doctor's identity 'list' on resourceslices (resource.k8s.io): the ClusterRole "
    "rdma-cni-dra of conf/k8s/dra/rdma-dra-rbac.yaml has it"
)
DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True)
class ApiAccess:
    """How to reach the API server (``config`` None: not at all, ``where`` says why)."""

    config: KubeConfig | None
    where: str


@dataclass
class PodsView:
    socket: str
    kubelet_error: str  # "" = answered; ABSENT = no socket; else the client's sentence
    containers: list[Container]
    bonds: list[NodeBond]
    kinds: Kinds
    api: str = ""  # where the API server was found, "" when it was not needed
    pools: list[tuple[str, str]] = field(default_factory=list)  # (driver, pool) whose slices were read
    facts: dict[DeviceKey, DeviceFacts] = field(default_factory=dict)
    slices_error: str = ""  # "" = read, or nothing to read; else why not
    pci: dict[str, Place] = field(default_factory=dict)  # PCI address -> its place in sysfs


# ------------------------------------------------------------------------------ the API server


def api_config(kubeconfig_path: str, conf_dir: str, env: Mapping[str, str]) -> ApiAccess:
    """The first of: ``--kubeconfig``, the pod's ServiceAccount, the meta plugin's installed kubeconfig."""
    installed = os.path.join(conf_dir, DELEGATE_SUBDIR, INSTALLED_KUBECONFIG)
    try:
        if kubeconfig_path:
            return ApiAccess(kubeconfig.load(kubeconfig_path), f"kubeconfig {kubeconfig_path}")
        if env.get("KUBERNETES_SERVICE_HOST"):
            return ApiAccess(in_cluster(dict(env)), "the pod's ServiceAccount")
        if os.path.exists(installed):
            return ApiAccess(kubeconfig.load(installed), f"kubeconfig {installed}")
    except CniError as err:
        return ApiAccess(None, err.msg)
    return ApiAccess(None, f"no API server known: not in a pod, no --kubeconfig, no {installed}")


class SliceReader(PodClient):
    """:class:`PodClient`'s transport (TLS, deadline, bounded retries) with the one list the doctor makes."""

    def pool_slices(self, driver: str, pool: str) -> list[dict[str, Any]]:
        selector = urllib.parse.quote(f"spec.driver={driver},spec.pool.name={pool}", safe="")
        obj = self._get_object(f"{SLICES}?fieldSelector={selector}",
                               f"ResourceSlices of {driver} pool {pool}", LIST_RBAC)
        items = obj.get("items") if obj is not None else None
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _newest(slices: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The slices of a pool's newest generation: older ones are being replaced (the scheduler ignores
    them too)."""
    specs = [s.get("spec") for s in slices]
    specs_ok = [s for s in specs if isinstance(s, dict)]

    def generation(spec: dict[str, Any]) -> int:
        pool = spec.get("pool")
        value = pool.get("generation") if isinstance(pool, dict) else None
        return value if isinstance(value, int) else 0

    top = max((generation(s) for s in specs_ok), default=0)
    return [s for s in specs_ok if generation(s) == top]


def _values(attr: Any, one: str, many: str) -> tuple[Any, ...]:
    """An attribute's value(s): ``{"string": x}`` or, as a list attribute, ``{"strings": [...]}``."""
    if not isinstance(attr, dict):
        return ()
    if one in attr:
        return (attr[one],)
    value = attr.get(many)
    return tuple(value) if isinstance(value, list) else ()


def device_facts(driver: str, device: dict[str, Any]) -> DeviceFacts:
    """Where one slice device is, from its standard attributes (and a GPU driver's own ``pcieBusID``,
    which NVIDIA's driver publishes, when the standard ``pciBusID`` is absent)."""
    attrs = device.get("attributes")
    attrs = attrs if isinstance(attrs, dict) else {}

    def own(name: str) -> Any:
        return attrs.get(name, attrs.get(f"{driver}/{name}"))

    roots = tuple(str(r) for r in _values(attrs.get(names.PCIE_ROOT), "string", "strings"))
    numa = tuple(n for n in _values(attrs.get(names.NUMA_NODE), "int", "ints") if isinstance(n, int))
    bus = _values(attrs.get(names.PCI_BUS_ID) or own("pcieBusID"), "string", "strings")
    bond = _values(own(names.BOND), "string", "strings")
    return DeviceFacts(Place(roots, numa), str(bus[0]).lower() if bus else "", str(bond[0]) if bond else "")


def read_facts(client: SliceReader, pools: Iterable[tuple[str, str]]) -> dict[DeviceKey, DeviceFacts]:
    """(driver, pool, device) -> facts for every device of the pools' newest slices. Raises CniError."""
    out: dict[DeviceKey, DeviceFacts] = {}
    for driver, pool in pools:
        for spec in _newest(client.pool_slices(driver, pool)):
            for dev in spec.get("devices") or []:
                if isinstance(dev, dict) and isinstance(dev.get("name"), str):
                    out[(driver, pool, dev["name"])] = device_facts(driver, dev)
    return out


# ------------------------------------------------------------------------------ sysfs


def pci_place(sysfs_root: str, address: str) -> Place:
    """The root complex and NUMA node of PCI function ``address`` (empty where sysfs does not say)."""
    root = pci.pcie_root(sysfs_root, address)
    try:
        with open(os.path.join(sysfs_root, "bus", "pci", "devices", address, "numa_node")) as f:
            numa = int(f.read().strip())
    except (OSError, ValueError):
        numa = -1
    return Place((root,) if root else (), (numa,) if numa >= 0 else ())


def read_bonds(sysfs_root: str) -> list[NodeBond]:
    """The node's bonds, named as the DRA driver names them, each with its PCI place."""
    out = []
    for bond in node_bonds(sysfs_root, None).values():
        address = pci.address_of(sysfs_root, bond.device)
        place = pci_place(sysfs_root, address) if address else Place()
        out.append(NodeBond(bond.name, bond.device, bond.netdev, place))
    return out


def _addresses(
    containers: Iterable[Container], facts: Mapping[DeviceKey, DeviceFacts], kinds: Kinds
) -> set[str]:
    """Every PCI address a GPU is known by: a device-plugin GPU's ID, a DRA GPU's bus ID."""
    out = {f.bus_id for (driver, _, _), f in facts.items() if driver in kinds.gpu_drivers and f.bus_id}
    for c in containers:
        for resource, ids in c.devices.items():
            if resource in kinds.gpu_resources:
                out |= {i.lower() for i in ids if pci.ADDRESS.fullmatch(i.lower())}
    return out


# ------------------------------------------------------------------------------ one read


def _containers(socket: str, timeout: float) -> list[Container]:
    """Every container kubelet knows, with its devices' NUMA nodes (allocatable: one entry per ID)."""
    numa = {a.device_id: a.numa for a in podresources.allocatable(socket, timeout)}
    out = []
    for got in podresources.list_containers(socket, timeout):
        ids = {i for dev_ids in got.given.devices.values() for i in dev_ids}
        out.append(Container(f"{got.pod[0]}/{got.pod[1]}", got.container, got.given.devices,
                             got.given.claims, {i: numa[i] for i in ids if i in numa}))
    return out


def shared_resources(snap: NodeSnapshot) -> frozenset[str]:
    """The device plugin's shared pools (its status file): their IDs name no bond, a pod gets every bond."""
    status = snap.device_plugin.status if snap.device_plugin is not None else None
    pools = (status or {}).get("pools")
    return frozenset(
        str(p.get("resourceName")) for p in pools if isinstance(p, dict) and p.get("mode") == "shared"
    ) if isinstance(pools, list) else frozenset()  # fmt: skip


def observe_pods(snap: NodeSnapshot, access: ApiAccess, kinds: Kinds | None = None) -> PodsView:
    """One read of what :mod:`rdma_cni.doctor.pod_checks` judges, beside the node's snapshot ``snap``."""
    paths = snap.paths
    kinds = kinds or Kinds(shared_resources=shared_resources(snap))
    sock = podresources.socket_path(paths.pod_resources())
    view = PodsView(sock, ABSENT, [], read_bonds(paths.sysfs_root), kinds)
    if podresources.available(sock):
        try:
            view.containers = _containers(sock, paths.kubelet_timeout)
            view.kubelet_error = ""
        except CniError as err:
            view.kubelet_error = err.msg
    wanted = {kinds.nic_driver, *kinds.gpu_drivers}
    view.pools = sorted({(c.driver, c.pool) for k in view.containers for c in k.claims if c.driver in wanted})
    if view.pools:
        view.api = access.where
        if access.config is None:
            view.slices_error = f"ResourceSlices not read: {access.where}"
        else:
            try:
                reader = SliceReader(access.config, timeout=API_TIMEOUT, attempts=2)
                view.facts = read_facts(reader, view.pools)
            except CniError as err:
                view.slices_error = f"ResourceSlices not read: {err.msg}"
    view.pci = {a: pci_place(paths.sysfs_root, a) for a in _addresses(view.containers, view.facts, kinds)}
    return view
