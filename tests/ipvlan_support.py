"""rdma-ipvlan on the test node of :mod:`netns`: the same node, switch and pods, the plugin run
in-process or through the agent (the C client named ``rdma-ipvlan``), state in a directory of its own.

    with node() as n:
        s = Shared(n); s.bonds(2)                  # bond0 198.51.100.2/28, bond1 198.51.100.18/28 ...
        res = s.plugin("ADD", s.config(), n.pod(), container_id="c1")

This kernel has no IPVLAN, so ``config()`` defaults to ``link: macvlan``; the tests of the
missing-IPVLAN error ask for ``link: ipvlan`` themselves.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from netns import Node, PluginResult, Pod, _result, c_client

PLUGIN = [sys.executable, "-m", "rdma_cni.cli.ipvlan"]


def ipvlan_client() -> str:
    """The shipped C client under the name ``rdma-ipvlan`` (it tells the agent which plugin)."""
    path = os.path.join(os.path.dirname(c_client()), "rdma-ipvlan")
    if not os.path.lexists(path):
        os.symlink("rdma-cni-client", path)
    return path


class Shared:
    """The node as rdma-ipvlan sees it."""

    def __init__(self, n: Node) -> None:
        self.n = n

    @property
    def data_dir(self) -> str:
        return os.path.join(self.n.tmp, "ipvlan-state")

    def bonds(self, count: int, v6: bool = False, gateway: bool = True) -> list[str]:
        """``count`` bonds on /28s of 198.51.100.0/24 (bond i: .16i+2, its switch peer .16i+1);
        ``gateway``: a route through the peer (so the peer's address is a gateway, never a pod's);
        ``v6``: each also holds 2001:db8:i::2/64 (its peer 2001:db8:i::1)."""
        names = []
        for i in range(count):
            base = 16 * i
            cidrs = [f"198.51.100.{base + 2}/28"] + ([f"2001:db8:{i}::2/64 nodad"] if v6 else [])
            name = f"bond{i}"
            self.n.bond(name, *cidrs, peer=f"198.51.100.{base + 1}/28")
            if v6:
                peer = f"p{i}-{self.n.tag[:6]}"
                self.n_switch("addr", "add", f"2001:db8:{i}::1/64", "dev", peer, "nodad")
            if gateway:
                self.n.ip("route", "add", f"203.0.113.{base}/28", "via", f"198.51.100.{base + 1}")
            names.append(name)
        return names

    def n_switch(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.n.switch, *args], check=True, capture_output=True)

    def config(self, **keys: Any) -> dict[str, Any]:
        conf = self.n.config(
            name="tke-rdma-ipvlan", type="rdma-ipvlan", link="macvlan", dataDir=self.data_dir
        )
        conf.update(keys)
        return conf

    def argv(self) -> list[str]:
        if self.n.mode == "agent":
            return ["ip", "netns", "exec", self.n.name, ipvlan_client()]
        return ["ip", "netns", "exec", self.n.name, *PLUGIN]

    def plugin(
        self,
        command: str,
        conf: Mapping[str, Any],
        pod: Pod | str | None = None,
        container_id: str = "c1",
        ifname: str = "net1",
        extra: Mapping[str, str] | None = None,
        timeout: float = 60,
    ) -> PluginResult:
        proc = subprocess.run(
            self.argv(),
            input=json.dumps(conf).encode(),
            capture_output=True,
            timeout=timeout,
            env=self.n.env(command, pod, container_id, ifname, extra),
            check=False,
        )
        return _result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())

    def start(
        self,
        command: str,
        conf: Mapping[str, Any],
        pod: Pod | str | None = None,
        container_id: str = "c1",
        ifname: str = "net1",
        extra: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.n.env(command, pod, container_id, ifname, extra),
        )
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(conf).encode())
        proc.stdin.close()
        proc.stdin = None
        return proc

    def state_files(self) -> list[str]:
        d = os.path.join(self.data_dir, "attachments")
        return sorted(os.listdir(d)) if os.path.isdir(d) else []

    def held(self) -> dict[str, dict[str, str]]:
        """bond -> address -> container ID, read straight from the records."""
        out: dict[str, dict[str, str]] = {}
        for name in [f for f in self.state_files() if f.endswith(".json")]:
            with open(os.path.join(self.data_dir, "attachments", name)) as f:
                rec = json.load(f)
            for b in rec["bonds"]:
                for a in b["addresses"]:
                    ip = dict((k, v) for k, v in a["attrs"])["IFA_ADDRESS"]
                    out.setdefault(b["bond"], {})[ip] = rec["container_id"]
        return out

    def pod_addresses(self, pod: Pod) -> dict[str, list[str]]:
        """Pod interface -> its global addresses (``ip/plen``)."""
        out = {}
        for link in self.n.pod_json(pod, "addr"):
            if link["ifname"] == "lo":
                continue
            out[link["ifname"]] = [
                f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a.get("scope") == "global"
            ]
        return out

    def pod_links(self, pod: Pod) -> list[str]:
        return sorted(link["ifname"] for link in self.n.pod_json(pod, "link"))


def ip_of(result_ip: Mapping[str, Any]) -> str:
    return str(ipaddress.ip_interface(result_ip["address"]).ip)
