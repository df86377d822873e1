"""rdma-agent's reconcile frees the addresses of shared-mode pods whose netns is gone (after a
reboot or a crash, before the runtime's DEL or GC comes), and leaves a live pod's alone."""

from __future__ import annotations

import json
import os
import time

import pytest
from ipvlan_support import Shared
from netns import REPO, Node, launch_agent, stop_agent

pytestmark = pytest.mark.netns


def test_reconcile_frees_only_the_addresses_of_pods_whose_netns_is_gone(node_ns: Node) -> None:
    n = node_ns
    s = Shared(n)
    s.bonds(2)
    conf = s.config(masters=["bond0", "bond1"])
    conf_dir = os.path.join(n.tmp, "net.d")
    os.makedirs(os.path.join(conf_dir, "rdma-multus.d"))
    with open(os.path.join(conf_dir, "rdma-multus.d", "tke-rdma-ipvlan.conf"), "w") as f:
        json.dump(conf, f)
    alive, doomed = n.pod(), n.pod()
    assert s.plugin("ADD", conf, alive, container_id="alive").code == 0
    assert s.plugin("ADD", conf, doomed, container_id="doomed").code == 0
    n.delete_pod(doomed)  # the runtime never calls DEL
    sock, log = os.path.join(n.tmp, "reconcile.sock"), os.path.join(n.tmp, "reconcile.log")
    agent = launch_agent(
        sock,
        log,
        "--conf-dir",
        conf_dir,
        "--reconcile-interval",
        "0",
        netns=n.name,
        env=dict(os.environ, PYTHONPATH=REPO),
    )
    try:
        deadline = time.monotonic() + 60
        while "doomed" in json.dumps(s.held()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s.held() == {"bond0": {"198.51.100.3": "alive"}, "bond1": {"198.51.100.19": "alive"}}
        assert s.pod_links(alive) == ["bond0", "bond1", "lo"]
    finally:
        stop_agent(agent)
    assert "gone; running DEL" in open(log).read()
