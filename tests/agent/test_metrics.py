"""The agent's metrics, value by value, on a simulated RDMA node.

The collector reads the node as a scrape would: veth "bonds" in a node netns with real addresses
(one lent to a live pod netns, one recorded for a netns that is gone), a simulated sysfs tree
(GID slots, ``numa_node``, the port counter files mlx5 and rxe each have), rdma-macvlan state
written by its own NodeState, and a device plugin status file written here per the shared contract.
The call counters are fed through the real datagram channel the workers use.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import netns
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rdma_cni.agent.metrics import events as metrics_events
from rdma_cni.agent.metrics.node import NodeCollector, Sources, sources_of
from rdma_cni.agent.metrics.server import CallMetrics
from rdma_cni.attachments import PHASE_ADDED, PHASE_ADDING, AttachmentRecord, BondRecord
from rdma_cni.net.netns import entered, open_netns
from rdma_cni.rdma.counters import read_counters
from rdma_cni.rdma.sysfs import gid_for_ip
from rdma_cni.sim import counters as simcounters
from rdma_cni.sim import tree
from rdma_cni.state import NodeState

FIXTURES = Path("/work/shared/fixtures/sysfs-rxe-6.1")
RESOURCE = "tke.cloud.tencent.com/tke-shared-rdma"
IPS = {"bond0": "198.51.100.2", "bond1": "198.51.100.18", "bond2": "198.51.100.34", "bond3": "198.51.100.50"}


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[netns.Node]:
    reason = netns.can_run()
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(netns, "PREFIX", "h13-")
    with netns.node() as n:
        yield n


def address(ip: str) -> dict[str, object]:
    return {"family": 2, "prefixlen": 28, "flags": 128, "scope": 0, "index": 2,
            "attrs": [["IFA_ADDRESS", ip], ["IFA_LOCAL", ip]]}


def record(cid: str, bond: str, netns_path: str, inode: int, phase: str = PHASE_ADDED,
           pod: tuple[str, str] = ("", "")) -> AttachmentRecord:
    return AttachmentRecord(
        container_id=cid, ifname="net1", netns=netns_path, netns_inode=inode, phase=phase,
        network="rdma-net", pod_namespace=pod[0], pod_name=pod[1],
        bonds=[BondRecord(bond=bond, bond_index=2, pod_ifname=bond, temp_name="mvtmp",
                          addresses=[address(IPS[bond])])],
    )


Labels = tuple[tuple[str, str], ...]


class Scraped:
    """The samples of one scrape, parsed back from the text format."""

    def __init__(self, text: str) -> None:
        self.values: dict[tuple[str, Labels], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                self.values[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def get_sample_value(self, name: str, labels: dict[str, str]) -> float | None:
        return self.values.get((name, tuple(sorted(labels.items()))))


class Scrape:
    """Scrapes of a NodeCollector, in the node netns, as the agent's metrics process does."""

    def __init__(self, n: netns.Node, src: Sources) -> None:
        self.n = n
        self.collector = NodeCollector(lambda: src, (os.path.join(n.tmp, "cache"),))

    def __call__(self) -> Scraped:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        with open_netns(f"/run/netns/{self.n.name}") as ns, entered(ns):
            return Scraped(generate_latest(registry).decode())

    def samples(self, name: str) -> dict[Labels, float]:
        return {labels: v for (sample, labels), v in self().values.items() if sample == name}


def value(reg: Scraped | CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


@pytest.fixture
def sim(node: netns.Node, tmp_path: Path) -> tuple[netns.Node, str, Scrape]:
    """bond0 on the host; bond1 lent to a live pod; bond2 recorded for a vanished netns (its IP
    nowhere); bond3 on the host with its GID at index 2 (an extra address shifted it)."""
    n = node
    n.bond("bond0", f"{IPS['bond0']}/28")
    n.bond("bond1")
    n.bond("bond2")
    n.bond("bond3", f"{IPS['bond3']}/28")
    root = str(tmp_path / "sys")
    numa = {0: 1, 1: -1}  # a PCI parent on NUMA node 1; one without NUMA info; two rxe-like (none)
    bonds = [tree.SimBond(f"bond{i}", f"mlx5_bond_{i}", numa_node=numa.get(i)) for i in range(4)]
    tree.build_tree(root, bonds, gid_slots=16)
    tree.write_slot(root, "mlx5_bond_0", 1, 1, gid_for_ip(IPS["bond0"]), "bond0")
    tree.write_slot(root, "mlx5_bond_1", 1, 1, gid_for_ip(IPS["bond1"]), "bond1")  # in the pod
    tree.write_slot(root, "mlx5_bond_3", 1, 2, gid_for_ip(IPS["bond3"]), "bond3")
    pod = n.pod()
    state = NodeState(n.data_dir)
    state.put(record("c-live", "bond1", pod.path, os.stat(pod.path).st_ino, pod=("default", "ibv-app-0")))
    state.put(record("c-gone", "bond2", "/run/netns/h13-gone-netns", 4026531999, phase=PHASE_ADDING))
    os.makedirs(n.run_dir, exist_ok=True)
    src = Sources(sysfs_roots=(root,), data_dirs=(n.data_dir,), run_dirs=(n.run_dir,))
    return n, root, Scrape(n, src)


def test_bonds_holders_lost_and_gid_indices(sim: tuple[netns.Node, str, Scrape]) -> None:
    n, root, scrape = sim
    reg = scrape()
    assert scrape.samples("rdma_cni_bond_info") == {
        (("bond", "bond0"), ("numa", "1"), ("rdma_device", "mlx5_bond_0")): 1,
        (("bond", "bond1"), ("numa", ""), ("rdma_device", "mlx5_bond_1")): 1,
        (("bond", "bond2"), ("numa", ""), ("rdma_device", "mlx5_bond_2")): 1,
        (("bond", "bond3"), ("numa", ""), ("rdma_device", "mlx5_bond_3")): 1,
    }
    assert scrape.samples("rdma_cni_bond_holder") == {
        (("bond", "bond1"), ("pod", "ibv-app-0"), ("pod_namespace", "default")): 1
    }
    lost = {dict(k)["bond"]: v for k, v in scrape.samples("rdma_cni_bond_address_lost").items()}
    assert lost == {"bond0": 0, "bond1": 0, "bond2": 1, "bond3": 0}
    gids = {dict(k)["rdma_device"]: v for k, v in scrape.samples("rdma_cni_gid_index").items()}
    assert gids == {"mlx5_bond_0": 1, "mlx5_bond_1": 1, "mlx5_bond_3": 2}  # bond2: its IP is nowhere
    assert value(reg, "rdma_cni_gid_index_unified") == 0
    assert value(reg, "rdma_cni_scrape_errors_total", section="bonds") == 0

    # bond3's extra address goes and its IP is re-added at index 1: unified again.
    tree.clear_slot(root, "mlx5_bond_3", 1, 2)
    tree.write_slot(root, "mlx5_bond_3", 1, 1, gid_for_ip(IPS["bond3"]), "bond3")
    assert value(scrape(), "rdma_cni_gid_index_unified") == 1
    # The pod's netns goes: bond1 is no longer held by anyone, and its IP is not on the host: lost.
    n.delete_pod(n.pods[0])
    reg = scrape()
    assert scrape.samples("rdma_cni_bond_holder") == {}
    assert value(reg, "rdma_cni_bond_address_lost", bond="bond1") == 1
    # DEL gives it back (here: by hand, and the record removed): held by the host, not lost.
    n.ip("addr", "add", f"{IPS['bond1']}/28", "dev", "bond1")
    NodeState(n.data_dir).remove("c-live", "net1")
    assert value(scrape(), "rdma_cni_bond_address_lost", bond="bond1") == 0


def test_a_record_without_pod_names_is_labelled_from_the_libcni_cache(
    sim: tuple[netns.Node, str, Scrape],
) -> None:
    from rdma_cni.cni.cache import CacheEntry, ResultCache

    n, _, scrape = sim
    state = NodeState(n.data_dir)
    rec = state.get("c-live", "net1")
    assert rec is not None
    rec.pod_namespace = rec.pod_name = ""
    state.put(rec)
    ResultCache(os.path.join(n.tmp, "cache")).write(CacheEntry(
        network="rdma-net", container_id="c-live", ifname="net1", config=b"{}",
        cni_args=[("K8S_POD_NAMESPACE", "team-a"), ("K8S_POD_NAME", "trainer-3")],
    ))
    assert scrape.samples("rdma_cni_bond_holder") == {
        (("bond", "bond1"), ("pod", "trainer-3"), ("pod_namespace", "team-a")): 1
    }


def test_state_records_by_phase_and_unreadable(sim: tuple[netns.Node, str, Scrape]) -> None:
    n, _, scrape = sim
    reg = scrape()
    assert value(reg, "rdma_cni_state_records", phase="added") == 1
    assert value(reg, "rdma_cni_state_records", phase="adding") == 1
    assert value(reg, "rdma_cni_state_unreadable_records") == 0
    Path(n.data_dir, "attachments", "c-broken@net1.json").write_text("{not json")
    assert value(scrape(), "rdma_cni_state_unreadable_records") == 1


def write_status(run_dir: str, **over: object) -> None:
    status: dict[str, object] = {
        "resourceName": "tke.cloud.tencent.com/tke-shared-rdma", "registered": True, "registrations": 2,
        "endpoint": "rdma.sock", "pid": 4242, "updated": 1764590000.5, "allocations": 7,
        "devices": [
            {"id": "mlx5_bond_0", "netdev": "bond0", "numa": 0, "healthy": True, "reason": ""},
            {"id": "mlx5_bond_1", "netdev": "bond1", "numa": 0, "healthy": True, "reason": ""},
            {"id": "mlx5_bond_2", "netdev": "bond2", "numa": 1, "healthy": False, "reason": "port DOWN"},
        ],
    }
    status.update(over)
    path = os.path.join(run_dir, "device-plugin", "status.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(status, f)
    os.replace(path + ".tmp", path)


def test_device_plugin_status_is_read_on_every_scrape(sim: tuple[netns.Node, str, Scrape]) -> None:
    n, _, scrape = sim
    path = os.path.join(n.run_dir, "device-plugin", "status.json")
    reg = scrape()
    assert value(reg, "rdma_cni_device_plugin_status_readable", path=path) == 0
    assert value(reg, "rdma_cni_device_plugin_registered", resource=RESOURCE) is None

    write_status(n.run_dir)
    reg = scrape()
    assert value(reg, "rdma_cni_device_plugin_status_readable", path=path) == 1
    assert value(reg, "rdma_cni_device_plugin_registered", resource=RESOURCE) == 1
    assert value(reg, "rdma_cni_device_plugin_registrations_total") == 2
    assert value(reg, "rdma_cni_device_plugin_allocations_total") == 7
    assert value(reg, "rdma_cni_device_plugin_devices", health="healthy") == 2
    assert value(reg, "rdma_cni_device_plugin_devices", health="unhealthy") == 1
    assert value(reg, "rdma_cni_device_plugin_device_healthy", device="mlx5_bond_2", netdev="bond2") == 0
    assert value(reg, "rdma_cni_device_plugin_device_healthy", device="mlx5_bond_0", netdev="bond0") == 1
    assert value(reg, "rdma_cni_device_plugin_status_updated_timestamp_seconds") == 1764590000.5

    write_status(n.run_dir, registered=False, registrations=3, allocations=9, devices=[])
    reg = scrape()
    assert value(reg, "rdma_cni_device_plugin_registered", resource=RESOURCE) == 0
    assert value(reg, "rdma_cni_device_plugin_registrations_total") == 3
    assert value(reg, "rdma_cni_device_plugin_allocations_total") == 9
    assert value(reg, "rdma_cni_device_plugin_devices", health="healthy") == 0

    # The device plugin's own writer (rdma_cni.deviceplugin.status) speaks the same contract.
    from rdma_cni.deviceplugin.status import StatusFile, status_path

    written = StatusFile(status_path(n.run_dir), RESOURCE)
    written.registered("tke-shared-rdma-1.sock")
    written.count_allocations(4)
    written.update(devices=[{"id": "mlx5_bond_3", "netdev": "bond3", "numa": None, "healthy": False,
                             "reason": "no IPv4"}])
    written.close()  # its writer thread writes asynchronously: the scrape must come after the write
    reg = scrape()
    assert value(reg, "rdma_cni_device_plugin_registered", resource=RESOURCE) == 1
    assert value(reg, "rdma_cni_device_plugin_registrations_total") == 1
    assert value(reg, "rdma_cni_device_plugin_allocations_total") == 4
    assert value(reg, "rdma_cni_device_plugin_devices", health="unhealthy") == 1
    assert value(reg, "rdma_cni_device_plugin_device_healthy", device="mlx5_bond_3", netdev="bond3") == 0

    Path(path).write_text('{"registered": tru')  # torn by hand: not readable, nothing else served
    reg = scrape()
    assert value(reg, "rdma_cni_device_plugin_status_readable", path=path) == 0
    assert value(reg, "rdma_cni_device_plugin_allocations_total") is None
    assert value(reg, "rdma_cni_scrape_errors_total", section="device_plugin") == 0


def fixture_hw_counters() -> set[str]:
    ports = FIXTURES / "host" / "sys" / "devices" / "virtual" / "infiniband" / "mlx5_bond_0" / "ports" / "1"
    if not ports.is_dir():
        pytest.skip(f"{ports}: the captured rxe tree is not here")
    assert not (ports / "counters").exists()  # rxe exports no PMA counters
    return {p.name for p in (ports / "hw_counters").iterdir()}


def test_simulated_rxe_counters_are_the_ones_the_real_kernel_exports() -> None:
    assert set(simcounters.RXE_HW_COUNTERS) == fixture_hw_counters()


def test_port_counters_named_after_their_files_read_fresh(sim: tuple[netns.Node, str, Scrape]) -> None:
    _, root, scrape = sim
    simcounters.write_counters(root, "mlx5_bond_0", 1, "mlx5")
    simcounters.write_counters(root, "mlx5_bond_1", 1, "rxe")
    simcounters.bump(root, "mlx5_bond_0", 1, "counters", "port_xmit_data", 123456789)
    simcounters.bump(root, "mlx5_bond_0", 1, "hw_counters", "np_cnp_sent", 5)
    simcounters.bump(root, "mlx5_bond_1", 1, "hw_counters", "rcvd_seq_err", 3)
    reg = scrape()
    pma = scrape.samples("rdma_cni_port_counter")
    hw = scrape.samples("rdma_cni_port_hw_counter")

    def names(samples: dict[Labels, float], device: str) -> set[str]:
        return {dict(k)["counter"] for k in samples if dict(k)["rdma_device"] == device}

    assert names(pma, "mlx5_bond_0") == set(simcounters.PMA_COUNTERS)
    assert names(pma, "mlx5_bond_1") == set()  # rxe: no counters/ directory
    assert names(hw, "mlx5_bond_0") == set(simcounters.MLX5_HW_COUNTERS)
    assert names(hw, "mlx5_bond_1") == fixture_hw_counters()
    for mlx5_only in ("out_of_sequence", "packet_seq_err", "np_cnp_sent", "rp_cnp_handled"):
        assert mlx5_only not in names(hw, "mlx5_bond_1")
    assert "rcvd_seq_err" not in names(hw, "mlx5_bond_0")
    labels = {"rdma_device": "mlx5_bond_0", "port": "1"}
    assert value(reg, "rdma_cni_port_counter", counter="port_xmit_data", **labels) == 123456789
    assert value(reg, "rdma_cni_port_hw_counter", counter="np_cnp_sent", **labels) == 5
    assert value(reg, "rdma_cni_port_hw_counter", counter="lifespan", **labels) == simcounters.LIFESPAN_MS
    assert value(reg, "rdma_cni_port_hw_counter", counter="rcvd_seq_err", rdma_device="mlx5_bond_1",
                 port="1") == 3
    # Never cached: the next scrape sees the traffic since.
    simcounters.bump(root, "mlx5_bond_0", 1, "counters", "port_xmit_data", 1)
    assert value(scrape(), "rdma_cni_port_counter", counter="port_xmit_data", **labels) == 123456790
    # What the collector reads is the mechanism's view of the same files.
    assert read_counters(root, "mlx5_bond_0", 1)["counters"]["port_xmit_data"] == 123456790
    assert "counters" not in read_counters(root, "mlx5_bond_1", 1)


def test_an_unreadable_counter_file_is_skipped_not_fatal(tmp_path: Path) -> None:
    root = str(tmp_path / "sys")
    tree.build_tree(root, [tree.SimBond("bond0", "mlx5_bond_0")], gid_slots=4)
    simcounters.write_counters(root, "mlx5_bond_0", 1, "rxe")
    hw = Path(tree.port_path(root, "mlx5_bond_0", 1), "hw_counters")
    (hw / "sent_pkts").write_text("N/A\n")
    (hw / "subdir").mkdir()
    got = read_counters(root, "mlx5_bond_0", 1)["hw_counters"]
    assert "sent_pkts" not in got and "subdir" not in got and got["rcvd_pkts"] == 0


def test_sources_follow_the_configs() -> None:
    src = sources_of([{"dataDir": "/a", "runDir": "/r", "sysfsRoot": "/s"}, {"dataDir": "/a"}, {"x": 1}])
    assert src.data_dirs == ("/a", "/var/lib/cni/rdma-macvlan")
    assert src.run_dirs == ("/r", "/run/rdma-cni") and src.sysfs_roots == ("/s", "/sys")
    assert sources_of([]) == Sources()


def test_call_events_through_the_workers_channel() -> None:
    rx = metrics_events.open_channel()
    try:
        metrics_events.report_call("rdma-macvlan", "ADD", 0, 0.0042)
        metrics_events.report_call("rdma-macvlan", "ADD", 11, 0.0021)
        metrics_events.report_call("rdma-multus", "DEL", 0, 0.150)
        metrics_events.report_call("rdma-macvlan", "BOGUS", 4, 0.001)
        metrics_events.report_reconcile(2, 1)
        metrics_events.report_refused()
        rx.setblocking(False)
        registry = CollectorRegistry(auto_describe=False)
        calls = CallMetrics(registry)
        for _ in range(6):
            calls.apply(metrics_events.decode(rx.recv(metrics_events.MAX_EVENT)))
        calls.apply(metrics_events.decode(b"\xff not json"))
    finally:
        metrics_events.close_channel()
        rx.close()
    get = registry.get_sample_value
    assert get("rdma_cni_cni_calls_total", {"plugin": "rdma-macvlan", "verb": "ADD", "result": "ok"}) == 1
    assert get("rdma_cni_cni_calls_total", {"plugin": "rdma-macvlan", "verb": "ADD", "result": "error"}) == 1
    assert get("rdma_cni_cni_call_errors_total", {"plugin": "rdma-macvlan", "verb": "ADD", "code": "11"}) == 1
    other = {"plugin": "rdma-macvlan", "verb": "other", "result": "error"}
    assert get("rdma_cni_cni_calls_total", other) == 1
    add = {"plugin": "rdma-macvlan", "verb": "ADD"}
    # Buckets resolve milliseconds: 2.1 ms and 4.2 ms land in different ones.
    assert get("rdma_cni_cni_call_duration_seconds_bucket", {**add, "le": "0.002"}) == 0
    assert get("rdma_cni_cni_call_duration_seconds_bucket", {**add, "le": "0.003"}) == 1
    assert get("rdma_cni_cni_call_duration_seconds_bucket", {**add, "le": "0.004"}) == 1
    assert get("rdma_cni_cni_call_duration_seconds_bucket", {**add, "le": "0.005"}) == 2
    dele = {"plugin": "rdma-multus", "verb": "DEL"}
    assert get("rdma_cni_cni_call_duration_seconds_bucket", {**dele, "le": "0.1"}) == 0
    assert get("rdma_cni_cni_call_duration_seconds_bucket", {**dele, "le": "0.15"}) == 1
    assert get("rdma_cni_cni_call_duration_seconds_count", dele) == 1
    assert get("rdma_cni_reconcile_runs_total") == 1
    assert get("rdma_cni_reconcile_repairs_total") == 2
    assert get("rdma_cni_reconcile_failures_total") == 1
    assert get("rdma_cni_agent_refused_calls_total") == 1
    assert get("rdma_cni_metrics_malformed_events_total") == 1


def test_the_cni_code_of_a_failed_call_comes_from_its_answer() -> None:
    assert metrics_events.cni_code(0, "{}") == 0
    assert metrics_events.cni_code(1, '{"cniVersion": "1.0.0", "code": 11, "msg": "no free bond"}') == 11
    assert metrics_events.cni_code(1, "not json") == 1
    assert metrics_events.cni_code(2, '{"code": "7"}') == 2


def test_reporting_without_a_channel_or_reader_never_blocks() -> None:
    metrics_events.report_call("rdma-macvlan", "ADD", 0, 0.001)  # no channel: a no-op
    rx = metrics_events.open_channel()
    try:
        for _ in range(20000):  # far more than the buffer holds; nobody reads: dropped, not blocked
            metrics_events.report_call("rdma-macvlan", "ADD", 0, 0.001)
    finally:
        metrics_events.close_channel()
        rx.close()


def test_bad_metrics_address_is_refused_naming_the_flag(tmp_path: Path) -> None:
    for bad, why in (("9513", "HOST:PORT"), ("0.0.0.0:http", "HOST:PORT"), ("0.0.0.0:70000", "1-65535"),
                     ("no-such-host.invalid:9513", "not an address")):
        proc = subprocess.run(
            ["python3", "-m", "rdma_cni.cli.agent", "--socket", str(tmp_path / "a.sock"), "--metrics-address",
             bad, "--reconcile-interval", "-1"],
            capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=netns.REPO),
            check=False,
        )
        assert proc.returncode != 0 and "--metrics-address" in proc.stderr and why in proc.stderr, proc.stderr
        assert not (tmp_path / "a.sock").exists()  # refused before the socket was published


def test_every_pool_has_its_series_labelled_by_resource(sim: tuple[netns.Node, str, Scrape]) -> None:
    """status.json as the plugin's own StatusFile writes it for two shared pools (a seed-002 style IB
    pool and a RoCE pool with one dead HCA): the first pool keeps the pre-pool series, every pool
    gets its own, and the dead HCA is a member series at 0 while its pool stays healthy."""
    from rdma_cni.deviceplugin.status import StatusFile, status_path
    from rdma_cni.devices.hca import Hca
    from rdma_cni.devices.model import DeviceHealth
    from rdma_cni.devices.pools import SHARED, PoolSpec, SharedSnapshot

    n, _, scrape = sim
    ib, roce = "rdma/hca_shared_devices_a", "rdma/hca_shared_devices_b"
    status = StatusFile(status_path(n.run_dir), ib, (PoolSpec(ib, SHARED, 200), PoolSpec(roce, SHARED, 100)))

    def hca(name: str, netdev: str) -> Hca:
        return Hca(name, 1, "Ethernet", netdev, (netdev,), None, None, None, None, None, "uverbs0")

    ib_hcas = (hca("mlx5_4", "ibs108"),)
    status.pool(ib).snapshot(SharedSnapshot(200, ib_hcas, (DeviceHealth("mlx5_4", True, ""),)))
    roce_hcas = (hca("mlx5_bond_0", "bond0"), hca("mlx5_bond_1", "bond1"))
    status.pool(roce).snapshot(SharedSnapshot(100, roce_hcas, (
        DeviceHealth("mlx5_bond_0", False, "bond0 down"), DeviceHealth("mlx5_bond_1", True, ""))))
    status.pool(ib).registered("a.sock")
    status.pool(roce).registered("b.sock")
    status.pool(roce).count_allocations(3)
    status.close()
    reg = scrape()
    assert value(reg, "rdma_cni_device_plugin_registered", resource=ib) == 1
    assert value(reg, "rdma_cni_device_plugin_registered", resource=roce) == 1
    assert value(reg, "rdma_cni_device_plugin_pool_devices", resource=ib, mode="shared") == 200
    assert value(reg, "rdma_cni_device_plugin_pool_devices", resource=roce, mode="shared") == 100
    assert value(reg, "rdma_cni_device_plugin_pool_healthy", resource=roce, mode="shared") == 1
    assert value(reg, "rdma_cni_device_plugin_pool_allocations_total", resource=roce) == 3
    assert value(reg, "rdma_cni_device_plugin_pool_member_healthy", resource=roce, member="mlx5_bond_0",
                 netdev="bond0") == 0
    assert value(reg, "rdma_cni_device_plugin_pool_member_healthy", resource=ib, member="mlx5_4",
                 netdev="ibs108") == 1
    # the first pool's members are the pre-pool per-device series too
    assert value(reg, "rdma_cni_device_plugin_device_healthy", device="mlx5_4", netdev="ibs108") == 1
