"""Section ``setup``: the product's node layout (bonds over veth "cables", a Soft-RoCE device per bond
named like the product), and the project's sysfs reader cross-checked against the oracle."""

from __future__ import annotations

import importlib.util
import os

from .host import gid_table, ip, netns_mode, read, run, tables, v2_index, wait_for
from .report import BONDS, GID_SLOTS, SYS, R


def build_node() -> None:
    run(["modprobe", "bonding", "max_bonds=0"])  # else the module creates a bond0 of its own
    run(["modprobe", "-a", "veth", "dummy", "macvlan", "rdma_rxe"])
    lines = [
        "link add a0 type veth peer name b0",
        "link add a1 type veth peer name b1",
        "link add d0 type dummy",
        "link add d1 type dummy",
    ]
    for bond, (_dev, slaves, addrs) in BONDS.items():
        lines.append(f"link add {bond} type bond mode active-backup miimon 100")
        lines += [f"link set {s} master {bond}" for s in slaves]
        lines += [f"addr add {a} dev {bond}" for a in addrs]
        lines.append(f"link set {bond} up")
    ip(lines)
    # rxe takes the port's default GID (slot 0) from a netdev with carrier: add it only once the
    # bonds' miimon saw their slaves up (on 7.2, an rxe added earlier was seen without slot 0)
    carrier = wait_for(lambda: all(read(f"{SYS}/class/net/{b}/carrier") == "1" for b in BONDS), 10.0)
    R.fact("seconds until every bond had carrier", carrier)
    batch = "".join(f"link add {dev} type rxe netdev {bond}\n" for bond, (dev, _, _) in BONDS.items())
    run(["rdma", "-b", "-"], stdin=batch)
    R.fact("kernel", os.uname().release)
    R.fact("netns_mode", netns_mode())
    R.fact("gid_tables_initial", tables())
    for bond, (dev, _, addrs) in BONDS.items():
        for a in addrs:
            R.check(f"host {a} on {bond} has a RoCE v2 GID on {dev}", True, v2_index(dev, a) is not None)
    R.check(
        "rxe publishes the IPv4 RoCE v2 GID at index 1 (mlx5: 3)", 1, v2_index("mlx5_bond_0", "198.51.100.10")
    )
    cross_check_project_reader()


def cross_check_project_reader() -> None:
    """The project's sysfs reader must see the same GID tables as this independent one."""
    if importlib.util.find_spec("rdma_cni.rdma.sysfs") is None:
        R.skip("project GID reader matches sysfs", "rdma_cni/rdma/sysfs.py is not present")
        return
    from rdma_cni.rdma import sysfs as project

    for bond, (dev, _, addrs) in BONDS.items():
        port = project.port_for_netdev(SYS, bond)
        R.check(f"project reader: RDMA port of {bond}", (dev, 1), port and (port.device, port.port))
        theirs = [(e.index, e.raw, e.type) for e in project.read_gids(SYS, dev, 1) if e.index < GID_SLOTS]
        ours = [(e["index"], e["gid"], e["type"]) for e in gid_table(dev)]
        R.check(f"project reader: GID table of {dev}", ours, theirs)
        for a in addrs:
            ipv4 = a.split("/")[0]
            R.check(
                f"project reader: RoCE v2 index of {ipv4}",
                v2_index(dev, a),
                project.roce_v2_index(SYS, dev, 1, ipv4),
            )
