"""A bond kubelet gave this pod while the container that held it has not been DELeted yet.

Found by the chaos run on the test cluster: kubelet hands a force-deleted pod's devices to the next
pod before the old sandbox's DEL has run. The ADD answered 11 at once ("bond0 is pinned to ..."),
and the pod started 10-17 s late, after kubelet's pod-worker back-off. ADD now waits for the pin to
clear (``pinnedWaitMs``, outside the node lock, so the DEL can run), bounded.
"""

from __future__ import annotations

import time

import pytest
from netns import Node, finish

pytestmark = pytest.mark.netns


@pytest.fixture
def bond0(node_ns: Node) -> Node:
    node_ns.bond("bond0", "198.51.100.2/28", peer="198.51.100.1/28")
    return node_ns


def test_add_waits_for_the_del_of_the_container_that_held_its_bond(bond0: Node) -> None:
    n = bond0
    before = n.snapshot()
    old, new = n.pod(), n.pod()
    conf = n.config(masters=["bond0"], runtimeConfig={"deviceID": "bond0"}, pinnedWaitMs=30_000)
    assert n.plugin("ADD", conf, old, "old").code == 0
    waiting = n.start("ADD", conf, new, "new")
    time.sleep(1.5)
    assert waiting.poll() is None, "the ADD did not wait for the pin"
    assert n.plugin("DEL", conf, old, "old").code == 0  # the force-deleted pod's sandbox goes
    got = finish(waiting)
    assert got.code == 0, got.out
    assert "198.51.100.2/28" in {ip["address"] for ip in got.out["ips"]}
    assert n.pins() == {"bond0": "new"}
    assert "waits: bond0 is pinned to container old" in open(conf["logFile"]).read()
    assert n.plugin("DEL", conf, new, "new").code == 0
    assert n.snapshot() == before


@pytest.mark.parametrize("wait_ms", [0, 300])
def test_a_pin_that_does_not_clear_is_error_11_after_the_bound(bond0: Node, wait_ms: int) -> None:
    n = bond0
    old, new = n.pod(), n.pod()
    conf = n.config(masters=["bond0"], runtimeConfig={"deviceID": "bond0"}, pinnedWaitMs=wait_ms)
    assert n.plugin("ADD", conf, old, "old").code == 0
    got = n.plugin("ADD", conf, new, "new")
    assert got.code != 0 and got.out["code"] == 11, got.out
    assert "bond0 is pinned to container old (net1)" in got.out["msg"]
    assert ("waited 300 ms for its DEL" in got.out["msg"]) is (wait_ms == 300)
    assert n.pins() == {"bond0": "old"}
    assert n.plugin("DEL", conf, old, "old").code == 0
