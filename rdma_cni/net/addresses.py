"""A bond's IP addresses: snapshot, remove, add to another link, restore — in an order that round-trips.

Ordering facts this module is built on (kernel ``__inet_insert_ifa`` / ``ipv6_link_dev_addr``):
- IPv4 lists primaries first, then secondaries, each in insertion order; deleting a primary also
  deletes its secondaries unless ``promote_secondaries`` is set (lab/vm FINDINGS Q3).
- IPv6 puts a new address *before* existing ones of the same scope.
So a snapshot is kept in **add order** (IPv4 in dump order, IPv6 reversed): adding in that order
reproduces the dump, and removing in the reverse order never deletes or promotes a secondary behind
our back and always leaves a prefix of the list — a crash between two deletions is repaired by
re-adding whatever suffix is missing.

Addresses moved: every IPv4 address, and every IPv6 one of global (or site) scope that was
configured rather than made by the kernel; the link-local, SLAAC and privacy addresses belong to the
bond's own MAC and stay. The kernel says which ones it made: ``IFA_PROTO`` (``kernel_ra``,
``kernel_ll``, ``kernel_lo``, since 6.3) and the ``temporary``/``stable-privacy`` flags. Before 6.3
a SLAAC address looks like a configured one with finite lifetimes, so there only permanent (forever)
IPv6 addresses move.

Lifetimes: an address that is not forever keeps its deadlines (:mod:`rdma_cni.net.lifetimes`). The
snapshot stores them on the kernel's address clock (``validUntil``/``preferredUntil``, hundredths
since boot, with the boot's ID) beside the remaining lifetimes and the wall-clock time they were read
(what records of older versions hold, and what is left to go by after a reboot); every later add
(into the pod, back onto the bond) passes the whole seconds nearest to what is left, so the address
expires when it would have on the bond. One whose valid lifetime ran out meanwhile is not put back
(it would have expired on the bond too).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from rdma_cni.net import lifetimes, rtnl
from rdma_cni.net.nlsock import RtnlSocket
from rdma_cni.net.rtnl import Record, attr

log = logging.getLogger("rdma_cni.addresses")

IFA_F_SECONDARY = 0x01  # IPv4; the same bit is IFA_F_TEMPORARY (a privacy address) for IPv6
IFA_F_TEMPORARY = 0x01
IFA_F_NODAD = 0x02
IFA_F_DADFAILED = 0x08
IFA_F_DEPRECATED = 0x20
IFA_F_TENTATIVE = 0x40
IFA_F_PERMANENT = 0x80
IFA_F_STABLE_PRIVACY = 0x800
IFAPROT_KERNEL = (1, 2, 3)  # IFA_PROTO: kernel_lo, kernel_ra (SLAAC), kernel_ll
FOREVER = 0xFFFFFFFF
_KERNEL_FLAGS = IFA_F_SECONDARY | IFA_F_DADFAILED | IFA_F_DEPRECATED | IFA_F_TENTATIVE | IFA_F_PERMANENT
RT_SCOPE_LINK = 253
RT_SCOPE_HOST = 254
_DUMP_TRIES = 3
_REDUMP_AFTER = 0.05  # s: past the whole second a deadline fell on (2 * SLACK and the dump's time)
_NOTE_AGREES = 60  # hundredths: an add lands within half a second of the deadline it was given


def cidr(rec: Record) -> str:
    return f"{attr(rec, 'IFA_ADDRESS')}/{rec['prefixlen']}"


def ip_of(rec: Record) -> str:
    return str(attr(rec, "IFA_LOCAL") or attr(rec, "IFA_ADDRESS"))


def _flags(rec: Record) -> int:
    return int(attr(rec, "IFA_FLAGS", rec.get("flags", 0)))


def is_ipv6(rec: Record) -> bool:
    return bool(rec["family"] == socket.AF_INET6)


def _movable(rec: Record) -> bool:
    return movable(rec["family"], rec["scope"], _flags(rec), int(attr(rec, "IFA_PROTO", 0) or 0))


def _kernel_marks_slaac(release: str | None = None) -> bool:
    """IFA_PROTO (kernel 6.3+) tells SLAAC addresses from configured ones with finite lifetimes."""
    parts = (release or os.uname().release).split(".")
    try:
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (6, 3)
    except (IndexError, ValueError):
        return False


def movable(family: int, scope: int, flags: int, proto: int = 0) -> bool:
    """An address ADD moves into the pod (module doc): every IPv4, configured global IPv6."""
    if family == socket.AF_INET:
        return True
    if family != socket.AF_INET6 or scope in (RT_SCOPE_LINK, RT_SCOPE_HOST) or proto in IFAPROT_KERNEL:
        return False
    if flags & (IFA_F_TEMPORARY | IFA_F_STABLE_PRIVACY):
        return False
    return bool(flags & IFA_F_PERMANENT) or _kernel_marks_slaac()


def holds_movable(ipr: RtnlSocket, index: int) -> bool:
    """Whether the link has an address ADD would move (STATUS: without decoding any record)."""
    return any(movable(*kind) for kind in ipr.addr_kinds(index))


def _with_lifetimes(full: Record, rec: Record, now: float, dumped: tuple[float, float]) -> bool:
    """Keep a finite lifetime (rtnl records drop IFA_CACHEINFO: its timestamps never replay).
    False when its deadlines are not exact (the dump fell on a whole second of its age)."""
    info = attr(full, "IFA_CACHEINFO")
    if not lifetimes.finite(info):
        return True
    until = lifetimes.from_cacheinfo(info, dumped)
    rec["lifetimes"] = {"valid": info["ifa_valid"], "preferred": info["ifa_preferred"], "at": now,
                        "tstamp": int(info["tstamp"]), "validUntil": until.valid,
                        "preferredUntil": until.preferred, "boot": lifetimes.boot_id()}
    return until.exact


def _dumped(ipr: RtnlSocket, index: int = 0) -> tuple[list[Record], tuple[float, float]]:
    before = time.monotonic()
    fulls = ipr.addr_dump(index=index)
    return fulls, (before, time.monotonic())


def _settled(dump: Callable[[], tuple[list[Record], tuple[float, float]]]) -> list[Record]:
    """The dump's movable addresses in add order; dumped again a moment later (rarely, and only
    with finite lifetimes) while one's deadline is not exact, so none is a second off."""
    for attempt in range(_DUMP_TRIES):
        fulls, dumped = dump()
        recs, exact = _in_add_order(fulls, dumped)
        if exact or attempt == _DUMP_TRIES - 1:
            return recs
        time.sleep(_REDUMP_AFTER)
    raise AssertionError("unreachable")


def snapshot(ipr: RtnlSocket, index: int) -> list[Record]:
    """The link's movable addresses, in add order (see module doc)."""
    return _settled(lambda: _dumped(ipr, index))


def snapshots(ipr: RtnlSocket, indexes: Iterable[int]) -> dict[int, list[Record]]:
    """:func:`snapshot` of several links from one dump (an 8-bond ADD dumped the node's addresses
    once per bond)."""
    wanted = set(indexes)

    def dump() -> tuple[list[Record], tuple[float, float]]:
        fulls, dumped = _dumped(ipr)
        return [m for m in fulls if m["index"] in wanted], dumped

    by_link: dict[int, list[Record]] = {index: [] for index in wanted}
    for rec in _settled(dump):
        by_link[rec["index"]].append(rec)
    return by_link


def _in_add_order(fulls: list[Record], dumped: tuple[float, float]) -> tuple[list[Record], bool]:
    now = time.time()
    recs, exact = [], True
    for m in fulls:
        rec = rtnl.record("addr", m)
        exact = _with_lifetimes(m, rec, now, dumped) and exact
        recs.append(rec)
    recs = [r for r in recs if _movable(r)]
    v4 = [r for r in recs if r["family"] == socket.AF_INET]
    v6 = [r for r in recs if r["family"] == socket.AF_INET6]
    return v4 + list(reversed(v6)), exact


def _on_this_boot(life: dict[str, Any]) -> bool:
    return "validUntil" in life and life.get("boot") == lifetimes.boot_id()


def remaining(rec: Record, now: float | None = None) -> tuple[int, int] | None:
    """(valid, preferred) seconds left of a finite lifetime; None when forever. Valid <= 0: expired.
    ``now``: wall-clock time, for a record of an older version or another boot (no deadlines)."""
    life = rec.get("lifetimes")
    if not life:
        return None
    if _on_this_boot(life):
        kernel = lifetimes.kernel_now()
        valid = lifetimes.seconds_left(int(life["validUntil"]), kernel)
        return valid, max(0, min(valid, lifetimes.seconds_left(int(life["preferredUntil"]), kernel)))
    # The kernel shows whole seconds rounded up (valid - floor(age)): taking whole seconds spent
    # rounded up too keeps the deadline unbiased over many moves instead of creeping later.
    spent = math.ceil(max(0.0, (time.time() if now is None else now) - float(life["at"])))
    valid = int(life["valid"]) - spent
    return valid, max(0, min(valid, int(life["preferred"]) - spent))


def has_deadlines(addrs: Iterable[Record]) -> bool:
    return any(a.get("lifetimes") for a in addrs)


def carry_deadlines(addrs: list[Record], notes: dict[str, Any]) -> int:
    """Where the bond holds an address as a give-back left it (the same ``tstamp``, this boot), take
    the deadlines noted then: the first ones, not the ones that add rounded to (module doc of
    :mod:`rdma_cni.net.lifetimes`). Returns how many were carried."""
    if notes.get("boot") != lifetimes.boot_id():
        return 0
    carried = 0
    for rec in addrs:
        life, note = rec.get("lifetimes"), notes.get("addresses", {}).get(cidr(rec))
        if not life or not note or not _on_this_boot(life) or note.get("tstamp") != life["tstamp"]:
            continue
        if abs(int(note["validUntil"]) - int(life["validUntil"])) > _NOTE_AGREES:
            continue  # not the lifetime a give-back set (cannot be without a new tstamp; kept safe)
        life["validUntil"], life["preferredUntil"] = int(note["validUntil"]), int(note["preferredUntil"])
        carried += 1
    return carried


def deadline_notes(ipr: RtnlSocket, index: int, addrs: list[Record]) -> dict[str, Any]:
    """After a give-back: each recorded finite address the link holds with the lifetime the record
    gave it, by its ``tstamp``, with the record's deadlines (what :func:`carry_deadlines` reads)."""
    held = {cidr(r): r for r in _settled(lambda: _dumped(ipr, index))}
    out: dict[str, Any] = {}
    for rec in addrs:
        life, live = rec.get("lifetimes"), held.get(cidr(rec), {}).get("lifetimes")
        if not life or not live or not _on_this_boot(life) or not _on_this_boot(live):
            continue
        if abs(int(live["validUntil"]) - int(life["validUntil"])) <= _NOTE_AGREES:
            out[cidr(rec)] = {"tstamp": live["tstamp"], "validUntil": life["validUntil"],
                              "preferredUntil": life["preferredUntil"]}
    return {"boot": lifetimes.boot_id(), "addresses": out}


def in_gid_order(addrs: list[Record], gid_index: Callable[[Record], int | None]) -> list[Record]:
    """The add order with the two families interleaved so that, at each step, the family whose next
    address had the lower GID index on the host goes first (unknown: after known; equal: IPv4).
    Each family keeps its own order (IPv4 primaries first; IPv6 as the dump). The RoCE core gives
    a new address the lowest free GID slot, so this puts both families back on the host's slots
    whichever appeared first at boot."""
    v4 = [a for a in addrs if not is_ipv6(a)]
    v6 = [a for a in addrs if is_ipv6(a)]
    out: list[Record] = []
    while v4 and v6:
        k4, k6 = gid_index(v4[0]), gid_index(v6[0])
        six_first = k6 is not None and (k4 is None or k6 < k4)
        out.append((v6 if six_first else v4).pop(0))
    return out + v4 + v6


def live_cidrs(ipr: RtnlSocket, index: int) -> list[str]:
    return [cidr(rtnl.record("addr", m)) for m in ipr.addr_dump(index=index)]


def _for_link(rec: Record, index: int, label: str | None, extra_flags: int) -> Record:
    flags = (_flags(rec) & ~_KERNEL_FLAGS) | extra_flags
    out: Record = {k: v for k, v in rec.items() if k not in ("attrs", "lifetimes")}
    out["index"] = index
    out["flags"] = flags & 0xFF
    attrs = [a for a in rec["attrs"] if a[0] not in ("IFA_FLAGS", "IFA_LABEL", "IFA_CACHEINFO")]
    attrs.append(["IFA_FLAGS", flags])
    if label and rec["family"] == socket.AF_INET:
        attrs.append(["IFA_LABEL", label])
    left = remaining(rec)
    if left is not None:
        attrs.append(["IFA_CACHEINFO", {"ifa_preferred": left[1], "ifa_valid": max(1, left[0]),
                                        "cstamp": 0, "tstamp": 0}])
    out["attrs"] = attrs
    return out


def _expired(rec: Record) -> bool:
    left = remaining(rec)
    return left is not None and left[0] <= 0


def remove(ipr: RtnlSocket, index: int, addrs: list[Record]) -> None:
    """Delete from the link in reverse add order (secondaries before their primary)."""
    for rec in reversed(addrs):
        rtnl.delete(ipr, "addr", _for_link(rec, index, None, 0))


def pod_label(label: str, bond: str, pod_ifname: str) -> str:
    """``bond0:1`` on the bond becomes ``<pod>:1`` in the pod (a label must start with its link name)."""
    suffix = label[len(bond) :] if label.startswith(bond) else ""
    candidate = pod_ifname + suffix
    return candidate if len(candidate) <= 15 else pod_ifname


def add_to_pod(ipr: RtnlSocket, index: int, addrs: list[Record], bond: str, pod_ifname: str) -> None:
    """Add in add order (primary first). IPv6 gets NODAD: the address was just in use on this node."""
    for rec in addrs:
        label = pod_label(str(attr(rec, "IFA_LABEL") or bond), bond, pod_ifname)
        extra = IFA_F_NODAD if is_ipv6(rec) else 0
        rtnl.create(ipr, "addr", _for_link(rec, index, label, extra))


def restore(ipr: RtnlSocket, index: int, addrs: list[Record]) -> int:
    """Put back every recorded address that is missing, in add order; returns how many were added."""
    present = set(live_cidrs(ipr, index))
    added = 0
    for rec in addrs:
        if cidr(rec) in present:
            continue
        if _expired(rec):
            log.info("%s: its valid lifetime ran out while the pod held it; not put back", cidr(rec))
            continue
        label = attr(rec, "IFA_LABEL")
        if rtnl.create(ipr, "addr", _for_link(rec, index, str(label) if label else None, 0)):
            added += 1
    return added


def address_record(index: int, ip: str, plen: int) -> Record:
    """A plain address for ``index`` (what IPAM hands out); IPv6 without DAD, like a moved one."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    flags = IFA_F_NODAD if family == socket.AF_INET6 else 0
    return {"family": family, "prefixlen": plen, "flags": flags, "scope": 0, "index": index,
            "attrs": [["IFA_LOCAL", ip], ["IFA_ADDRESS", ip], ["IFA_FLAGS", flags]]}


def network_of(rec: Record) -> str:
    return str(ipaddress.ip_interface(f"{ip_of(rec)}/{rec['prefixlen']}").network)
