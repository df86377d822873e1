"""Crash safety: kill -9 the real plugin during ADD (at every named step, and at random moments);
afterwards DEL — or GC — must leave the node exactly as it was before ADD, every time."""

from __future__ import annotations

import random
import signal
import time

import pytest
from netns import Node, finish

from rdma_cni.plugins.macvlan.tx import ADD_STEPS, DEL_STEPS

pytestmark = pytest.mark.netns

PER_BOND = ("link-created", "link-configured", "addresses-removed", "addresses-added", "link-up",
            "routes-added", "rdma-checked", "announced")


def two_bonds(n: Node) -> dict[str, object]:
    for i in range(2):
        base = 16 * i
        n.bond(f"bond{i}", f"198.51.100.{base + 2}/28 brd +", f"198.51.100.{base + 3}/28",
               peer=f"198.51.100.{base + 1}/28")
        n.ip("route", "add", f"203.0.113.{16 * i}/28", "via", f"198.51.100.{base + 1}")
        n.ip("route", "add", "default", "via", f"198.51.100.{base + 1}", "table", str(10 + i))
        n.ip("rule", "add", "from", f"198.51.100.{base + 2}", "lookup", str(10 + i), "pref", str(500 + i))
    return n.config(masters=["bond0", "bond1"], count=2, cniVersion="1.1.0")


def cleanup(n: Node, conf: dict[str, object], pod: object, how: str, cid: str) -> None:
    if how == "del":
        res = n.plugin("DEL", conf, pod, container_id=cid)  # type: ignore[arg-type]
    else:
        gc = dict(conf)
        gc["cni.dev/valid-attachments"] = []
        res = n.plugin("GC", gc)
    assert res.code == 0, res.stdout + res.stderr


FAILPOINTS = [s for s in ADD_STEPS] + [f"{s}#2" for s in PER_BOND]


@pytest.mark.parametrize("how", ["del", "gc"])
def test_kill_at_every_add_step_then_del_or_gc_restores_node(node_ns: Node, how: str) -> None:
    n = node_ns
    conf = two_bonds(n)
    before = n.snapshot()
    for i, point in enumerate(FAILPOINTS):
        pod = n.pod()
        cid = f"crash{i}"
        res = n.plugin("ADD", conf, pod, container_id=cid, extra={"RDMA_CNI_FAILPOINT": point})
        assert res.code == -signal.SIGKILL, (point, res.code, res.stderr[-500:])
        cleanup(n, conf, pod, how, cid)
        assert n.snapshot() == before, point
        assert n.state_files() == [], point
        assert [link["ifname"] for link in n.pod_json(pod, "link")] == ["lo"], point
        n.delete_pod(pod)


def test_kill_during_del_then_del_again_restores_node(node_ns: Node) -> None:
    n = node_ns
    conf = two_bonds(n)
    before = n.snapshot()
    for i, point in enumerate([*DEL_STEPS, "del-host-restored#2"]):
        pod = n.pod()
        cid = f"d{i}"
        assert n.plugin("ADD", conf, pod, container_id=cid).code == 0
        res = n.plugin("DEL", conf, pod, container_id=cid, extra={"RDMA_CNI_FAILPOINT": point})
        assert res.code == -signal.SIGKILL, point
        assert n.plugin("DEL", conf, "", container_id=cid).code == 0
        assert n.snapshot() == before, point
        assert n.state_files() == [], point
        n.delete_pod(pod)


@pytest.mark.slow
def test_kill_at_random_moments_then_del_or_gc_restores_node(node_ns: Node) -> None:
    """ADDs killed after a random delay spread over a whole ADD (import time included), until at
    least 50 were really killed mid-flight; after each, DEL or GC restores the node exactly."""
    n = node_ns
    conf = two_bonds(n)
    before = n.snapshot()
    # How long a full ADD takes here, to spread the kills over it. The machine's load changes while
    # the test runs, so the estimate shrinks whenever an ADD finishes before its kill.
    pod = n.pod()
    t0 = time.monotonic()
    assert n.plugin("ADD", conf, pod, container_id="probe").code == 0
    full = time.monotonic() - t0
    assert n.plugin("DEL", conf, pod, container_id="probe").code == 0
    rng = random.Random(20261130)
    outcomes = {"killed": 0, "finished": 0}
    for i in range(120):
        if outcomes["killed"] >= 50:
            break
        pod = n.pod()
        cid = f"r{i}"
        proc = n.start("ADD", conf, pod, container_id=cid)
        time.sleep(rng.uniform(0.05, 0.95) * full)
        proc.send_signal(signal.SIGKILL)
        res = finish(proc)
        killed = res.code == -signal.SIGKILL
        outcomes["killed" if killed else "finished"] += 1
        if not killed:
            full *= 0.8
        # After kill -9, the runtime's answer is DEL; for a few runs the node heals by GC instead.
        cleanup(n, conf, pod if i % 2 else "", "gc" if i % 5 == 0 else "del", cid)
        assert n.snapshot() == before, (i, res.code)
        assert n.state_files() == [], i
        n.delete_pod(pod)
    assert outcomes["killed"] >= 50, outcomes
