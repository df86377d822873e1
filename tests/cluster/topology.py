"""The cluster's network: where every node, bond, pod and Service lives, all inside the test ranges.

::

    netns rcl-fabric   bridge "mgmt" 203.0.113.1/27 (every node's eth0 on it), the bonds' peers (the
                       RDMA "switch": .1 of each bond's /28, forwarding between the RDMA subnets),
                       the image registry on 203.0.113.1:5000
    netns rcl-node<N>  eth0 203.0.113.<10+N>/27 (default route via the fabric), bond0..7 with
                       198.51.100.<128*(N-1) + 16*b + 2>/28 (8 bonds x /28 = half the /24 per node),
                       each bond's route to the other RDMA subnets in a table of its own (100+b) with
                       a rule from its address, as TKE nodes route each bond; node 1 also runs the
                       control plane (API server on 203.0.113.11:6443), as a kubeadm node does
    pods               203.0.113.128/25: node N's pods in 203.0.113.<128 + 64*(N-1)>/26 (ptp plays
                       TKE's tke-route-eni); the fabric routes each /26 to its node
    Services           203.0.113.64/27; ``kubernetes`` is 203.0.113.65

Two nodes fill 198.51.100.0/24 with their bonds, so ``--nodes`` is 1 or 2.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Sequence

PREFIX = "rcl"
FABRIC = f"{PREFIX}-fabric"
BONDS = 8
MAX_NODES = 2
FABRIC_IP = "203.0.113.1"
MGMT_PREFIX = 27
SERVICE_CIDR = "203.0.113.64/27"
KUBERNETES_SERVICE_IP = "203.0.113.65"
CLUSTER_CIDR = "203.0.113.128/25"
REGISTRY = f"{FABRIC_IP}:5000"
BOND_TABLE_BASE = 100


def node_name(n: int) -> str:
    return f"rdma-node-{n}"


def node_netns(n: int) -> str:
    return f"{PREFIX}-node{n}"


def node_ip(n: int) -> str:
    return f"203.0.113.{10 + n}"


def pod_cidr(n: int) -> str:
    return f"203.0.113.{128 + 64 * (n - 1)}/26"


def bond_subnet(n: int, b: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"198.51.100.{128 * (n - 1) + 16 * b}/28")


def bond_ip(n: int, b: int) -> str:
    return str(bond_subnet(n, b).network_address + 2)


def switch_ip(n: int, b: int) -> str:
    return str(bond_subnet(n, b).network_address + 1)


def bond_numa(b: int) -> int:
    """bond0..3 on NUMA node 0, bond4..7 on 1: the seed's 8 bonds on 2 sockets."""
    return b * 2 // BONDS


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["ip", *(("-n", netns) if netns else ()), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
    return proc


def sysctl(netns: str, key: str, value: str) -> None:
    """A sysctl of a namespace this harness made (never the host's)."""
    subprocess.run(["ip", "netns", "exec", netns, "sysctl", "-qw", f"{key}={value}"], check=True)


def make_fabric() -> None:
    ip("netns", "add", FABRIC)
    ip("link", "set", "lo", "up", netns=FABRIC)
    ip("link", "add", "mgmt", "type", "bridge", netns=FABRIC)
    ip("addr", "add", f"{FABRIC_IP}/{MGMT_PREFIX}", "dev", "mgmt", netns=FABRIC)
    ip("link", "set", "mgmt", "up", netns=FABRIC)
    sysctl(FABRIC, "net.ipv4.ip_forward", "1")


def make_node_net(n: int) -> None:
    """The node netns, its eth0 on the fabric's bridge, and its eight bonds (veth ends whose peers in
    the fabric are the switch ports)."""
    ns = node_netns(n)
    ip("netns", "add", ns)
    ip("link", "set", "lo", "up", netns=ns)
    peer = f"n{n}-eth0"
    ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", peer, "netns", FABRIC)
    ip("link", "set", peer, "master", "mgmt", "up", netns=FABRIC)
    ip("addr", "add", f"{node_ip(n)}/{MGMT_PREFIX}", "dev", "eth0", netns=ns)
    ip("link", "set", "eth0", "up", netns=ns)
    ip("route", "add", "default", "via", FABRIC_IP, netns=ns)
    ip("route", "add", pod_cidr(n), "via", node_ip(n), netns=FABRIC)
    for b in range(BONDS):
        port = f"n{n}-b{b}"
        ip("link", "add", f"bond{b}", "netns", ns, "type", "veth", "peer", "name", port, "netns", FABRIC)
        ip("addr", "add", f"{switch_ip(n, b)}/28", "dev", port, netns=FABRIC)
        ip("link", "set", port, "up", netns=FABRIC)
        ip("addr", "add", f"{bond_ip(n, b)}/28", "dev", f"bond{b}", netns=ns)
        ip("link", "set", f"bond{b}", "up", netns=ns)
        table = str(BOND_TABLE_BASE + b)
        ip(
            "route",
            "add",
            "198.51.100.0/24",
            "via",
            switch_ip(n, b),
            "dev",
            f"bond{b}",
            "table",
            table,
            netns=ns,
        )
        ip("rule", "add", "from", bond_ip(n, b), "lookup", table, "priority", str(1000 + b), netns=ns)
    sysctl(ns, "net.ipv4.ip_forward", "1")


def remove_netns(names: Sequence[str]) -> None:
    for ns in names:
        ip("netns", "del", ns, check=False)


def leftover_netns() -> list[str]:
    """Every netns of this harness (by prefix), e.g. after a run killed with -9."""
    out = ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{PREFIX}-")]
