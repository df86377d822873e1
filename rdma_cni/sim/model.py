"""The kernel's RoCE GID table rules, as observed on a real kernel (``shared/lab/vm/FINDINGS.md``).

A model, not the kernel — H4's VM test compares it with the real thing (:func:`table_snapshot` gives
both sides in the same form). Rules:

* Slot 0 (slots 0..k-1 with k GID types, e.g. RoCE v1 + v2 on mlx5) is reserved for the port's
  *default GID*: ``fe80::`` + the EUI-64 of the port netdev's MAC. Nothing else ever takes it.
* Every address on the port netdev, or on an upper device of it (a macvlan/vlan on the bond) in *any*
  netns, gets one entry per GID type (rxe: RoCE v2 only) — IPv4 as ``::ffff:a.b.c.d``.
* A new entry takes the **lowest free slot at the moment the address appears**, also while the link
  is down. The IPv6 link-local appears when the link comes up (unless ``addrgenmode none``) and takes
  a slot like any other address.
* The same GID on two netdevs is two entries (host + pod during a move: ``[1] bond0``, ``[2] net1``);
  an address equal to the default GID of the same netdev is not added twice.
* An entry goes when its address goes, or when its netdev goes (netns deleted).
* ``ndevs/N`` shows the netdev's current name inside its own netns.

Usage::

    table = PortTable("mlx5_bond_0", 1, size=1024)
    table.set_default(default_gid(mac), Owner(None, 7))
    table.add(gid_for_ip("198.51.100.2"), Owner(None, 7))   # -> [1]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rdma_cni.rdma import sysfs
from rdma_cni.rdma.sysfs import ROCE_V1, ROCE_V2


@dataclass(frozen=True)
class Owner:
    """A netdev that holds addresses: its netns (None = the node's, else the nsid seen from the node)
    and its ifindex there."""

    nsid: int | None
    ifindex: int


@dataclass(frozen=True)
class Slot:
    gid: bytes
    type: str
    owner: Owner
    default: bool = False


RXE_TYPES: tuple[str, ...] = (ROCE_V2,)
MLX5_TYPES: tuple[str, ...] = (ROCE_V1, ROCE_V2)


class PortTable:
    """One port's GID table. Every mutator returns the indexes it changed (to be written to sysfs)."""

    def __init__(
        self, device: str, port: int = 1, size: int = 1024, gid_types: Sequence[str] = RXE_TYPES
    ) -> None:
        self.device = device
        self.port = port
        self.gid_types = tuple(gid_types)
        self.slots: list[Slot | None] = [None] * size

    def _find(self, gid: bytes, gtype: str, owner: Owner, default: bool | None = None) -> int | None:
        for i, s in enumerate(self.slots):
            if s and s.gid == gid and s.type == gtype and s.owner == owner:
                if default is None or s.default == default:
                    return i
        return None

    def set_default(self, gid: bytes, owner: Owner) -> list[int]:
        changed = []
        for i, gtype in enumerate(self.gid_types):
            slot = Slot(gid, gtype, owner, default=True)
            if self.slots[i] != slot:
                self.slots[i] = slot
                changed.append(i)
        return changed

    def add(self, gid: bytes, owner: Owner) -> list[int]:
        changed = []
        for gtype in self.gid_types:
            if self._find(gid, gtype, owner) is not None:
                continue  # already there (or it is this netdev's default GID)
            free = next(
                (i for i in range(len(self.gid_types), len(self.slots)) if self.slots[i] is None), None
            )
            if free is None:
                continue  # table full: the kernel logs and drops the GID
            self.slots[free] = Slot(gid, gtype, owner)
            changed.append(free)
        return changed

    def remove(self, gid: bytes, owner: Owner) -> list[int]:
        changed = []
        for gtype in self.gid_types:
            i = self._find(gid, gtype, owner, default=False)
            if i is not None:
                self.slots[i] = None
                changed.append(i)
        return changed

    def drop_owner(self, owner: Owner) -> list[int]:
        changed = []
        for i, s in enumerate(self.slots):
            if s and s.owner == owner:
                self.slots[i] = None
                changed.append(i)
        return changed

    def indexes_of(self, owner: Owner) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s and s.owner == owner]

    def entries(self) -> list[tuple[int, Slot]]:
        return [(i, s) for i, s in enumerate(self.slots) if s]


def table_snapshot(sysfs_root: str, devices: Sequence[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """``{"mlx5_bond_0/1": [{"index", "gid", "type", "ndev"}, ...]}`` read from sysfs — the same form
    for the real kernel and for this model, so the two can be compared with ``==``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for p in sysfs.list_ports(sysfs_root):
        if devices is not None and p.device not in devices:
            continue
        out[f"{p.device}/{p.port}"] = [
            {"index": e.index, "gid": e.gid, "type": e.type, "ndev": e.ndev}
            for e in sysfs.read_gids(sysfs_root, p.device, p.port)
        ]
    return out


def _kind(gid: str) -> str:
    addr = ipaddress.IPv6Address(gid)
    if addr.ipv4_mapped is not None:
        return f"ipv4 {addr.ipv4_mapped}"
    return "ipv6 link-local" if addr.is_link_local else f"ipv6 {addr.compressed}"


def comparable(snapshot: dict[str, list[dict[str, Any]]]) -> dict[str, list[tuple[int, str, str, str]]]:
    """A snapshot without what differs between machines (link-local GIDs come from random MACs):
    ``(index, "ipv4 198.51.100.10" | "ipv6 link-local" | "ipv6 <addr>", type, ndev)`` per entry."""
    return {
        port: [(e["index"], _kind(e["gid"]), e["type"], e["ndev"]) for e in rows]
        for port, rows in snapshot.items()
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rdma_cni.sim.model --sysfs-root /sys [--comparable]``: the GID tables as JSON."""
    p = argparse.ArgumentParser(
        prog="python -m rdma_cni.sim.model", description="dump RoCE GID tables as JSON"
    )
    p.add_argument("--sysfs-root", default="/sys")
    p.add_argument("--comparable", action="store_true", help="drop machine-specific link-local values")
    p.add_argument("devices", nargs="*")
    a = p.parse_args(argv)
    snap = table_snapshot(a.sysfs_root, a.devices or None)
    json.dump(comparable(snap) if a.comparable else snap, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
