"""The node's metrics, computed at each scrape from what is true right now.

A custom collector, not gauges set by the calls: a gauge set at ADD and cleared at DEL would go
stale when a pod dies without a DEL, when the agent restarts, or when the host's address moves by
hand; reading the node at scrape time cannot disagree with it. So ``rdma_cni_bond_holder`` exists
exactly while a live pod netns holds a bond's addresses and goes away when they are given back.

Read per scrape, never cached: sysfs (ports, the GID slots up to the bond IP's, counters), one
rtnetlink address dump of the agent's netns (the node's: the agent runs hostNetwork), the
rdma-macvlan state records of every data dir the CNI configs name, and the device plugin's status
file ``<runDir>/device-plugin/status.json``. A part that fails is skipped and counted in
``rdma_cni_scrape_errors_total{section}``; the rest is still served.

Series (labels in braces):

* ``rdma_cni_bond_info{bond,rdma_device,numa}`` 1 per bond with an RDMA device (``numa`` "" when
  the kernel does not know it, i.e. ``numa_node`` is -1 or absent);
* ``rdma_cni_bond_holder{bond,pod_namespace,pod}`` 1 while a live pod holds the bond's addresses;
* ``rdma_cni_bond_address_lost{bond}`` 1 when neither the host nor a live pod holds them, else 0;
* ``rdma_cni_gid_index{rdma_device}`` the RoCE v2 GID index of the bond's IPv4 (on the host, or
  in the pod it is lent to: the same slot in shared mode); ``rdma_cni_gid_index_unified`` 1 when at
  least one device has one and all have the same;
* ``rdma_cni_state_records{phase}``, ``rdma_cni_state_unreadable_records``;
* ``rdma_cni_device_plugin_*``: ``status_readable``, ``registered{resource}``,
  ``registrations_total``, ``allocations_total``, ``devices{health}``,
  ``device_healthy{device,netdev}``, ``status_updated_timestamp_seconds`` (the first pool's, as
  before pools); per pool ``pool_devices{resource,mode}``, ``pool_healthy{resource,mode}``,
  ``pool_allocations_total{resource}``, ``pool_member_healthy{resource,member,netdev}`` (one dead
  HCA of a live shared pool shows here, not as a pool outage);
* ``rdma_cni_bond_addresses{bond,state="held|free"}`` and ``rdma_cni_pod_address{bond,address,
  pod_namespace,pod}`` (1 live, 0 netns gone): shared mode's pools, from the rdma-ipvlan network
  config found under ``--conf-dir`` (``cni-tool state``'s numbers);
* ``rdma_cni_port_counter{rdma_device,port,counter}`` per file of ``ports/<p>/counters`` and
  ``rdma_cni_port_hw_counter{...}`` per file of ``ports/<p>/hw_counters``, untyped: most are
  counters, but ``lifespan`` is a setting and some PMA counters saturate instead of wrapping.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from rdma_cni.attachments import PHASE_ADDED, PHASE_ADDING, AttachmentRecord
from rdma_cni.devices.inventory import numa_of
from rdma_cni.doctor import shared_pools
from rdma_cni.doctor.node import pod_names
from rdma_cni.net import addresses, links
from rdma_cni.net.addresses import ip_of
from rdma_cni.net.netns import netlink_in, netns_inode
from rdma_cni.rdma import counters, sysfs
from rdma_cni.rdma.sysfs import RdmaPort
from rdma_cni.state import NodeState

log = logging.getLogger("rdma-agent")

DEFAULT_DATA_DIR = "/var/lib/cni/rdma-macvlan"
DEFAULT_RUN_DIR = "/run/rdma-cni"
DEFAULT_SYSFS_ROOT = "/sys"
RESULTS_DIRS = ("/var/lib/cni", "/var/lib/cni/rdma-multus")
STATUS_FILE = os.path.join("device-plugin", "status.json")


@dataclass(frozen=True)
class Sources:
    """Where the node's facts are: the union over the rdma-macvlan configs the agent knows."""

    sysfs_roots: tuple[str, ...] = (DEFAULT_SYSFS_ROOT,)
    data_dirs: tuple[str, ...] = (DEFAULT_DATA_DIR,)
    run_dirs: tuple[str, ...] = (DEFAULT_RUN_DIR,)
    results_dirs: tuple[str, ...] = RESULTS_DIRS
    conf_dir: str = ""  # where a shared-mode (rdma-ipvlan) network config is looked for; "": none


def sources_of(confs: Iterable[Mapping[str, Any]], conf_dir: str = "") -> Sources:
    """The dirs named by rdma-macvlan configs (their defaults where a key is absent; the plugin's
    own validation reports bad values, here they are only skipped); ``conf_dir``: where the
    shared-mode network's config is looked for (its pools' series)."""
    roots: dict[str, None] = {}
    data: dict[str, None] = {}
    run: dict[str, None] = {}
    for conf in confs:
        for key, default, into in (
            ("sysfsRoot", DEFAULT_SYSFS_ROOT, roots),
            ("dataDir", DEFAULT_DATA_DIR, data),
            ("runDir", DEFAULT_RUN_DIR, run),
        ):
            value = conf.get(key, default)
            if isinstance(value, str) and value:
                into[value] = None
    if not data:
        return Sources(conf_dir=conf_dir)
    return Sources(tuple(roots), tuple(data), tuple(run), conf_dir=conf_dir)


@dataclass
class NodeView:
    """One read of the node, shared by the bond, GID and state series of a scrape."""

    ports: list[tuple[str, RdmaPort]]  # (sysfs root, port)
    host_ipv4: dict[str, list[str]]  # netdev -> IPv4 addresses on the node (absent: no such link)
    records: list[AttachmentRecord]
    unreadable: int
    alive: dict[tuple[str, str], bool] = field(default_factory=dict)  # (cid, ifname) -> netns lives


def read_view(src: Sources) -> NodeView:
    ports = [(root, p) for root in src.sysfs_roots for p in sysfs.list_ports(root)]
    records: list[AttachmentRecord] = []
    unreadable = 0
    for data_dir in src.data_dirs:
        state = NodeState(data_dir)
        records += state.attachments()
        unreadable += len(state.unreadable())
    view = NodeView(ports, _host_ipv4(sorted({p.netdev for _, p in ports if p.netdev})), records, unreadable)
    view.alive = {(r.container_id, r.ifname): _netns_alive(r) for r in records}
    return view


def _host_ipv4(netdevs: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    ipr = netlink_in(None)
    try:
        for name in netdevs:
            link = links.get_link(ipr, name)
            if link is not None:
                out[name] = [c.split("/")[0] for c in addresses.live_cidrs(ipr, link.index) if ":" not in c]
    finally:
        ipr.close()
    return out


def _netns_alive(rec: AttachmentRecord) -> bool:
    if not rec.netns:
        return False
    inode = netns_inode(rec.netns)
    return inode is not None and (not rec.netns_inode or inode == rec.netns_inode)


def _record_ipv4(rec: AttachmentRecord, bond: str) -> list[str]:
    return [ip_of(a) for b in rec.bonds if b.bond == bond for a in b.addresses if ":" not in ip_of(a)]


def _numa(root: str, port: RdmaPort) -> str:
    """The device's NUMA node as the device plugin reads it (its PCI parent's ``numa_node``)."""
    node = numa_of(root, port.device)
    return "" if node is None else str(node)


class NodeCollector(Collector):
    """A prometheus_client collector; ``sources`` is asked at every scrape (configs may change)."""

    def __init__(self, sources: Callable[[], Sources], results_dirs: tuple[str, ...] | None = None) -> None:
        self.sources = sources
        self.results_dirs = results_dirs
        self.errors: dict[str, int] = {}

    def describe(self) -> list[Metric]:
        return []  # no scrape at registration time: the node is read only when asked

    def collect(self) -> Iterator[Metric]:
        src = self.sources()
        sections: list[tuple[str, Callable[[], list[Metric]]]] = []
        view: list[NodeView] = []

        def bonds() -> list[Metric]:
            view.append(read_view(src))
            return self._bonds(view[0], src)

        sections.append(("bonds", bonds))
        sections.append(("state", lambda: self._state(view[0]) if view else []))
        sections.append(("device_plugin", lambda: self._device_plugin(src)))
        sections.append(("port_counters", lambda: self._port_counters(src)))
        sections.append(("shared_pools", lambda: self._shared_pools(src)))
        for name, section in sections:
            try:
                yield from section()
            except Exception as exc:  # noqa: BLE001 - one unreadable part must not hide the others
                log.warning("metrics: %s not collected: %s", name, exc)
                self.errors[name] = self.errors.get(name, 0) + 1
        errors = CounterMetricFamily(
            "rdma_cni_scrape_errors", "Scrape sections that failed (see the agent log)", labels=["section"]
        )
        for name in ("bonds", "state", "device_plugin", "port_counters", "shared_pools"):
            errors.add_metric([name], self.errors.get(name, 0))
        yield errors

    # ---------------------------------------------------------------- shared mode's address pools
    @staticmethod
    def _shared_pools(src: Sources) -> list[Metric]:
        """Per bond of the rdma-ipvlan network: addresses held and free (``cni-tool state``'s
        numbers), and one series per pod address: 1 while its pod's netns lives, 0 once it is gone
        (DEL/GC has yet to free it)."""
        pools = shared_pools.observe(src.conf_dir) if src.conf_dir else None
        if pools is None:
            return []
        count = GaugeMetricFamily(
            "rdma_cni_bond_addresses", "Shared mode: a bond's pod addresses by state",
            labels=["bond", "state"],
        )
        holder = GaugeMetricFamily(
            "rdma_cni_pod_address",
            "Shared mode: 1 while a live pod holds this address of the bond, 0 when its netns is gone",
            labels=["bond", "address", "pod_namespace", "pod"],
        )
        for b in pools.bonds:
            count.add_metric([b.bond, "held"], len(b.held))
            count.add_metric([b.bond, "free"], b.free)
            for h in b.held:
                namespace, _, pod = h.pod.partition("/")
                holder.add_metric([b.bond, h.address, namespace, pod], 1 if h.alive else 0)
        return [count, holder]

    # ---------------------------------------------------------------- bonds and GIDs
    def _bonds(self, view: NodeView, src: Sources) -> list[Metric]:
        info = GaugeMetricFamily(
            "rdma_cni_bond_info", "A bond and the RDMA device over it", labels=["bond", "rdma_device", "numa"]
        )
        holder = GaugeMetricFamily(
            "rdma_cni_bond_holder",
            "1 while a live pod holds the bond's addresses",
            labels=["bond", "pod_namespace", "pod"],
        )
        lost = GaugeMetricFamily(
            "rdma_cni_bond_address_lost",
            "1 when neither the host nor a live pod holds the bond's addresses",
            labels=["bond"],
        )
        gid = GaugeMetricFamily(
            "rdma_cni_gid_index", "RoCE v2 GID index of the bond's IPv4 address", labels=["rdma_device"]
        )
        held: dict[str, list[AttachmentRecord]] = {}
        dead: dict[str, list[AttachmentRecord]] = {}
        for rec in view.records:
            into = held if view.alive.get((rec.container_id, rec.ifname)) else dead
            for b in rec.bonds:
                into.setdefault(b.bond, []).append(rec)
        for bond, recs in sorted(held.items()):
            for rec in recs:
                namespace, pod = self._pod(rec, src)
                holder.add_metric([bond, namespace, pod], 1)
        indices: dict[str, int] = {}
        for root, port in view.ports:
            if not port.netdev:
                continue
            bond = port.netdev
            info.add_metric([bond, port.device, _numa(root, port)], 1)
            on_host = view.host_ipv4.get(bond, [])
            lent = [ip for rec in held.get(bond, []) for ip in _record_ipv4(rec, bond)]
            lost.add_metric([bond], 1 if self._lost(bond, on_host, held, dead) else 0)
            for ip in (*on_host, *lent):
                index = sysfs.roce_v2_index(root, port.device, port.port, ip)
                if index is not None:
                    indices[port.device] = index
                    gid.add_metric([port.device], index)
                    break
        unified = GaugeMetricFamily(
            "rdma_cni_gid_index_unified",
            "1 when every RDMA device has its RoCE v2 IPv4 GID at the same index",
        )
        unified.add_metric([], 1 if indices and len(set(indices.values())) == 1 else 0)
        return [info, holder, lost, gid, unified]

    @staticmethod
    def _lost(
        bond: str,
        on_host: list[str],
        held: Mapping[str, list[AttachmentRecord]],
        dead: Mapping[str, list[AttachmentRecord]],
    ) -> bool:
        """The doctor's rule (``cni-tool state`` MISSING): a live pod holds them -> not lost; a
        record whose netns is gone -> lost when any of its addresses is not back on the host; no
        record -> lost when the host has no IPv4 address on the bond."""
        if held.get(bond):
            return False
        if dead.get(bond):
            return any(ip not in on_host for rec in dead[bond] for ip in _record_ipv4(rec, bond))
        return not on_host

    def _pod(self, rec: AttachmentRecord, src: Sources) -> tuple[str, str]:
        """The pod as the runtime named it in CNI_ARGS: the record's, or (records written before
        it kept them) the libcni result cache's."""
        if rec.pod_name:
            return rec.pod_namespace, rec.pod_name

        found = pod_names(self.results_dirs or src.results_dirs, rec.container_id)
        namespace, _, name = found.partition("/")
        return (namespace, name) if name else ("", "")

    # ---------------------------------------------------------------- state
    @staticmethod
    def _state(view: NodeView) -> list[Metric]:
        records = GaugeMetricFamily(
            "rdma_cni_state_records", "rdma-macvlan attachment records by phase", labels=["phase"]
        )
        for phase in (PHASE_ADDING, PHASE_ADDED):
            records.add_metric([phase], sum(1 for r in view.records if r.phase == phase))
        unreadable = GaugeMetricFamily(
            "rdma_cni_state_unreadable_records",
            "State files that cannot be read (DEL cannot restore from them; see cni-tool state)",
        )
        unreadable.add_metric([], view.unreadable)
        return [records, unreadable]

    # ---------------------------------------------------------------- device plugin
    @staticmethod
    def _device_plugin(src: Sources) -> list[Metric]:
        readable = GaugeMetricFamily(
            "rdma_cni_device_plugin_status_readable",
            "1 when the device plugin's status file exists and parses",
            labels=["path"],
        )
        series: list[Metric] = []
        for run_dir in src.run_dirs:
            path = os.path.join(run_dir, STATUS_FILE)
            status = _read_status(path)
            readable.add_metric([path], 1 if status is not None else 0)
            if status is not None and not series:  # one device plugin per node: the first found
                series = _device_plugin_series(status)
        return [readable, *series]

    # ---------------------------------------------------------------- port counters
    @staticmethod
    def _port_counters(src: Sources) -> list[Metric]:
        labels = ["rdma_device", "port", "counter"]
        pma = UnknownMetricFamily(
            "rdma_cni_port_counter", "RDMA port counter (ports/<p>/counters/<counter>)", labels=labels
        )
        hw = UnknownMetricFamily(
            "rdma_cni_port_hw_counter", "RDMA driver counter (ports/<p>/hw_counters/<counter>)", labels=labels
        )
        for root in src.sysfs_roots:
            for device in sysfs.list_devices(root):
                for port in _ports(root, device):
                    kinds = counters.read_counters(root, device, port)
                    for kind, family in (("counters", pma), ("hw_counters", hw)):
                        for name, value in kinds.get(kind, {}).items():
                            family.add_metric([device, str(port), name], value)
        return [pma, hw]


def _ports(root: str, device: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(os.path.join(sysfs.device_dir(root, device), "ports"))
                      if n.isdigit())
    except OSError:
        return []


def _read_status(path: str) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("metrics: device plugin status %s unreadable: %s", path, exc)
        return None
    return data if isinstance(data, dict) else None


def _device_plugin_series(status: Mapping[str, Any]) -> list[Metric]:
    """The status file's contract (helpers' COMMON.md): resourceName, registered, registrations,
    allocations, updated, devices[{id, netdev, healthy, ...}]."""
    resource = str(status.get("resourceName", ""))
    registered = GaugeMetricFamily(
        "rdma_cni_device_plugin_registered", "1 while the device plugin is registered with the kubelet",
        labels=["resource"],
    )
    registered.add_metric([resource], 1 if status.get("registered") is True else 0)
    registrations = CounterMetricFamily(
        "rdma_cni_device_plugin_registrations", "Registrations with the kubelet since the plugin started"
    )
    registrations.add_metric([], _number(status.get("registrations")))
    allocations = CounterMetricFamily(
        "rdma_cni_device_plugin_allocations", "Allocate calls answered since the plugin started"
    )
    allocations.add_metric([], _number(status.get("allocations")))
    devices = [d for d in status.get("devices", []) if isinstance(d, dict)]
    by_health = GaugeMetricFamily(
        "rdma_cni_device_plugin_devices", "Devices advertised to the kubelet by health", labels=["health"]
    )
    healthy = sum(1 for d in devices if d.get("healthy") is True)
    by_health.add_metric(["healthy"], healthy)
    by_health.add_metric(["unhealthy"], len(devices) - healthy)
    per_device = GaugeMetricFamily(
        "rdma_cni_device_plugin_device_healthy", "1 when the device is advertised healthy",
        labels=["device", "netdev"],
    )
    for d in devices:
        ok = 1 if d.get("healthy") is True else 0
        per_device.add_metric([str(d.get("id", "")), str(d.get("netdev", ""))], ok)
    updated = GaugeMetricFamily(
        "rdma_cni_device_plugin_status_updated_timestamp_seconds",
        "When the device plugin last wrote its status (a stale one: the plugin is stuck or gone)",
    )
    updated.add_metric([], _number(status.get("updated")))
    pools = [p for p in status.get("pools", []) if isinstance(p, dict)]
    for pool in pools[1:]:  # the first is the top level's, already above
        registered.add_metric([str(pool.get("resourceName", ""))], 1 if pool.get("registered") is True else 0)
    return [registered, registrations, allocations, by_health, per_device, updated, *_pool_series(pools)]


def _pool_series(pools: list[dict[str, Any]]) -> list[Metric]:
    """Every pool's count, health, allocations and members, labelled by its resource."""
    count = GaugeMetricFamily("rdma_cni_device_plugin_pool_devices",
                              "Devices a pool advertises to the kubelet", labels=["resource", "mode"])
    healthy = GaugeMetricFamily("rdma_cni_device_plugin_pool_healthy",
                                "1 while a pool can be allocated from (a shared pool: any HCA usable)",
                                labels=["resource", "mode"])
    allocations = CounterMetricFamily("rdma_cni_device_plugin_pool_allocations",
                                      "Allocate container requests a pool answered", labels=["resource"])
    members = GaugeMetricFamily("rdma_cni_device_plugin_pool_member_healthy",
                                "1 when a pool's HCA (shared) or bond (exclusive) is usable",
                                labels=["resource", "member", "netdev"])
    for pool in pools:
        name, mode = str(pool.get("resourceName", "")), str(pool.get("mode", ""))
        rows = [m for m in pool.get("hcas", pool.get("devices", [])) if isinstance(m, dict)]
        advertised = _number(pool.get("count")) if rows or mode != "shared" else 0.0
        count.add_metric([name, mode], advertised)
        healthy.add_metric([name, mode], 1 if pool.get("healthy") is True else 0)
        allocations.add_metric([name], _number(pool.get("allocations")))
        for m in rows:
            netdev = m.get("netdev") or ",".join(str(n) for n in m.get("netdevs", []))
            ok = 1 if m.get("healthy") is True else 0
            members.add_metric([name, str(m.get("id", "")), str(netdev)], ok)
    return [count, healthy, allocations, members] if pools else []


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
