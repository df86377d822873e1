"""The issue's pod, black-box: rdma-multus with the cluster network played by Debian's ``ptp`` +
``host-local`` in 203.0.113.0/24 and ``tke-rdma-macvlan`` on bonds whose node routes include
``203.0.113.0/24 via <peer> dev bond<i>`` — the very prefix ptp routes via eth0 in the pod.

ptp's routes must stay as ptp made them; the bonds' routes go to their own tables; the merged
result lists only routes that are really in the pod (with ``table`` in 1.1.0); CHECK passes right
after ADD; DEL leaves ptp's routes and gives the node back exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from netns import REPO, Node

from tests.plugins.macvlan.test_macvlan_route_clash import (
    all_routes,
    assert_result_true,
    route_get,
    routes_of,
    rules_from,
)

pytestmark = pytest.mark.netns

REF = Path("/usr/lib/cni")
VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
ANNOTATION = "tke.cloud.tencent.com/networks"
NETWORKS = "tke-route-eni,tke-rdma-macvlan"

if not (REF / "ptp").exists():
    pytest.skip("needs Debian's containernetworking-plugins (ptp, host-local)", allow_module_level=True)


def cabled_bonds(n: Node, count: int) -> list[tuple[str, str, str]]:
    """bond<i> 198.51.100.(16i+2)/28, peer .16i+1; ``203.0.113.0/24 via <peer>`` in main (metric
    10+i) and a default route in table 10+i with its ``from`` rule, like a node with policy routing."""
    out = []
    for i in range(count):
        ip, peer = f"198.51.100.{16 * i + 2}", f"198.51.100.{16 * i + 1}"
        n.bond(f"bond{i}", f"{ip}/28", peer=f"{peer}/28")
        n.ip("route", "add", "203.0.113.0/24", "via", peer, "dev", f"bond{i}", "metric", str(10 + i))
        n.ip("route", "add", "default", "via", peer, "table", str(10 + i))
        n.ip("rule", "add", "from", ip, "lookup", str(10 + i), "pref", str(1000 + i))
        out.append((f"bond{i}", ip, peer))
    return out


def networks(n: Node, version: str, count: int) -> dict[str, Any]:
    """conf dir + bin dir for rdma-multus; returns its config."""
    conf_dir, bin_dir = Path(n.tmp, "net.d"), Path(n.tmp, "bin")
    conf_dir.mkdir()
    bin_dir.mkdir()
    for plugin in ("ptp", "host-local", "loopback"):
        (bin_dir / plugin).symlink_to(REF / plugin)
    wrapper = bin_dir / "rdma-macvlan"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m rdma_cni.cli.macvlan\n")
    wrapper.chmod(0o755)
    ptp_version = "1.0.0" if version == "1.1.0" else version  # Debian's ptp stops at 1.0.0
    (conf_dir / "tke-route-eni.conflist").write_text(json.dumps({
        "cniVersion": ptp_version, "name": "tke-route-eni", "plugins": [{
            "type": "ptp", "ipMasq": False,
            "ipam": {"type": "host-local", "dataDir": os.path.join(n.tmp, "ipam"),
                     "ranges": [[{"subnet": "203.0.113.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}))
    macvlan = n.config(masters=[f"bond{i}" for i in range(count)], count=count, cniVersion=version)
    macvlan["name"] = "tke-rdma-macvlan"
    (conf_dir / "tke-rdma-macvlan.conf").write_text(json.dumps(macvlan))
    return {
        "cniVersion": version, "name": "tke-multus", "type": "rdma-multus", "kubeconfig": "",
        "confDir": str(conf_dir), "defaultDelegates": "tke-route-eni", "binDirs": [str(bin_dir)],
        "cacheDir": os.path.join(n.tmp, "multus-cache"), "kubeletRootDir": os.path.join(n.tmp, "kubelet"),
        "logFile": os.path.join(n.tmp, "multus.log"), "logLevel": "debug",
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {ANNOTATION: NETWORKS}},
    }


def multus(n: Node, command: str, conf: dict[str, Any], netns: str) -> tuple[int, Any]:
    env = n.env(command, None, "c1", "eth0")
    env.update({"CNI_NETNS": netns, "CNI_PATH": conf["binDirs"][0],
                "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=ibv-app-0"})
    proc = subprocess.run(["ip", "netns", "exec", n.name, sys.executable, "-m", "rdma_cni.cli.multus"],
                          input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=120,
                          cwd=REPO, check=False)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("count", [1, 4])
def test_ptp_routes_the_bonds_prefix_and_keeps_its_route_while_the_bonds_get_their_own_tables(
    node_ns: Node, count: int, version: str
) -> None:
    n = node_ns
    bonds = cabled_bonds(n, count)
    before = n.snapshot()
    pod = n.pod()
    conf = networks(n, version, count)
    code, res = multus(n, "ADD", conf, pod.path)
    assert code == 0, res
    theirs = routes_of(n, pod, "eth0")
    ptp_gw = next(r["gateway"] for r in theirs if r["dst"] == "default")
    assert {(r["dst"], r.get("gateway")) for r in theirs} >= {("203.0.113.0/24", ptp_gw), ("default", ptp_gw)}
    assert [i["name"] for i in res["interfaces"] if i.get("sandbox")] == ["eth0"] + [b for b, _, _ in bonds]

    live = all_routes(n, pod)
    assert_result_true(res, live)
    listed = {(r["dst"], r.get("gw"), r.get("table")) for r in res.get("routes", [])}
    assert ("0.0.0.0/0", None, None) in listed  # ptp's (it lists no gw), in main
    rules = rules_from(n, pod)
    for i, (bond, ip, peer) in enumerate(bonds):
        table = 100 + i
        assert rules.get(ip) == str(table), rules
        mine = {(r["dst"], r.get("gateway", "")) for r in routes_of(n, pod, bond)
                if r.get("table") == str(table)}
        assert mine == {(f"198.51.100.{16 * i}/28", ""), ("203.0.113.0/24", peer), ("default", peer)}, mine
        assert route_get(n, pod, "203.0.113.77", src=ip)["dev"] == bond
        bond_listed = {(dst, gw) for dst, gw, t in listed if t == table}
        if version == "1.1.0":
            assert bond_listed == {(f"198.51.100.{16 * i}/28", None), ("203.0.113.0/24", peer),
                                   ("0.0.0.0/0", peer)}, listed
        assert not [r for r in listed if r[1] == peer and r[2] is None], "a bond route listed as main"
    assert route_get(n, pod, "203.0.113.77")["dev"] == "eth0"

    if version >= "0.4.0":
        code, out = multus(n, "CHECK", {**conf, "prevResult": res}, pod.path)
        assert code == 0, out
    code, out = multus(n, "DEL", conf, pod.path)
    assert code == 0, out
    assert [link["ifname"] for link in n.pod_json(pod, "link")] == ["lo"]  # ptp's eth0 went with its DEL
    assert rules_from(n, pod) == {}
    assert n.snapshot() == before


def test_ptp_routes_survive_a_del_of_the_rdma_network_alone(node_ns: Node) -> None:
    """rdma-macvlan's DEL (what multus runs first on DEL) never takes ptp's routes with it."""
    n = node_ns
    cabled_bonds(n, 1)
    pod = n.pod()
    conf = networks(n, "1.1.0", 1)
    code, res = multus(n, "ADD", conf, pod.path)
    assert code == 0, res
    theirs = routes_of(n, pod, "eth0")
    macvlan = json.loads(Path(conf["confDir"], "tke-rdma-macvlan.conf").read_text())
    out = n.plugin("DEL", macvlan, pod, container_id="c1", ifname="net1")
    assert out.code == 0, out.stdout
    assert routes_of(n, pod, "eth0") == theirs
    assert rules_from(n, pod) == {}
    code, res = multus(n, "DEL", conf, pod.path)
    assert code == 0, res
