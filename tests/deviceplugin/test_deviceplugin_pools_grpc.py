"""Pools against the test kubelet over real gRPC: the real plugin process in a node netns of 4 RoCE
bonds (NUMA 0,0,1,1) and 2 InfiniBand HCAs (mlx5_4 on ibs108, NUMA 1; mlx5_5 on ibs109, NUMA 0),
configured with seed 002's own Mellanox config.json (tests/seed002.py), with ``pools:``, or both
modes at once. Timings are printed (run with -s), not asserted: scripts/bench-deviceplugin
measures them."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time

import pytest
import seed002
from dpnode import RESOURCE, wait_for
from netns import can_run
from poolnode import PoolNode, pool_node

from rdma_cni.proto import deviceplugin_v1beta1_pb2 as pb
from rdma_cni.sim.kubelet import Dev, Endpoint
from rdma_cni.sim.tree import set_port_state

pytestmark = pytest.mark.netns

POOL_A = "rdma/hca_shared_devices_a"  # seed 002's: ifNames [ibs108] -> mlx5_4
POOL_B = "rdma/hca_shared_devices_b"  # the second pool: Mellanox's RoCE HCAs
SECOND = {
    "resourceName": "hca_shared_devices_b",
    "rdmaHcaMax": 100,
    "selectors": {"vendors": ["15b3"], "linkTypes": ["ether"]},
}
ROCE = [f"mlx5_bond_{i}" for i in range(4)]


@pytest.fixture(autouse=True)
def _root() -> None:
    reason = can_run()
    if reason:
        pytest.skip(reason)


def all_health(devs: list[Dev], want: str) -> bool:
    return bool(devs) and all(x.health == want for x in devs)


def paths(resp: pb.AllocateResponse) -> list[str]:
    assert len(resp.container_responses) == 1
    return [d.container_path for d in resp.container_responses[0].devices]


def nodes_of(*numbers: int) -> list[str]:
    return [f"/dev/infiniband/{k}{n}" for n in numbers for k in ("uverbs", "umad", "issm")]


def test_seed_002s_config_json_with_a_second_pool_registers_both_and_allocates_exactly_their_hcas() -> None:
    with pool_node() as p:
        p.start_with(seed002.with_second_pool(SECOND), [POOL_A, POOL_B])
        a, b = p.endpoint(POOL_A), p.endpoint(POOL_B)
        assert a.endpoint.startswith("hca_shared_devices_a-") and b.endpoint.startswith(
            "hca_shared_devices_b-"
        )
        _, devs = a.wait_list(lambda devs: len(devs) == 200 and all_health(devs, "Healthy"))
        assert [x.id for x in devs] == [str(i) for i in range(200)] and {x.numa for x in devs} == {(1,)}
        _, devs = b.wait_list(lambda devs: len(devs) == 100 and all_health(devs, "Healthy"))
        assert {x.numa for x in devs} == {(0, 1)}
        assert a.options.get_preferred_allocation_available and not a.options.pre_start_required
        resp = a.allocate(["7"])
        assert paths(resp) == [*nodes_of(4), "/dev/infiniband/rdma_cm"]
        assert {d.host_path for d in resp.container_responses[0].devices} == {
            os.path.join(p.d.dev, "infiniband", os.path.basename(x)) for x in paths(resp)
        }
        assert dict(resp.container_responses[0].envs) == {
            "NCCL_IB_HCA": "=mlx5_4",
            "UCX_NET_DEVICES": "mlx5_4:1",
        }
        resp = b.allocate(["5", "99"])
        assert paths(resp) == [*nodes_of(0, 1, 2, 3), "/dev/infiniband/rdma_cm"]
        assert dict(resp.container_responses[0].envs) == {
            "NCCL_IB_HCA": "=" + ",".join(ROCE),
            "UCX_NET_DEVICES": ",".join(f"{h}:1" for h in ROCE),
        }
        assert len(b.preferred([str(i) for i in range(100)], ["42"], 3)) == 3
        with pytest.raises(Exception, match="no such device"):
            a.allocate(["200"])
        wait_for(
            lambda: [x.get("allocations") for x in p.d.status().get("pools", [])] == [1, 1],
            5,
            "both pools' allocations counted",
        )
        status = p.d.status()
        pools = {x["resourceName"]: x for x in status["pools"]}
        assert (pools[POOL_A]["mode"], pools[POOL_A]["count"], pools[POOL_A]["registered"]) == (
            "shared",
            200,
            True,
        )
        assert [h["id"] for h in pools[POOL_A]["hcas"]] == ["mlx5_4"]
        assert [h["id"] for h in pools[POOL_B]["hcas"]] == ROCE
        assert p.d.kubelet.rejected == []


def test_a_pool_whose_selectors_match_nothing_is_registered_with_no_device_and_a_warn() -> None:
    text = seed002.with_second_pool(
        {
            "resourceName": "nothing",
            "rdmaHcaMax": 50,
            "selectors": {"ifNames": ["ib9"], "linkTypes": ["infiniband"]},
        }
    )
    with pool_node() as p:
        p.start_with(text, [POOL_A, "rdma/nothing"])
        _, devs = p.endpoint("rdma/nothing").wait_list(lambda devs: True)
        assert devs == []
        p.endpoint(POOL_A).wait_list(lambda devs: len(devs) == 200)
        log = p.d.log_text()
        assert "WARNING" in log and "pool rdma/nothing (configList[1]) selects no HCA" in log


POOLS_BOTH = f"""
pools:
  - resourceName: {RESOURCE}
  - resourceName: rdma/ib
    mode: shared
    count: 10
    selectors: {{linkTypes: [infiniband]}}
"""


def test_an_exclusive_and_a_shared_pool_in_one_process() -> None:
    with pool_node() as p:
        p.start_with(POOLS_BOTH, [RESOURCE, "rdma/ib"])
        ex, ib = p.endpoint(RESOURCE), p.endpoint("rdma/ib")
        _, devs = ex.wait_list(lambda devs: len(devs) == 4 and all_health(devs, "Healthy"))
        assert devs == [
            Dev(f"mlx5_bond_{i}", "Healthy", (i // 2,)) for i in range(4)
        ]  # today's exclusive list
        _, devs = ib.wait_list(lambda devs: len(devs) == 10 and all_health(devs, "Healthy"))
        assert {x.numa for x in devs} == {(0, 1)}
        resp = ex.allocate(["mlx5_bond_2"])
        envs = dict(resp.container_responses[0].envs)
        assert paths(resp) == [*nodes_of(2), "/dev/infiniband/rdma_cm"]
        assert (
            envs["NCCL_IB_HCA"] == "=mlx5_bond_2" and envs["NCCL_IB_GID_INDEX"] == "3"
        )  # exclusive: host GID
        resp = ib.allocate(["0"])
        assert paths(resp) == [*nodes_of(4, 5), "/dev/infiniband/rdma_cm"]
        assert "NCCL_IB_GID_INDEX" not in resp.container_responses[0].envs
        assert ex.preferred(ROCE, [], 2) in (ROCE[:2], ROCE[2:])  # NUMA-packed, as today


def test_an_hca_of_an_exclusive_pool_in_another_pool_stops_the_start_naming_both(tmp_path: object) -> None:
    text = POOLS_BOTH.replace("[infiniband]", "[ether]")
    with pool_node() as p:
        proc = p.start_with(text, wait=False)
        assert proc.wait(60) == 2
        err = p.d.log_text()
        line = next(x for x in err.splitlines() if x.startswith("rdma-device-plugin: "))
        assert (
            "mlx5_bond_0 is in exclusive pool tke.cloud.tencent.com/tke-shared-rdma and in pool rdma/ib"
            in line
        )
        assert line.startswith("rdma-device-plugin: pools[1].selectors") and "narrow the selectors" in line
        assert p.d.kubelet.register_calls == 0


def flip(ep: Endpoint, change: object, want: str, what: str) -> None:
    seen = len(ep.lists)
    t0 = time.monotonic()
    change()  # type: ignore[operator]
    t, _ = ep.wait_list(lambda devs: all_health(devs, want), 10, seen)
    print(f"\n{what} -> {want} at kubelet: {(t - t0) * 1000:.0f} ms")


def test_a_shared_pool_is_unhealthy_only_while_none_of_its_hcas_is_usable() -> None:
    with pool_node() as p:
        p.start_with(seed002.with_second_pool(SECOND), [POOL_A, POOL_B])
        a, b = p.endpoint(POOL_A), p.endpoint(POOL_B)
        a.wait_list(lambda devs: len(devs) == 200 and all_health(devs, "Healthy"))
        b.wait_list(lambda devs: len(devs) == 100 and all_health(devs, "Healthy"))
        sysfs = p.d.sysfs
        # One HCA of four down: the pool stays Healthy (doctor and the metrics say which is dead).
        p.d.n.ip("link", "set", "bond0", "down")
        wait_for(
            lambda: (
                [
                    h["healthy"]
                    for x in p.d.status()["pools"]
                    if x["resourceName"] == POOL_B
                    for h in x["hcas"]
                ]
                == [False, True, True, True]
            ),
            10,
            "mlx5_bond_0 unhealthy in status",
        )
        assert all_health(b.latest() or [], "Healthy")
        # All four down (three RDMA ports, found by the rescan, and the bond), then one back.
        for i in (1, 2):
            set_port_state(sysfs, ROCE[i], 1, active=False)
        flip(b, lambda: set_port_state(sysfs, ROCE[3], 1, active=False), "Unhealthy", "last RoCE HCA down")
        flip(b, lambda: set_port_state(sysfs, ROCE[3], 1, active=True), "Healthy", "one RoCE HCA back")
        # The IB pool's one HCA: its IPoIB netdev, then its port (no event: the rescan finds it).
        flip(a, lambda: p.d.n.ip("link", "set", "ibs108", "down"), "Unhealthy", "IPoIB ibs108 down")
        flip(a, lambda: p.d.n.ip("link", "set", "ibs108", "up"), "Healthy", "IPoIB ibs108 up")
        flip(a, lambda: set_port_state(sysfs, "mlx5_4", 1, active=False), "Unhealthy", "IB port DOWN")
        with pytest.raises(Exception, match="no HCA of the pool is usable"):
            a.allocate(["0"])
        flip(a, lambda: set_port_state(sysfs, "mlx5_4", 1, active=True), "Healthy", "IB port ACTIVE")
        assert paths(a.allocate(["0"]))[0] == "/dev/infiniband/uverbs4"
        assert all_health(b.latest() or [], "Healthy")  # the other pool never moved


def three_pools(p: PoolNode) -> list[str]:
    text = (
        POOLS_BOTH
        + """  - resourceName: rdma/roce-numa1
    mode: shared
    selectors: {ifNames: [ibs109]}
"""
    )
    p.start_with(text, [RESOURCE, "rdma/ib", "rdma/roce-numa1"])
    return [RESOURCE, "rdma/ib", "rdma/roce-numa1"]


def test_twenty_kubelet_restarts_re_register_every_pool_each_time() -> None:
    with pool_node() as p:
        names = three_pools(p)
        counts = {RESOURCE: 4, "rdma/ib": 10, "rdma/roce-numa1": 1000}
        for name in names:
            p.endpoint(name).wait_list(lambda devs, n=counts[name]: len(devs) == n)  # type: ignore[misc]
        took = []
        for _ in range(20):
            t0 = time.monotonic()
            p.d.kubelet.restart()
            last = 0.0
            for name in names:
                ep = p.d.kubelet.wait_endpoint(name, timeout=15)
                want = counts[name]
                t, _ = ep.wait_list(lambda devs, n=want: len(devs) == n and all_health(devs, "Healthy"))  # type: ignore[misc]
                last = max(last, t)
            took.append(last - t0)
        print(
            f"\n3 pools registered and listed after a kubelet restart: median "
            f"{statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms over {len(took)}"
        )
        assert p.d.kubelet.rejected == []
        assert len(p.d.kubelet.history) >= 3 * 21
        wait_for(lambda: p.d.kubelet.live_streams() == 3, 5, "exactly one live ListAndWatch per pool")
        socks = sorted(f for f in os.listdir(p.d.kubelet.dir) if f != "kubelet.sock")
        assert sorted(s.rsplit("-", 1)[0] for s in socks) == ["ib", "roce-numa1", "tke-shared-rdma"]


def test_kill9_then_restart_registers_every_pool_again_and_removes_the_stale_sockets() -> None:
    with pool_node() as p:
        names = three_pools(p)
        first = {name: p.endpoint(name) for name in names}
        proc = p.d.procs[-1]
        p.d.stop(proc, signal.SIGKILL)
        assert all(os.path.exists(os.path.join(p.d.kubelet.dir, ep.endpoint)) for ep in first.values())
        p.d.start("--config", p.config, wait=False)
        for name in names:
            ep = p.endpoint(name, newer_than=first[name])
            ep.wait_list(lambda devs: len(devs) > 0 and all_health(devs, "Healthy"))
        wait_for(
            lambda: (
                not any(os.path.exists(os.path.join(p.d.kubelet.dir, ep.endpoint)) for ep in first.values())
            ),
            10,
            "the killed run's sockets removed",
        )


def test_bad_config_json_is_one_sentence_and_exit_2() -> None:
    with pool_node(roce=1, ib=()) as p:
        proc = p.start_with(
            seed002.config_text().replace('"rdmaHcaMax": 200', '"rdmaHcaMax": -1'), wait=False
        )
        assert proc.wait(60) == 2
        out = subprocess.run(["tail", "-n", "1", p.d.log + ".stderr"], capture_output=True, text=True).stdout
        assert out.startswith("rdma-device-plugin: configList[0].rdmaHcaMax in ") and "= -1 is invalid" in out


def test_mode_shared_is_one_pool_of_1000_over_every_bond_of_masters_renamed_by_the_flag() -> None:
    with pool_node() as p:
        p.start_with(
            "mode: shared\n", ["example.com/shared-rdma"], "--resource-name", "example.com/shared-rdma"
        )
        ep = p.endpoint("example.com/shared-rdma")
        _, devs = ep.wait_list(lambda devs: len(devs) == 1000 and all_health(devs, "Healthy"))
        assert {x.numa for x in devs} == {(0, 1)}
        resp = ep.allocate(["999"])
        assert paths(resp) == [*nodes_of(0, 1, 2, 3), "/dev/infiniband/rdma_cm"]  # the bonds, not the IB HCAs
        assert "NCCL_IB_GID_INDEX" not in resp.container_responses[0].envs
        assert RESOURCE not in p.d.kubelet.endpoints
