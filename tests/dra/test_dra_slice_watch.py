"""The DRA driver's ResourceSlices kept current by a watch instead of a list every refresh: the
publisher (:class:`rdma_cni.dra.daemon.Publisher` over :class:`~rdma_cni.dra.publish.SlicePublisher`)
and the slice watch (:class:`~rdma_cni.dra.live.SliceWatch`) run in this process against the loopback
HTTPS API server (tests/dra_api.py), with the intervals shortened through their parameters: an idle
driver asks nothing but its watch, a slice kubelet deletes comes back (also when the delete lands right
after our create), a watch the server ends is opened again from its last version, a 410 lists again,
a refused watch is retried; and :class:`~rdma_cni.dra.live.LiveSlices` keeps the newest version when
write answers and events come out of order."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from dra_api import DRIVER, DraApi
from kube_server import Pki

from rdma_cni.devices.config import PluginConfig
from rdma_cni.devices.model import DeviceHealth, RdmaBond, Snapshot
from rdma_cni.dra.daemon import Publisher
from rdma_cni.dra.kubeapi import ResourceClient
from rdma_cni.dra.live import LiveSlices, SliceWatch
from rdma_cni.dra.publish import SlicePublisher
from rdma_cni.dra.table import DeviceBoard, of_bonds
from rdma_cni.kube import kubeconfig

NODE = "node-a"
SLICE = f"{NODE}-{DRIVER}-0"
REFRESH_S = 0.05  # the driver's 30 s, shortened


def snapshot(unhealthy: str = "") -> Snapshot:
    bs = tuple(RdmaBond(f"mlx5_bond_{i}", f"bond{i}", 1, i // 2, f"uverbs{i}", (), (),
                        f"0000:{0x17 + i:02x}:00.0", f"pci0000:{(i // 2) * 0x20:02x}") for i in range(4))
    return Snapshot(bs, tuple(DeviceHealth(b.id, b.id != unhealthy, "down" if b.id == unhealthy else "")
                              for b in bs))


def wait_for(what: str, cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@dataclass
class Driver:
    api: DraApi
    board: DeviceBoard
    publisher: Publisher
    watch: SliceWatch

    def calls(self) -> list[tuple[str, str]]:
        """The requests that were not watches, as (method, path without query)."""
        return [(r["method"], r["path"].split("?")[0]) for r in self.api.driver_calls()]

    def watch_versions(self) -> list[str]:
        return [parse_qs(urlsplit(r["path"]).query)["resourceVersion"][0] for r in self.api.watch_requests()]

    def generation(self) -> int:
        return int(self.api.slices[SLICE]["spec"]["pool"]["generation"])

    def settle(self) -> None:
        """Wait for a slice of ours and an open watch: the driver at rest."""
        wait_for("the slice and a watch", lambda: SLICE in self.api.slices and self.api.open_watches == 1)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Driver]:
    with DraApi(Pki(tmp_path / "pki"), node=NODE) as api:
        client = ResourceClient(kubeconfig.load(str(api.kubeconfig(tmp_path / "kc"))), timeout=5)
        board = DeviceBoard(of_bonds(snapshot(), None))
        live = LiveSlices()
        cfg = PluginConfig(sysfs_root=str(tmp_path), run_dir=str(tmp_path / "run"))
        publisher = Publisher(cfg, board, SlicePublisher(client, NODE, live), refresh_s=REFRESH_S,
                              retry_s=REFRESH_S)
        watch = SliceWatch(client, NODE, live, on_change=publisher.changed, backoff_s=0.05, backoff_max_s=0.2)
        stop = threading.Event()
        threads = [threading.Thread(target=publisher.run, args=(stop,), daemon=True),
                   threading.Thread(target=watch.run, args=(stop,), daemon=True)]
        for t in threads:
            t.start()
        try:
            yield Driver(api, board, publisher, watch)
        finally:
            stop.set()
            publisher.changed()
            watch.stop()
            t0 = time.monotonic()
            for t in threads:
                t.join(5)
            assert not any(t.is_alive() for t in threads)
            assert time.monotonic() - t0 < 2, "stopping waited for the server's watch timeout"


def test_an_idle_driver_asks_the_api_server_nothing_but_its_watch(driver: Driver) -> None:
    driver.settle()
    start = driver.calls()
    # the start: one list (the publisher's and the watch's share it), the Node for the owner, the create
    assert sorted(start) == [("GET", "/api/v1/nodes/node-a"),
                             ("GET", "/apis/resource.k8s.io/v1/resourceslices"),
                             ("POST", "/apis/resource.k8s.io/v1/resourceslices")]
    rounds = driver.publisher.rounds
    time.sleep(20 * REFRESH_S)
    assert driver.publisher.rounds >= rounds + 10  # the facts were read again and compared, locally
    assert driver.calls() == start
    assert len(driver.api.watch_requests()) == 1 and driver.api.open_watches == 1


def test_a_shared_mode_driver_at_rest_writes_nothing_though_the_server_stores_1000_as_1k(
    tmp_path: Path,
) -> None:
    """Shared mode's consumable capacity ``shares: "1000"`` comes back from kube-apiserver as "1k"
    (found by scripts/bench-apicost on the test cluster: an idle shared-mode driver updated its slice
    at every 30 s refresh, 1.85 requests per idle node-minute): the comparison is by quantity."""
    with DraApi(Pki(tmp_path / "pki"), node=NODE) as api:
        client = ResourceClient(kubeconfig.load(str(api.kubeconfig(tmp_path / "kc"))), timeout=5)
        board = DeviceBoard(of_bonds(snapshot(), 1000))
        cfg = PluginConfig(sysfs_root=str(tmp_path), run_dir=str(tmp_path / "run"))
        publisher = Publisher(cfg, board, SlicePublisher(client, NODE), refresh_s=REFRESH_S,
                              retry_s=REFRESH_S)
        stop = threading.Event()
        t = threading.Thread(target=publisher.run, args=(stop,), daemon=True)
        t.start()
        try:
            wait_for("the slice", lambda: SLICE in api.slices)
            assert api.slices[SLICE]["spec"]["devices"][0]["capacity"]["shares"]["value"] == "1k"
            rounds = publisher.rounds
            wait_for("10 refreshes", lambda: publisher.rounds >= rounds + 10)
            assert api.slice_writes == [("POST", SLICE)]
        finally:
            stop.set()
            publisher.changed()
            t.join(5)


def test_a_change_of_the_node_is_one_update_without_a_list(driver: Driver) -> None:
    driver.settle()
    before = len(driver.calls())
    driver.board.publish(of_bonds(snapshot(unhealthy="mlx5_bond_3"), None))
    driver.publisher.changed()
    wait_for("the taint", lambda: "taints" in driver.api.slices[SLICE]["spec"]["devices"][3])
    time.sleep(5 * REFRESH_S)
    assert driver.calls()[before:] == [("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{SLICE}")]
    assert driver.generation() == 2


def test_a_slice_kubelet_deletes_is_created_again_without_a_list(driver: Driver) -> None:
    driver.settle()
    before = len(driver.calls())
    assert driver.api.delete_node_slices() == [SLICE]  # kubelet's wipeResourceSlices
    wait_for("the slice back", lambda: SLICE in driver.api.slices)
    time.sleep(5 * REFRESH_S)
    assert driver.calls()[before:] == [("POST", "/apis/resource.k8s.io/v1/resourceslices")]
    assert driver.generation() == 2 and len(driver.api.slices[SLICE]["spec"]["devices"]) == 4


def test_a_delete_that_lands_right_after_our_create_is_undone(tmp_path: Path) -> None:
    # kubelet's wipe at its start runs in the background: it may delete the slice the driver has just
    # created (after the kubelet restart re-registered it), which the create's own answer cannot tell.
    with DraApi(Pki(tmp_path / "pki"), node=NODE) as api:
        api.wipe_after_create = True
        client = ResourceClient(kubeconfig.load(str(api.kubeconfig(tmp_path / "kc"))), timeout=5)
        board = DeviceBoard(of_bonds(snapshot(), None))
        live = LiveSlices()
        cfg = PluginConfig(sysfs_root=str(tmp_path), run_dir=str(tmp_path / "run"))
        publisher = Publisher(cfg, board, SlicePublisher(client, NODE, live), REFRESH_S, REFRESH_S)
        watch = SliceWatch(client, NODE, live, on_change=publisher.changed)
        stop = threading.Event()
        threads = [threading.Thread(target=f, args=(stop,), daemon=True) for f in (publisher.run, watch.run)]
        for t in threads:
            t.start()
        try:
            wait_for("the slice back after the wipe", lambda: SLICE in api.slices)
            assert [m for m, _ in api.slice_writes] == ["POST", "POST"]
            assert [(kind, obj["metadata"]["name"]) for _, kind, obj in api.events] == [
                ("ADDED", SLICE), ("DELETED", SLICE), ("ADDED", SLICE)]
        finally:
            stop.set()
            publisher.changed()
            watch.stop()
            for t in threads:
                t.join(5)


def test_a_watch_the_server_ends_is_opened_again_from_its_last_version(driver: Driver) -> None:
    driver.settle()
    calls = driver.calls()
    driver.api.delete_node_slices()  # an event, so the first watch's last version is not the list's
    deleted = driver.api._version
    wait_for("the slice back", lambda: SLICE in driver.api.slices)
    driver.api.watch_timeout_s = 0.1
    driver.api.end_watches()
    wait_for("three more watches", lambda: len(driver.api.watch_requests()) >= 4)
    versions = [int(v) for v in driver.watch_versions()]
    # the second resumed after the events the first delivered (the re-create's too, unless the server
    # ended the watch before sending it: then the second watch sends it)
    created = int(driver.api.slices[SLICE]["metadata"]["resourceVersion"])
    assert versions[0] < deleted <= versions[1] <= created, versions
    assert driver.calls() == [*calls, ("POST", "/apis/resource.k8s.io/v1/resourceslices")]  # no list
    driver.api.watch_timeout_s = None
    driver.api.end_watches()
    wait_for("a watch open", lambda: driver.api.open_watches == 1)
    driver.api.delete_node_slices()
    wait_for("the slice back through the new watch", lambda: SLICE in driver.api.slices)


def test_bookmarks_move_the_version_a_watch_resumes_from(driver: Driver) -> None:
    driver.api.bookmark_s = 0.05
    driver.settle()
    driver.api.touch_other_node()  # the version moves, but nothing of ours
    now = str(driver.api._version)
    wait_for("a bookmark at the new version", lambda: now in driver.api.bookmarks_sent)
    driver.api.end_watches()  # the stream's end comes after that bookmark: the driver has read it
    wait_for("the next watch", lambda: len(driver.api.watch_requests()) >= 2)
    assert driver.watch_versions()[1] == now


@pytest.mark.parametrize("as_status", [False, True], ids=["error-event", "http-410"])
def test_a_watch_too_old_for_the_server_lists_again_and_writes_nothing(driver: Driver,
                                                                       as_status: bool) -> None:
    driver.settle()
    driver.api.gone_as_status = as_status
    calls, writes = driver.calls(), list(driver.api.slice_writes)
    driver.api.compact()
    driver.api.end_watches()
    wait_for("the list after 410", lambda: driver.watch.relists == 1 and len(driver.calls()) > len(calls))
    wait_for("a watch open again", lambda: driver.api.open_watches == 1)
    assert driver.calls() == [*calls, ("GET", "/apis/resource.k8s.io/v1/resourceslices")]
    assert driver.api.slice_writes == writes
    driver.api.delete_node_slices()
    wait_for("the slice back through the watch after the relist", lambda: SLICE in driver.api.slices)


def test_a_refused_watch_is_tried_again_and_the_driver_goes_on(driver: Driver) -> None:
    driver.settle()
    calls = driver.calls()
    driver.api.fail_next = [500, 500, 500]
    driver.api.end_watches()
    # the open one, three refused with 500 (each after a longer pause), one open again
    wait_for("a watch open again",
             lambda: len(driver.api.watch_requests()) == 5 and driver.api.open_watches == 1)
    assert driver.calls() == calls
    driver.api.delete_node_slices()
    wait_for("the slice back", lambda: SLICE in driver.api.slices)


def test_a_refused_write_lists_again_before_the_next(driver: Driver) -> None:
    driver.settle()
    calls = driver.calls()
    driver.api.fail_next = [409]
    driver.board.publish(of_bonds(snapshot(unhealthy="mlx5_bond_0"), None))
    driver.publisher.changed()
    wait_for("the taint", lambda: "taints" in driver.api.slices[SLICE]["spec"]["devices"][0])
    assert driver.calls()[len(calls):] == [
        ("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{SLICE}"),
        ("GET", "/apis/resource.k8s.io/v1/resourceslices"),
        ("PUT", f"/apis/resource.k8s.io/v1/resourceslices/{SLICE}")]


def obj(name: str, rv: int, devices: int = 1) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}, "spec": {"devices": [{}] * devices}}


def test_live_slices_keep_the_newest_version_whatever_order_answers_and_events_come_in() -> None:
    live = LiveSlices()
    assert live.replace([obj("a", 100)], "100") is True and live.synced
    assert live.apply(obj("a", 105, devices=2)) is True  # our update's answer
    assert live.apply(obj("a", 105, devices=2)) is False  # its echo on the watch: nothing new
    assert live.apply(obj("a", 103)) is False  # an older event, late
    assert live.current()["a"]["spec"]["devices"] == [{}, {}]
    assert live.remove("a", "104") is False  # a delete older than what we hold
    assert live.remove("a", "106") is True and live.current() == {}  # kubelet's wipe
    assert live.apply(obj("a", 105)) is False  # no resurrection by an event from before the delete
    assert live.apply(obj("a", 107)) is True  # created again
    assert live.remove("a", "") is True  # our delete, answered without a version


def test_a_list_overrides_everything_at_or_below_its_version() -> None:
    live = LiveSlices()
    live.apply(obj("a", 100))
    live.apply(obj("b", 120))
    assert live.replace([obj("c", 110)], "115") is True
    assert sorted(live.current()) == ["b", "c"]  # a: gone by 115; b: written after the list
    assert live.apply(obj("d", 112)) is False  # the list at 115 would have held it
    live.invalidate()
    assert live.sync(lambda: ([obj("c", 110)], "130")) == (True, "130")  # b gone by 130
    assert live.sync(lambda: pytest.fail("listed twice")) == (False, "130")
