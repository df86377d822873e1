"""cni-tool against the real thing: upstream cnitool (built from Debian's source) and Debian's Go
reference plugins (macvlan on a veth parent + host-local + tuning), on the same netns and conflist.

Both tools must produce the same result, the same interface and addresses in the pod, and the same
libcni result cache, so each can CHECK and DEL what the other ADDed. Everything runs inside a "node"
netns this test creates (the macvlan parent lives there, its peer in a "switch" netns); cnitool's
fixed cache dir /var/lib/cni is redirected to the test's own dir by a bind mount inside a private
mount namespace, so the host's cache is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rdma_cni.cli.tool import container_id_for
from rdma_cni.cni.cache import CacheEntry

pytestmark = pytest.mark.netns

REPO = Path(__file__).resolve().parents[2]
PLUGIN_DIR = "/usr/lib/cni"
MAC = "02:00:5e:10:00:42"
# CAP_ARGS: "mac" reaches only tuning and "ips" only macvlan (each declares just that capability);
# pinning the IP keeps host-local's round-robin from giving the second ADD another address.
CAP_ARGS = {"mac": MAC, "ips": ["198.51.100.30/24"]}


def _need(condition: bool, reason: str) -> None:
    if not condition:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def cnitool() -> str:
    _need(os.geteuid() == 0, "needs root for network namespaces")
    for plugin in ("macvlan", "host-local", "tuning"):
        _need(
            os.access(f"{PLUGIN_DIR}/{plugin}", os.X_OK),
            f"Debian containernetworking-plugins missing: {plugin}",
        )
    proc = subprocess.run(
        [str(REPO / "scripts" / "build-cnitool")], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        pytest.skip(f"upstream cnitool cannot be built here: {proc.stderr.strip()[-400:]}")
    return proc.stdout.strip().splitlines()[-1]


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@dataclass
class Lab:
    tag: str
    node: str
    pod: str
    netns_path: str
    dir: Path
    netconf: Path
    cache: Path
    ipam: Path
    cnitool: str

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("CNI_IFNAME", "CNI_ARGS", "CAP_ARGS", "CNI_TOOL_CACHE_DIR"):
            env.pop(key, None)
        env.update(
            NETCONFPATH=str(self.netconf),
            CNI_PATH=PLUGIN_DIR,
            CAP_ARGS=json.dumps(CAP_ARGS),
            CNI_ARGS="IgnoreUnknown=1;K8S_POD_NAMESPACE=h1;K8S_POD_NAME=h1-pod",
        )
        env.update(extra)
        return env

    def ours(self, verb: str, network: str, **env: str) -> subprocess.CompletedProcess[str]:
        cmd = [
            "ip",
            "netns",
            "exec",
            self.node,
            sys.executable,
            "-m",
            "rdma_cni.cli.tool",
            "--cache-dir",
            str(self.cache),
            verb,
            network,
            self.netns_path,
        ]
        return subprocess.run(cmd, env=self.env(**env), capture_output=True, text=True, timeout=60)

    def theirs(self, verb: str, network: str, **env: str) -> subprocess.CompletedProcess[str]:
        # cnitool's cache dir is libcni's fixed /var/lib/cni: give it ours in a private mount ns.
        script = 'mount --bind "$1" /var/lib/cni && shift && exec "$@"'
        cmd = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(self.cache),
            "ip",
            "netns",
            "exec",
            self.node,
            self.cnitool,
            verb,
            network,
            self.netns_path,
        ]
        return subprocess.run(cmd, env=self.env(**env), capture_output=True, text=True, timeout=60)

    def cache_files(self) -> list[Path]:
        results = self.cache / "results"
        return sorted(p for p in results.iterdir() if not p.name.startswith(".")) if results.exists() else []

    def pod_state(self, ifname: str = "eth0") -> dict[str, Any]:
        """What a pod sees: its interface (MAC, MTU, addresses) and its routes, minus kernel indexes."""
        links = json.loads(_ip("-n", self.pod, "-j", "addr", "show"))
        link = next((x for x in links if x["ifname"] == ifname), None)
        if link is None:
            return {}
        routes = json.loads(_ip("-n", self.pod, "-j", "route", "show"))
        return {
            "mac": link["address"],
            "mtu": link["mtu"],
            # the IPv6 link-local comes from the MAC the kernel chose before tuning set ours: skip it
            "addrs": sorted(
                (a["family"], a["local"], a["prefixlen"])
                for a in link["addr_info"]
                if a.get("scope") != "link"
            ),
            "routes": sorted((r["dst"], r.get("gateway", ""), r.get("dev", "")) for r in routes),
        }

    def leased(self) -> list[str]:
        """IPs host-local has handed out (one file per IP in its data dir)."""
        net_dir = self.ipam / "h1net"
        if not net_dir.exists():
            return []
        return sorted(p.name for p in net_dir.iterdir() if p.name[0].isdigit())


CONFLIST = """{
  "cniVersion": "1.0.0",
  "name": "h1net",
  "plugins": [
    {"type": "macvlan", "master": "h1m0", "mode": "bridge", "capabilities": {"ips": true},
     "ipam": {"type": "host-local", "dataDir": "%(ipam)s",
              "ranges": [[{"subnet": "198.51.100.0/24", "rangeStart": "198.51.100.30",
                           "rangeEnd": "198.51.100.40", "gateway": "198.51.100.1"}]],
              "routes": [{"dst": "203.0.113.0/24", "gw": "198.51.100.1"}]}},
    {"type": "tuning", "capabilities": {"mac": true}, "mtu": 1400,
     "sysctl": {"net.ipv4.conf.%(ifname)s.arp_notify": "1"}}
  ]
}
"""

SINGLE = """{"cniVersion": "0.4.0", "name": "h1single", "type": "macvlan", "master": "h1m0",
  "ipam": {"type": "host-local", "dataDir": "%(ipam)s", "subnet": "203.0.113.0/24",
           "rangeStart": "203.0.113.20", "rangeEnd": "203.0.113.30", "note": "<&>"}}
"""


@pytest.fixture
def lab(cnitool: str, tmp_path: Path) -> Iterator[Lab]:
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    node, switch, pod = f"h1-node-{tag}", f"h1-sw-{tag}", f"h1-pod-{tag}"
    made: list[str] = []
    os.makedirs("/var/lib/cni", exist_ok=True)  # the bind-mount target for cnitool's cache
    try:
        for ns in (node, switch, pod):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("-n", node, "link", "add", "h1m0", "type", "veth", "peer", "name", "h1s0", "netns", switch)
        _ip("-n", node, "link", "set", "h1m0", "up")
        _ip("-n", switch, "link", "set", "h1s0", "up")
        _ip("-n", switch, "addr", "add", "198.51.100.1/24", "dev", "h1s0")
        netconf = tmp_path / "net.d"
        netconf.mkdir()
        lab = Lab(
            tag,
            node,
            pod,
            f"/var/run/netns/{pod}",
            tmp_path,
            netconf,
            tmp_path / "cache",
            tmp_path / "ipam",
            cnitool,
        )
        lab.cache.mkdir()
        (netconf / "10-h1net.conflist").write_text(CONFLIST % {"ipam": lab.ipam, "ifname": "eth0"})
        (netconf / "20-h1single.conf").write_text(SINGLE % {"ipam": lab.ipam})
        yield lab
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(tmp_path, ignore_errors=True)


def _ok(proc: subprocess.CompletedProcess[str], what: str) -> str:
    assert proc.returncode == 0, f"{what} failed (rc {proc.returncode}): {proc.stderr.strip()}"
    return proc.stdout


def test_same_results_and_each_deletes_what_the_other_added(lab: Lab) -> None:
    # 1. ours ADD; upstream CHECK and DEL it through the shared cache.
    ours_result = json.loads(_ok(lab.ours("add", "h1net"), "cni-tool add"))
    ours_state = lab.pod_state()
    [ours_file] = lab.cache_files()
    assert ours_file.name == f"h1net-{container_id_for(lab.netns_path)}-eth0"
    assert lab.leased() == ["198.51.100.30"]
    _ok(lab.theirs("check", "h1net"), "cnitool check of cni-tool's attachment")
    _ok(lab.theirs("del", "h1net"), "cnitool del of cni-tool's attachment")
    assert lab.pod_state() == {} and lab.cache_files() == [] and lab.leased() == []

    # 2. upstream ADD; ours CHECK and DEL it.
    their_result = json.loads(_ok(lab.theirs("add", "h1net"), "cnitool add"))
    their_state = lab.pod_state()
    [their_file] = lab.cache_files()
    assert their_file.name == ours_file.name, "same container ID derivation and file naming"
    their_bytes = their_file.read_bytes()
    _ok(lab.ours("check", "h1net"), "cni-tool check of cnitool's attachment")
    _ok(lab.ours("del", "h1net"), "cni-tool del of cnitool's attachment")
    assert lab.pod_state() == {} and lab.cache_files() == [] and lab.leased() == []

    # Same result JSON, same pod, same cache content.
    assert ours_result == their_result
    assert (
        ours_result["interfaces"][0]["mac"] == MAC and ours_result["ips"][0]["address"] == "198.51.100.30/24"
    )
    assert ours_state == their_state
    assert ours_state["mac"] == MAC and ours_state["mtu"] == 1400
    assert ("inet", "198.51.100.30", 24) in ours_state["addrs"]
    assert ("203.0.113.0/24", "198.51.100.1", "eth0") in ours_state["routes"]
    theirs = CacheEntry.from_json(their_bytes)
    assert theirs.netns == "", "Debian's libcni 1.1.2 does not record netns; newer libcni and we do"
    assert theirs.to_json() == their_bytes, "our encoder reproduces libcni's file byte for byte"
    ours = CacheEntry.from_json(_cache_snapshot(lab, "h1net"))
    assert ours.netns == lab.netns_path
    ours.netns = ""
    assert ours.to_json() == their_bytes


def _cache_snapshot(lab: Lab, network: str) -> bytes:
    """ADD with our tool once more and return its cache file (then clean up with upstream's DEL)."""
    _ok(lab.ours("add", network), "cni-tool add")
    [path] = lab.cache_files()
    data = path.read_bytes()
    _ok(lab.theirs("del", network), "cnitool del")
    assert lab.cache_files() == []
    return data


def test_single_conf_and_custom_ifname_interoperate(lab: Lab) -> None:
    """A .conf is up-converted to the same one-plugin list (same cache bytes); CNI_IFNAME is honoured."""
    their_result = json.loads(_ok(lab.theirs("add", "h1single", CNI_IFNAME="net1"), "cnitool add"))
    [their_file] = lab.cache_files()
    assert their_file.name.endswith("-net1")
    their_bytes = their_file.read_bytes()
    assert lab.pod_state("net1")["addrs"][0][:2] == ("inet", "203.0.113.20")
    _ok(lab.ours("check", "h1single", CNI_IFNAME="net1"), "cni-tool check")
    _ok(lab.ours("del", "h1single", CNI_IFNAME="net1"), "cni-tool del")
    assert lab.pod_state("net1") == {} and lab.cache_files() == []

    # host-local hands out addresses round-robin; restart it at rangeStart so both ADDs get .20
    for marker in (lab.ipam / "h1single").glob("last_reserved_ip.*"):
        marker.unlink()
    ours_result = json.loads(_ok(lab.ours("add", "h1single", CNI_IFNAME="net1"), "cni-tool add"))
    [ours_file] = lab.cache_files()
    ours = CacheEntry.from_json(ours_file.read_bytes())
    theirs = CacheEntry.from_json(their_bytes)
    assert ours.result is not None and theirs.result is not None
    # no tuning in this network: the kernel picked each MAC at random; all else must be identical
    ours.result["interfaces"][0]["mac"] = theirs.result["interfaces"][0]["mac"]
    ours.netns = ""
    assert ours.to_json() == their_bytes, "same synthesised config list and result, byte for byte"
    # 0.4.0 results carry ips[].version; both tools print what the plugin returned
    assert their_result["ips"][0]["version"] == "4"
    their_result["interfaces"][0].pop("mac")
    ours_result["interfaces"][0].pop("mac")  # no tuning here: the kernel picks the MAC
    assert ours_result == their_result
    _ok(lab.theirs("del", "h1single", CNI_IFNAME="net1"), "cnitool del")
    assert lab.pod_state("net1") == {} and lab.cache_files() == []


def test_del_twice_and_del_without_cache_succeed_for_both(lab: Lab) -> None:
    _ok(lab.ours("add", "h1net"), "cni-tool add")
    _ok(lab.ours("del", "h1net"), "cni-tool del")
    _ok(lab.ours("del", "h1net"), "cni-tool del again")
    _ok(lab.theirs("del", "h1net"), "cnitool del after it is gone")
    assert lab.pod_state() == {} and lab.leased() == []


def test_both_refuse_a_second_add_of_the_same_interface(lab: Lab) -> None:
    _ok(lab.theirs("add", "h1net"), "cnitool add")
    again = lab.ours("add", "h1net")
    assert again.returncode == 1
    assert "macvlan" in again.stderr and "cni-tool del h1net" in again.stderr
    assert "Traceback" not in again.stderr
    _ok(lab.ours("del", "h1net"), "cni-tool del")
    assert lab.pod_state() == {} and lab.leased() == []
