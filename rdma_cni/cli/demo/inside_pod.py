"""Step 4 of the demo: inside the pod. Exclusive mode (:func:`exclusive`): one interface per bond
holding the bond's own IP, whose RoCE v2 GID sits at the host's index. Shared mode (:func:`shared`):
a child of every bond in each pod, each with an address of its own and that address's own GID index,
while the node's bonds keep theirs.
"""

from __future__ import annotations

import ipaddress
import json
from functools import partial
from typing import Any

from rdma_cni.cli.demo.installed import Demo
from rdma_cni.cli.demo.node import bond_addr, bond_ip, gid_index
from rdma_cni.cli.demo.shared_node import NETWORK, PODS, SharedDemo
from rdma_cni.cli.demo.shell import DemoFailed, banner, run, say
from rdma_cni.plugins.multus.status import rdma_device_info
from rdma_cni.rdma import records, sysfs


def exclusive(d: Demo, host_index: int) -> None:
    banner("4. Inside the pod: eth0 from the cluster network, one interface per bond with the bond's IP")
    run("ip", "-n", d.pod, "-br", "addr", show=True)
    run("ip", "-n", d.pod, "route", "show", "table", "all", show=True)
    run("ip", "-n", d.pod, "rule", show=True)
    say()
    say("The node meanwhile (the bonds lent to the pod have no IPv4 address now):")
    run("ip", "-n", d.node, "-br", "addr", show=True)
    for i, bond in d.pod_bond_list():
        d.wait_for(f"the pod's GID on {bond}", partial(_moved, d, i, bond))
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    for i, bond in d.pod_bond_list():
        index = gid_index(d, i)
        if index != host_index:
            raise DemoFailed(
                f"the pod's GID for {bond_ip(i)} is at index {index}, the host's was {host_index}"
            )
        say(
            f"-> pod {bond}: RoCE v2 GID of {bond_ip(i)} at index {index}, the same as the host's: "
            f"NCCL_IB_GID_INDEX={index} works in every pod"
        )


def _moved(d: Demo, i: int, bond: str) -> bool:
    return gid_index(d, i) is not None and not d.host_has(bond)



def shared(d: SharedDemo, bonds_before: dict[str, Any], host_index: int) -> list[dict[str, str]]:
    banner("4. Inside the pods: a child of every bond in each, each with an address of its own")
    say(f"(link: macvlan, a MAC per pod: this kernel has no IPVLAN; {NETWORK}'s default is ipvlan, as TKE's)")
    addrs = [d.pod_addresses(i) for i in range(PODS)]
    for i, pod in enumerate(d.pods):
        say()
        say(f"pod {d.pod_names[i]}:")
        run("ip", "-n", pod, "-br", "addr", show=True)
        run("ip", "-n", pod, "rule", show=True)
        for table in _bond_tables(pod):
            run("ip", "-n", pod, "route", "show", "table", table, show=True)
    _check_distinct(d, addrs)
    say()
    say("The node meanwhile: every bond keeps its own address, routes and rules (compared: unchanged)")
    run("ip", "-n", d.node, "-br", "addr", show=True)
    if d.bond_snapshot() != bonds_before:
        raise DemoFailed(
            "the bonds' addresses, routes or rules changed while the pods run (shared mode keeps them)"
        )
    for i, addr in enumerate(addrs):
        for b, ip in addr.items():
            d.wait_for(f"{d.pod_names[i]}'s GID on {b}", partial(_has_gid, d, b, ip))
    d.cni_tool("gids", "--sysfs-root", d.sysfs)
    _gid_indexes(d, addrs, host_index)
    return addrs


def _bond_tables(pod: str) -> list[str]:
    """The routing tables the pod's ``from <address>`` rules point at (one per bond)."""
    rules = json.loads(run("ip", "-n", pod, "-j", "rule").stdout or "[]")
    own = [r for r in rules if r.get("src") and r.get("table") not in ("local", "main", "default")]
    return [str(r["table"]) for r in own]


def _check_distinct(d: SharedDemo, addrs: list[dict[str, str]]) -> None:
    for i, bond in enumerate(d.bonds):
        got = [a.get(bond) for a in addrs]
        if None in got or len(set(got)) != len(got) or bond_ip(i) in got:
            raise DemoFailed(
                f"{bond}: the pods' addresses {got} are not each their own (bond: {bond_ip(i)})"
            )
        subnet = ipaddress.ip_interface(bond_addr(i)[0]).network
        if not all(ipaddress.ip_address(a) in subnet for a in got if a):
            raise DemoFailed(f"{bond}: the pods' addresses {got} are not all in its subnet {subnet}")
    say()
    for i, bond in enumerate(d.bonds):
        owners = ", ".join(f"{d.pod_names[p]} {a[bond]}" for p, a in enumerate(addrs))
        subnet = ipaddress.ip_interface(bond_addr(i)[0]).network
        say(f"-> {bond} ({subnet}): the node {bond_ip(i)}, {owners}")


def _has_gid(d: SharedDemo, bond: str, ip: str) -> bool:
    return sysfs.roce_v2_index(d.sysfs, _hca(d, bond), 1, ip) is not None


def _hca(d: SharedDemo, bond: str) -> str:
    return f"mlx5_bond_{d.bonds.index(bond)}"


def _gid_indexes(d: SharedDemo, addrs: list[dict[str, str]], host_index: int) -> None:
    """Each pod address's own RoCE v2 GID index: rdma-ipvlan's record, the table's, and the
    network-status device-info rdma-multus builds from that record."""
    delegate = d.delegate.read_bytes()
    run_dir = str(d.tmp / "run")
    indexes: dict[str, list[int]] = {}
    for i, addr in enumerate(addrs):
        cid = d.container_id(i)
        info = rdma_device_info(delegate, cid)
        for bond, ip in addr.items():
            rec = records.read_pod_record(run_dir, cid, bond) or {}
            index = rec.get("gidIndex")
            table = sysfs.roce_v2_index(d.sysfs, _hca(d, bond), 1, ip)
            if not isinstance(index, int) or index != table or rec.get("mode") != "shared":
                raise DemoFailed(f"{d.pod_names[i]} {bond}: GID record {rec}, the table says index {table}")
            rdma = (info(bond) or {}).get("rdma", {})
            if rdma.get("gid-index") != index:
                raise DemoFailed(
                    f"{d.pod_names[i]} {bond}: network-status device-info {rdma}, not index {index}"
                )
            indexes.setdefault(bond, []).append(index)
            say(
                f"-> pod {d.pod_names[i]} {bond}: RoCE v2 GID of {ip} at index {index} "
                f'(device-info "rdma": {json.dumps(rdma)})'
            )
    for i, bond in enumerate(d.bonds):
        got = indexes.get(bond, [])
        if len(set(got)) != PODS or host_index in got or gid_index(d, i) != host_index:
            raise DemoFailed(
                f"{bond}: the pods' GID indexes {got} are not each their own (host: {host_index})"
            )
    say(
        f"-> each pod address has a GID index of its own (the node's stays {host_index}): rdma-multus "
        "puts it in the pod's k8s.v1.cni.cncf.io/network-status device-info (rdma.gid-index) when it "
        "has a kubeconfig "
        "(here, without an API server, built by the same code from rdma-ipvlan's GID records); "
        "NCCL >= 2.21 finds it by itself"
    )
