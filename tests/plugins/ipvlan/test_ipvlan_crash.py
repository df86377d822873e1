"""Crash safety of rdma-ipvlan: kill -9 at every step of ADD and of DEL, in-process and through the
agent (there the failpoint kills the worker doing the call). Afterwards DEL (or GC) leaves the
node exact, no address stays held, and the subnet takes as many new pods as before."""

from __future__ import annotations

import signal

import pytest
from ipvlan_support import Shared
from netns import Node

from rdma_cni.plugins.ipvlan.tx import ADD_STEPS, DEL_STEPS, PER_BOND_STEPS

pytestmark = [pytest.mark.netns, pytest.mark.both_modes]

RANGE = {"bond0": "198.51.100.3-198.51.100.5", "bond1": "198.51.100.19-198.51.100.21"}


def killed(n: Node, code: int) -> bool:
    """In-process the plugin itself dies; through the agent its worker does and the client answers
    an error (the call did not complete)."""
    return code == -signal.SIGKILL if n.mode == "in-process" else code == 1


def capacity(s: Shared, conf: dict[str, object]) -> int:
    """How many pods the ranges take now (each ADDed until 11), then all DELeted again."""
    n = s.n
    pods = []
    while True:
        pod = n.pod()
        res = s.plugin("ADD", conf, pod, container_id=f"cap{len(pods)}")
        if res.code != 0:
            assert res.out["code"] == 11, res.stdout
            break
        pods.append(pod)
    for i, pod in enumerate(pods):
        assert s.plugin("DEL", conf, pod, container_id=f"cap{i}").code == 0
        n.delete_pod(pod)
    return len(pods)


@pytest.mark.parametrize("how", ["del", "gc"])
def test_kill_at_every_add_step_then_del_or_gc_leaks_no_address(node_ns: Node, how: str) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=["bond0", "bond1"], cniVersion="1.1.0", ranges=RANGE)
    before = n.snapshot()
    room = capacity(s, conf)
    assert room == 3
    for i, point in enumerate([*ADD_STEPS, *(f"{p}#2" for p in PER_BOND_STEPS)]):
        pod = n.pod()
        cid = f"crash{i}"
        res = s.plugin("ADD", conf, pod, container_id=cid, extra={"RDMA_CNI_FAILPOINT": point})
        assert killed(n, res.code), (point, res.code, res.stdout, res.stderr[-800:])
        if how == "del":
            res = s.plugin("DEL", conf, pod, container_id=cid)
        else:
            gc = dict(conf)
            gc["cni.dev/valid-attachments"] = []
            res = s.plugin("GC", gc)
        assert res.code == 0, (point, res.stdout + res.stderr[-2000:])
        assert s.held() == {} and s.state_files() == [], point
        assert s.pod_links(pod) == ["lo"], point
        assert n.snapshot() == before, point
        n.delete_pod(pod)
    assert capacity(s, conf) == room  # no address leaked


def test_kill_at_every_del_step_then_del_again_frees_the_addresses(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=["bond0", "bond1"], ranges=RANGE)
    before = n.snapshot()
    for i, point in enumerate(DEL_STEPS):
        pod = n.pod()
        cid = f"d{i}"
        assert s.plugin("ADD", conf, pod, container_id=cid).code == 0
        res = s.plugin("DEL", conf, pod, container_id=cid, extra={"RDMA_CNI_FAILPOINT": point})
        assert killed(n, res.code), (point, res.code)
        assert s.held() != {}, point  # killed before the record went: still held, not leaked
        assert s.plugin("DEL", conf, pod, container_id=cid).code == 0
        assert s.held() == {} and s.state_files() == [], point
        assert s.pod_links(pod) == ["lo"], point
        assert n.snapshot() == before, point
        n.delete_pod(pod)
    assert capacity(s, conf) == 3


def test_a_repeated_add_after_a_crash_finishes_the_job_with_the_same_addresses(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=["bond0", "bond1"], ranges=RANGE)
    pod = n.pod()
    res = s.plugin("ADD", conf, pod, container_id="c1", extra={"RDMA_CNI_FAILPOINT": "routes-added#2"})
    assert killed(n, res.code)
    res = s.plugin("ADD", conf, pod, container_id="c1")
    assert res.code == 0, res.stdout + res.stderr[-2000:]
    assert s.held() == {"bond0": {"198.51.100.3": "c1"}, "bond1": {"198.51.100.19": "c1"}}
    assert s.pod_links(pod) == ["bond0", "bond1", "lo"]
    assert s.plugin("CHECK", conf, pod, container_id="c1").code == 0


def test_a_full_subnet_frees_the_addresses_of_pods_whose_netns_is_gone(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(1)
    conf = s.config(masters=["bond0"], ranges={"bond0": "198.51.100.3-198.51.100.4"})
    pods = [n.pod() for _ in range(3)]
    for i in range(2):
        assert s.plugin("ADD", conf, pods[i], container_id=f"c{i}").code == 0
    n.delete_pod(pods[0])  # its DEL never came
    res = s.plugin("ADD", conf, pods[2], container_id="c2")
    assert res.code == 0, res.stdout + res.stderr[-2000:]
    assert s.held() == {"bond0": {"198.51.100.3": "c2", "198.51.100.4": "c1"}}


@pytest.mark.slow
@pytest.mark.in_process_only
def test_kill_at_random_moments_then_del_or_gc_leaks_no_address(node_ns: Node) -> None:
    """ADDs killed after a random delay spread over a whole ADD, until 25 were really killed
    mid-flight; after each, DEL (or every fifth time GC) leaves the node exact and nothing held."""
    import random
    import time

    from netns import finish

    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=["bond0", "bond1"], cniVersion="1.1.0", ranges=RANGE)
    before = n.snapshot()
    pod = n.pod()
    t0 = time.monotonic()
    assert s.plugin("ADD", conf, pod, container_id="probe").code == 0
    full = time.monotonic() - t0
    assert s.plugin("DEL", conf, pod, container_id="probe").code == 0
    rng = random.Random(20261201)
    kills = 0
    for i in range(80):
        if kills >= 25:
            break
        pod = n.pod()
        proc = s.start("ADD", conf, pod, container_id=f"r{i}")
        time.sleep(rng.uniform(0.05, 0.95) * full)
        proc.send_signal(signal.SIGKILL)
        res = finish(proc)
        if res.code == -signal.SIGKILL:
            kills += 1
        else:
            full *= 0.8
        if i % 5 == 0:
            gc = dict(conf)
            gc["cni.dev/valid-attachments"] = []
            assert s.plugin("GC", gc).code == 0
        else:
            assert s.plugin("DEL", conf, pod if i % 2 else "", container_id=f"r{i}").code == 0
        assert s.held() == {} and s.state_files() == [], i
        assert n.snapshot() == before, i
        n.delete_pod(pod)
    assert kills >= 25
    assert capacity(s, conf) == 3
