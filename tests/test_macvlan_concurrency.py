"""Concurrency: many real plugin processes at once on one node, serialised only by the node lock."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from netns import Node, finish

pytestmark = pytest.mark.netns


def eight_bonds(n: Node) -> dict[str, object]:
    for i in range(8):
        base = 16 * i
        n.bond(f"bond{i}", f"198.51.100.{base + 2}/28", f"198.51.100.{base + 3}/28",
               peer=f"198.51.100.{base + 1}/28")
    return n.config(masters=[f"bond{i}" for i in range(8)], cniVersion="1.1.0")


def test_eight_concurrent_adds_get_eight_distinct_bonds_and_a_ninth_gets_error_11(node_ns: Node) -> None:
    n = node_ns
    conf = eight_bonds(n)
    before = n.snapshot()
    pods = [n.pod() for _ in range(9)]
    procs = [n.start("ADD", conf, pods[i], container_id=f"c{i}") for i in range(8)]
    results = [finish(p) for p in procs]
    assert [r.code for r in results] == [0] * 8, [r.stdout for r in results if r.code]
    pins = n.pins()
    assert sorted(pins) == [f"bond{i}" for i in range(8)]
    assert sorted(pins.values()) == sorted(f"c{i}" for i in range(8))
    for i, r in enumerate(results):
        bond = r.out["interfaces"][0]["name"]
        assert pins[bond] == f"c{i}"
        assert n.ping(pods[i], f"198.51.100.{16 * int(bond[4:]) + 1}", bond)
    ninth = n.plugin("ADD", conf, pods[8], container_id="c8")
    assert ninth.code == 1 and ninth.out["code"] == 11, ninth.out
    assert "no free bond" in ninth.out["msg"]
    assert all(f"{b} by container {c} " in ninth.out["msg"] for b, c in pins.items())
    procs = [n.start("DEL", conf, pods[i], container_id=f"c{i}") for i in range(8)]
    assert [finish(p).code for p in procs] == [0] * 8
    assert n.snapshot() == before
    assert n.state_files() == []


@pytest.mark.slow
def test_200_concurrent_add_del_cycles_leave_nothing_behind(node_ns: Node) -> None:
    """8 workers, 25 ADD/DEL cycles each, all at once: 200 cycles, 400 plugin runs."""
    n = node_ns
    conf = eight_bonds(n)
    before = n.snapshot()

    def worker(w: int) -> list[str]:
        problems = []
        for k in range(25):
            pod = n.pod()
            cid = f"w{w}-{k}"
            add = n.plugin("ADD", conf, pod, container_id=cid)
            if add.code != 0:
                problems.append(f"{cid} ADD {add.stdout}")
            elif not n.pod_json(pod, "addr", "show", add.out["interfaces"][0]["name"]):
                problems.append(f"{cid}: pod interface missing")
            delete = n.plugin("DEL", conf, pod if k % 3 else "", container_id=cid)
            if delete.code != 0:
                problems.append(f"{cid} DEL {delete.stdout}")
            n.delete_pod(pod)
        return problems

    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        problems = [p for ps in pool.map(worker, range(8)) for p in ps]
    elapsed = time.monotonic() - t0
    print(f"200 concurrent ADD/DEL cycles took {elapsed:.1f} s")
    assert problems == []
    assert n.snapshot() == before
    assert n.state_files() == []
    assert n.pins() == {}
    links = [link["ifname"] for link in n.node_json("link")]
    assert sorted(links) == sorted(["lo", *(f"bond{i}" for i in range(8))])
