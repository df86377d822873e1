"""``cni-tool state`` and ``cni-tool doctor`` on a shared-mode node: per bond its subnet, the free
and held addresses and who holds them; the doctor's WARN/FAIL on a subnet narrower than /28, a
full pool, and addresses held by pods whose netns is gone. Real namespaces, the real rdma-ipvlan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from ipvlan_support import Shared
from netns import REPO, Node

pytestmark = pytest.mark.netns


def tool(n: Node, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ip", "netns", "exec", n.name, sys.executable, "-m", "rdma_cni.cli.tool", *args],
        capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ, PYTHONPATH=REPO),
    )  # fmt: skip


def setup(n: Node) -> tuple[Shared, dict[str, Any], list[str]]:
    s = Shared(n)
    s.bonds(2)
    n.bond("bond2", "198.51.100.34/29", peer="198.51.100.33/29")  # narrower than /28: 4 pods at most
    n.ip("route", "add", "203.0.113.64/28", "via", "198.51.100.33")
    conf = s.config(masters=["bond0", "bond1", "bond2"], ranges={"bond1": "198.51.100.19-198.51.100.20"})
    conf_dir = os.path.join(n.tmp, "net.d")
    os.makedirs(os.path.join(conf_dir, "rdma-multus.d"))
    with open(os.path.join(conf_dir, "rdma-multus.d", "tke-rdma-ipvlan.conf"), "w") as f:
        json.dump(conf, f)
    sysfs = os.path.join(n.tmp, "sys")
    os.makedirs(sysfs)
    return (
        s,
        conf,
        [
            "--conf-dir",
            conf_dir,
            "--sysfs-root",
            sysfs,
            "--data-dir",
            os.path.join(n.tmp, "m"),
            "--run-dir",
            n.run_dir,
            "--kubelet-root-dir",
            os.path.join(n.tmp, "kubelet"),
        ],
    )


def test_state_shows_each_bonds_subnet_free_and_held_addresses_and_who_holds_them(node_ns: Node) -> None:
    n = node_ns
    s, conf, args = setup(n)
    pods = [n.pod(), n.pod()]
    for i, pod in enumerate(pods):
        assert s.plugin("ADD", conf, pod, container_id=f"c{i}").code == 0
    n.delete_pod(pods[1])  # its DEL never came
    proc = tool(n, "state", "--json", *args)
    body = json.loads(proc.stdout)
    pools = {b["bond"]: b for b in body["sharedPools"]["bonds"]}
    assert pools["bond0"]["subnet"] == "198.51.100.0/28" and pools["bond0"]["free"] == 10
    assert [(h["address"], h["container_id"], h["alive"]) for h in pools["bond0"]["held"]] == [
        ("198.51.100.3", "c0", True),
        ("198.51.100.4", "c1", False),
    ]
    assert pools["bond1"]["free"] == 0 and pools["bond1"]["ranges"] == ["198.51.100.19-198.51.100.20"]
    assert pools["bond2"]["subnet"] == "198.51.100.32/29" and pools["bond2"]["free"] == 2
    assert pools["bond0"]["held"][0]["pod"] == "default/p"
    text = tool(n, "state", *args).stdout
    assert "bond0 198.51.100.0/28: 10 free, 2 held" in text, text
    assert "198.51.100.4" in text and "netns gone" in text


def test_doctor_warns_on_a_narrow_subnet_dead_holders_and_fails_on_a_full_pool(node_ns: Node) -> None:
    n = node_ns
    s, conf, args = setup(n)
    pods = [n.pod(), n.pod()]
    for i, pod in enumerate(pods):
        assert s.plugin("ADD", conf, pod, container_id=f"c{i}").code == 0
    n.delete_pod(pods[1])
    proc = tool(n, "doctor", "--json", *args)
    found = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "shared-pool"]
    by = {(f["status"], f["detail"].split(" ")[0].split("'")[0].rstrip(":")) for f in found}
    assert ("WARN", "bond2") in by  # narrower than /28
    assert ("FAIL", "bond1") in by  # its range is full
    assert any(
        f["status"] == "WARN" and "netns is gone" in f["detail"] and "198.51.100.4" in f["detail"]
        for f in found
    ), found
    assert proc.returncode == 1  # a full pool fails the node's readiness
    gc = dict(conf, cniVersion="1.1.0")
    gc["cni.dev/valid-attachments"] = [{"containerID": "c0", "ifname": "net1"}]
    assert s.plugin("GC", gc).code == 0
    found = [
        f
        for f in json.loads(tool(n, "doctor", "--json", *args).stdout)["findings"]
        if f["check"] == "shared-pool"
    ]
    assert not any("netns is gone" in f["detail"] for f in found), found
    assert not any(f["status"] == "FAIL" for f in found), found


def test_metrics_count_each_bonds_held_and_free_addresses_and_each_pod_address(node_ns: Node) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from rdma_cni.agent.metrics.node import NodeCollector, Sources
    from rdma_cni.net.netns import entered, open_netns

    n = node_ns
    s, conf, _ = setup(n)
    pods = [n.pod(), n.pod()]
    for i, pod in enumerate(pods):
        assert s.plugin("ADD", conf, pod, container_id=f"c{i}").code == 0
    n.delete_pod(pods[1])
    src = Sources(
        sysfs_roots=(os.path.join(n.tmp, "sys"),),
        data_dirs=(os.path.join(n.tmp, "m"),),
        conf_dir=os.path.join(n.tmp, "net.d"),
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(lambda: src, (os.path.join(n.tmp, "cache"),)))
    with open_netns(f"/run/netns/{n.name}") as ns, entered(ns):
        text = generate_latest(registry).decode()
    samples = {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in text_string_to_metric_families(text)
        for x in fam.samples
    }
    assert samples[("rdma_cni_bond_addresses", (("bond", "bond0"), ("state", "held")))] == 2
    assert samples[("rdma_cni_bond_addresses", (("bond", "bond0"), ("state", "free")))] == 10
    assert samples[("rdma_cni_bond_addresses", (("bond", "bond1"), ("state", "free")))] == 0
    live = (("address", "198.51.100.3"), ("bond", "bond0"), ("pod", "p"), ("pod_namespace", "default"))
    gone = (("address", "198.51.100.4"), ("bond", "bond0"), ("pod", "p"), ("pod_namespace", "default"))
    assert samples[("rdma_cni_pod_address", live)] == 1 and samples[("rdma_cni_pod_address", gone)] == 0
    assert samples[("rdma_cni_scrape_errors_total", (("section", "shared_pools"),))] == 0
