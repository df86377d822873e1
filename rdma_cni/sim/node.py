"""A simulated RDMA node: keeps a sysfs tree's GID tables in sync with live addresses.

For kernels without RDMA (this CI): veth ends in a "node" netns stand in for ``bond0..bondN``, a tree
built by :mod:`rdma_cni.sim.tree` stands in for ``/sys``, and this watcher applies the rules of
:mod:`rdma_cni.sim.model` to what really happens on the links — the bonds' own addresses and those of
macvlans on them, also after they moved into pod namespaces under ``pods_dir``.

Ordering is what the GID index depends on, so changes are taken from ONE rtnetlink socket in the node
netns that listens to every netns with an nsid (``NETLINK_LISTEN_ALL_NSID``): the kernel queues the
events in the order they happened, across namespaces. Each pod netns found under ``pods_dir`` gets an
nsid in the node netns for that. Pod namespaces are never held open (a held fd or socket would keep
a deleted netns and its macvlan alive, unlike on a real node); a pod netns whose path disappears is
treated as deleted, as the kernel does a few tens of ms after ``ip netns del``.

A pod netns found after its first changes (the runtime made it and the ADD ran before the next scan)
is read whole: its earlier events were never delivered. Its state is applied at the point of the
stream where it was read, after every event that happened before the read (see :meth:`SimNode._settle`).

Usage (in-process, deterministic: process() after each step)::

    with SimNode(root, [SimBond("bond0", "mlx5_bond_0")], node_netns="/run/netns/h3-node",
                 pods_dir="/run/netns", pods_prefix="h3-pod") as node:
        ...; node.process()

or run by :mod:`rdma_cni.sim.daemon` (a thread, or a process of its own for the demo and the test
cluster); :mod:`rdma_cni.sim.sync` waits for it to catch up.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import select
import socket
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from rdma_cni.net.netns import Netns, NetnsUnavailable, entered, iproute_in, open_netns
from rdma_cni.rdma.sysfs import gid_for_ip
from rdma_cni.sim import devnodes, tree
from rdma_cni.sim.model import RXE_TYPES, Owner, PortTable
from rdma_cni.sim.tree import SimBond

log = logging.getLogger(__name__)

RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV6_IFADDR = 0x100
SOL_NETLINK = 270
NETLINK_LISTEN_ALL_NSID = 8
RTMGRP_NSID = 1 << (28 - 1)  # RTNLGRP_NSID: a peer netns got or lost its id here
RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR, RTM_DELADDR, RTM_DELNSID = 16, 17, 20, 21, 89
NETNSA_NSID = 1
NSID_UNSET = (None, -1, 0xFFFFFFFF)
IFF_UP = 0x1
UPPER_KINDS = frozenset({"macvlan", "macvtap", "vlan", "ipvlan"})


@dataclass
class PodNetns:
    path: str
    inode: int
    nsid: int  # the pod netns's id in the node netns (what the events carry)


def _kind(link: Any) -> str | None:
    info = link.get_attr("IFLA_LINKINFO")
    kind = info.get_attr("IFLA_INFO_KIND") if info is not None else None
    return str(kind) if kind is not None else None


def _address(msg: Any) -> str | None:
    ip = msg.get_attr("IFA_LOCAL") or msg.get_attr("IFA_ADDRESS")
    return str(ip) if ip else None


def _created(msg: Any) -> int:
    """IFA_CACHEINFO's cstamp: when the address was created (hundredths of a second since boot)."""
    info = msg.get_attr("IFA_CACHEINFO")
    return int(info["cstamp"]) if info else 0


class SimNode:
    """The watcher. ``open()`` builds the tree and takes the first snapshot; ``process()`` applies
    every queued kernel event in order and looks for new or deleted pod namespaces."""

    def __init__(
        self,
        sysfs_root: str,
        bonds: Sequence[SimBond],
        node_netns: str | None = None,
        pods_dir: str | None = None,
        pods_prefix: str = "",
        gid_slots: int = tree.RXE_GID_SLOTS,
        gid_types: Sequence[str] = RXE_TYPES,
        netns_mode: str = "shared",
        rdma_cm: bool = False,
        dev_root: str | None = None,
    ) -> None:
        self.root = sysfs_root
        self.rdma_cm = rdma_cm
        self.dev_root = dev_root  # when set: /dev/infiniband nodes made there (sim.devnodes)
        self.bonds = {b.name: b for b in bonds}
        self.node_path = node_netns
        self.pods_dir = pods_dir
        self.pods_prefix = pods_prefix
        self.gid_slots = gid_slots
        self.netns_mode = netns_mode
        self.tables = {b.name: PortTable(b.device, 1, gid_slots, gid_types) for b in bonds}
        self.owners: dict[Owner, tuple[str, str]] = {}  # owner -> (bond, its name in its netns)
        self.up: dict[Owner, bool] = {}  # last seen IFF_UP of each owner
        self.bond_index: dict[int, str] = {}  # ifindex in the node netns -> bond name
        self.pods: dict[int, PodNetns] = {}
        self.errors = 0
        self.node: Netns | None = None
        self.ipr: Any = None
        self.sock: socket.socket | None = None
        self.thread: int | None = None  # the thread that opened it: the only one its netlink client serves

    # --- life cycle -------------------------------------------------------------------------------
    def open(self) -> SimNode:
        self.thread = threading.get_ident()
        self.node = open_netns(self.node_path or "/proc/thread-self/ns/net")  # netns is per thread
        self.ipr = iproute_in(self.node if self.node_path else None)
        with entered(self.node):
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, 0)
        self.sock.bind((0, RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_NSID))
        self.sock.setsockopt(SOL_NETLINK, NETLINK_LISTEN_ALL_NSID, 1)
        self._build()
        self._refresh_links(None, with_addresses=True)
        self.scan_pods()
        return self

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.ipr is not None:
            self.ipr.close()
            self.ipr = None
        if self.node is not None:
            self.node.close()
            self.node = None

    def __enter__(self) -> SimNode:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        """The tree for the bonds as they are in the node netns (their real MACs and ifindexes)."""
        live = {link.get_attr("IFLA_IFNAME"): link for link in self.ipr.get_links()}
        bonds = []
        for b in self.bonds.values():
            link = live.get(b.name)
            if link is not None:
                b = replace(
                    b, mac=link.get_attr("IFLA_ADDRESS"), ifindex=link["index"], mtu=link.get_attr("IFLA_MTU")
                )
            bonds.append(b)
        self.bonds = {b.name: b for b in bonds}
        tree.build_tree(self.root, bonds, self.gid_slots, self.netns_mode, self.rdma_cm)
        if self.dev_root:
            devnodes.make_dev_nodes(self.root, self.dev_root)
        for b in bonds:  # build_tree wrote a default GID for every bond; the model starts empty
            tree.clear_slot(self.root, b.device, 1, 0)

    # --- writing ----------------------------------------------------------------------------------
    def _write(self, bond: str, indexes: Sequence[int]) -> None:
        table = self.tables[bond]
        for i in indexes:
            slot = table.slots[i]
            if slot is None:
                tree.clear_slot(self.root, table.device, table.port, i)
            else:
                name = self.owners.get(slot.owner, ("", ""))[1]
                tree.write_slot(self.root, table.device, table.port, i, slot.gid, name, slot.type)

    # --- links ------------------------------------------------------------------------------------
    def _links(self, nsid: int | None) -> tuple[list[Any], int | None]:
        """Links of a netns and the node's nsid as seen from it (None for the node itself)."""
        if nsid is None:
            return list(self.ipr.get_links()), None
        pod = self.pods[nsid]
        with open_netns(pod.path) as ns:
            assert self.node is not None
            ipr = iproute_in(ns)
            try:
                links = list(ipr.get_links())  # the dump allocates the node's nsid if a link needs it
                seen = ipr.get_netnsid(fd=self.node.fd) or {}
            finally:
                ipr.close()
        node_nsid = seen.get("nsid")
        return links, None if node_nsid in NSID_UNSET else node_nsid

    def _owners_in(
        self, nsid: int | None, links: list[Any], node_nsid: int | None
    ) -> dict[Owner, tuple[str, str]]:
        found: dict[Owner, tuple[str, str]] = {}
        for link in links:
            name, index = link.get_attr("IFLA_IFNAME"), link["index"]
            if nsid is None and name in self.bonds:
                found[Owner(None, index)] = (name, name)
                continue
            lower = self.bond_index.get(link.get_attr("IFLA_LINK") or 0)
            link_nsid = link.get_attr("IFLA_LINK_NETNSID")
            same = link_nsid is None if nsid is None else (node_nsid is not None and link_nsid == node_nsid)
            if lower and same and _kind(link) in UPPER_KINDS:
                found[Owner(nsid, index)] = (lower, name)
        return found

    def _refresh_links(
        self, nsid: int | None, with_addresses: bool = False, event: tuple[int, int] | None = None
    ) -> None:
        """Re-read one netns's links: new uppers, renames, deleted netdevs, bond MAC changes.

        Addresses come from the event stream (its order is the kernel's); only a netns seen for the
        first time is read whole (``with_addresses``), since its earlier events were not delivered.
        A dump may be ahead of the event being applied, so up/down transitions are taken from the
        event itself (``event`` = its ifindex and flags).
        """
        try:
            links, node_nsid = self._links(nsid)
        except (OSError, NetnsUnavailable, NetlinkError) as e:  # the pod netns vanished: the scan drops it
            log.debug("links of nsid %s unreadable: %s", nsid, e)
            return
        if nsid is None:
            self.bond_index = {
                link["index"]: link.get_attr("IFLA_IFNAME")
                for link in links
                if link.get_attr("IFLA_IFNAME") in self.bonds
            }
        found = self._owners_in(nsid, links, node_nsid)
        fresh: list[tuple[Owner, str]] = []
        came_up: list[tuple[Owner, str]] = []
        flags = {link["index"]: link["flags"] for link in links}
        for owner in [o for o in self.owners if o.nsid == nsid and o not in found]:
            self._drop(owner)
        for owner, (bond, name) in found.items():
            old = self.owners.get(owner)
            self.owners[owner] = (bond, name)
            if old is not None and old[1] != name:  # renamed: ndevs/N shows the current name
                self._write(bond, self.tables[bond].indexes_of(owner))
            if old is None and with_addresses:
                fresh.append((owner, bond))
            if event is not None and event[0] == owner.ifindex:
                up = bool(event[1] & IFF_UP)
                if up and not self.up.get(owner, False) and not with_addresses:
                    came_up.append((owner, bond))
                self.up[owner] = up
            elif old is None:
                self.up[owner] = bool(flags.get(owner.ifindex, 0) & IFF_UP) if with_addresses else False
        if nsid is None:  # the default GID follows the bond's MAC; class/net/<bond> its live attrs
            for link in links:
                name = link.get_attr("IFLA_IFNAME")
                if name in self.bonds:
                    tree.update_netdev(
                        self.root,
                        name,
                        {
                            "address": link.get_attr("IFLA_ADDRESS") or "",
                            "operstate": (link.get_attr("IFLA_OPERSTATE") or "unknown").lower(),
                            "mtu": str(link.get_attr("IFLA_MTU")),
                            "ifalias": link.get_attr("IFLA_IFALIAS") or "",
                        },
                    )
                    gid = tree.default_gid(link.get_attr("IFLA_ADDRESS"))
                    self._write(name, self.tables[name].set_default(gid, Owner(None, link["index"])))
        # After the default GID, so the bond's own link-local is not doubled; a netns read whole is
        # first settled against deletions that happened before the read but are still queued.
        reads = [(owner, bond, self._read_addresses(owner)) for owner, bond in fresh]
        if reads and self._pending():
            self._settle({bond for _, bond, _ in reads}, {owner for owner, _, _ in reads})
        for owner, bond, ips in reads:
            for ip in ips:
                self._write(bond, self.tables[bond].add(gid_for_ip(ip), owner))
        for owner, bond in came_up:
            # The kernel adds the link-local (tentative) inside the `ip link set up` call and the RoCE
            # core takes its GID right then; its RTM_NEWADDR only follows after DAD, a second later.
            self._add_existing(owner, bond, only_link_local=True)

    def _addresses(self, owner: Owner) -> list[str]:
        if owner.nsid is None:
            addrs = list(self.ipr.get_addr(index=owner.ifindex))
        else:
            with open_netns(self.pods[owner.nsid].path) as ns:
                ipr = iproute_in(ns)
                try:
                    addrs = list(ipr.get_addr(index=owner.ifindex))
                finally:
                    ipr.close()
        # In the order they appeared, as the kernel gave them slots: by creation stamp (hundredths
        # since boot); within one hundredth as the kernel dumps them, IPv4 in insertion order and
        # IPv6 newest first (a new one goes before those of its scope), so that part is reversed.
        v4 = [m for m in addrs if ":" not in (_address(m) or "")]
        v6 = [m for m in addrs if ":" in (_address(m) or "")]
        return [ip for ip in map(_address, sorted(v4 + v6[::-1], key=_created)) if ip]

    def _read_addresses(self, owner: Owner) -> list[str]:
        try:
            return self._addresses(owner)
        except (OSError, NetnsUnavailable, NetlinkError) as e:  # its netns is being deleted: scan drops it
            log.debug("addresses of %s unreadable: %s", owner, e)
            return []

    def _add_existing(self, owner: Owner, bond: str, only_link_local: bool = False) -> None:
        for ip in self._read_addresses(owner):  # in the order they appeared (_addresses)
            if not only_link_local or ipaddress.ip_address(ip).is_link_local:
                self._write(bond, self.tables[bond].add(gid_for_ip(ip), owner))

    def _pending(self) -> bool:
        """True when events wait in the socket (a read made now may be ahead of them)."""
        assert self.sock is not None
        try:
            self.sock.recv(16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:  # ENOBUFS: events were lost; settle rather than trust the queue
            return True
        return True

    def _settle(self, bonds: set[str], fresh: set[Owner]) -> None:
        """Before a netns read whole is added: drop every entry on ``bonds`` whose owner (other than
        the ``fresh`` ones being read) no longer holds its address; its RTM_DELADDR (or RTM_DELLINK)
        is still queued and becomes a no-op (:meth:`PortTable.remove` of an absent entry).

        Why: the netns's own earlier events were never delivered, so where its addresses belong in
        the stream is unknown. The node applies them where the read was taken — after every event
        that happened before it, before every later one. That is what the kernel holds for the
        product's order (the bond's address deleted, then added to the pod interface: the pod's GID
        takes the freed slot, 2/3 on mlx5) and for any order in which the pod's addresses came last.
        No reading can be right for an order whose events were lost — the pod's address added
        *before* the bond's deletion (V3), found late, got the next slot on the kernel and gets the
        freed one here — and the old behaviour was not right for it either, only by chance.

        Two parts, because neither suffices alone: the scan drains the queue before reading a new
        netns (exact, in order, for everything queued by then, additions too); events that happen
        between that drain and the read stay queued behind it, and a deletion among them would
        leave its entry holding the slot the read's address must take — the chaos runs' bond IP GID
        at 4/5 instead of 2/3. Those deletions are found by liveness, checked *after* the read: a
        deletion between the read and the check is applied early, which only differs from the
        kernel for the add-before-delete orders above. Additions in that window keep their queued
        place, after the read (a concurrent address add on the same bond in a few ms; not settled).
        """
        for owner, (bond, _) in list(self.owners.items()):
            if bond not in bonds or owner in fresh:
                continue
            table = self.tables[bond]
            held = {s.gid for _, s in table.entries() if s.owner == owner and not s.default}
            if not held:
                continue
            try:
                live = {gid_for_ip(ip) for ip in self._addresses(owner)}
            except (OSError, NetnsUnavailable, NetlinkError) as e:  # its netns is dying: its events drop it
                log.debug("addresses of %s unreadable: %s", owner, e)
                continue
            for gid in held - live:
                self._write(bond, table.remove(gid, owner))

    def _drop(self, owner: Owner) -> None:
        bond, _ = self.owners.pop(owner)
        self.up.pop(owner, None)
        self._write(bond, self.tables[bond].drop_owner(owner))

    # --- pod namespaces ---------------------------------------------------------------------------
    def _nsid_of(self, ns: Netns) -> int | None:
        got = self.ipr.get_netnsid(fd=ns.fd) or {}
        if got.get("nsid") in NSID_UNSET:
            self.ipr.set_netnsid(fd=ns.fd)
            got = self.ipr.get_netnsid(fd=ns.fd) or {}
        nsid = got.get("nsid")
        return None if nsid in NSID_UNSET else int(nsid)

    def scan_pods(self) -> None:
        """Find new pod namespaces (read them whole) and forget deleted ones (drop their GIDs).

        In the order a kernel would have seen it: deleted ones are forgotten first (their paths were
        gone before the new ones were read), then the new ones get their nsid, the queue is drained
        (every event that happened before the reads, in order; a new netns's own events are skipped,
        the read shows them) and only then are they read (:meth:`_settle`). A known pod netns that
        cannot be opened for a moment (EMFILE, ENOMEM) but whose path still is that netns is kept:
        forgetting it would drop its GIDs and read it whole again later, at other slots.
        """
        if not self.pods_dir:
            return
        try:
            names = [n for n in os.listdir(self.pods_dir) if n.startswith(self.pods_prefix)]
        except FileNotFoundError:
            names = []
        assert self.node is not None
        live: dict[str, int] = {}
        new: list[str] = []
        for name in names:
            path = os.path.join(self.pods_dir, name)
            try:
                with open_netns(path) as ns:
                    if ns.inode == self.node.inode:
                        continue
                    live[path] = ns.inode
            except (OSError, NetnsUnavailable) as e:  # being created/removed: next scan
                inode = self._known_inode(path)
                if inode is not None:
                    live[path] = inode
                log.debug("pod netns %s not usable%s: %s", path, " now (kept)" if inode else " yet", e)
                continue
            if not any(p.path == path and p.inode == live[path] for p in self.pods.values()):
                new.append(path)
        for nsid, pod in list(self.pods.items()):
            if live.get(pod.path) != pod.inode:  # path gone (or reused): the netns is being deleted
                self._forget_pod(nsid)
        found: list[PodNetns] = []
        for path in new:
            try:
                with open_netns(path) as ns:
                    if ns.inode != live[path]:
                        continue  # replaced since: the next scan
                    got = self._nsid_of(ns)
            except (OSError, NetnsUnavailable, NetlinkError) as e:  # being created/removed: next scan
                log.debug("pod netns %s not usable yet: %s", path, e)
                continue
            if got is not None:
                found.append(PodNetns(path, live[path], got))
        if not found:
            return
        self._drain()  # after the nsids: the new netns's events from here on are in the queue
        for pod in found:
            self.pods[pod.nsid] = pod
            self._refresh_links(pod.nsid, with_addresses=True)

    def _known_inode(self, path: str) -> int | None:
        """The inode of a known pod netns still mounted at ``path`` (None when gone or replaced)."""
        try:
            inode = os.stat(path).st_ino
        except OSError:
            return None
        return inode if any(p.path == path and p.inode == inode for p in self.pods.values()) else None

    # --- events -----------------------------------------------------------------------------------
    def _recv(self) -> Iterator[tuple[int | None, bytes]]:
        assert self.sock is not None
        while True:
            try:
                data, anc, _flags, _addr = self.sock.recvmsg(1 << 16, socket.CMSG_SPACE(4))
            except BlockingIOError:
                return
            nsid = None
            for level, ctype, cdata in anc:
                if level == SOL_NETLINK and ctype == NETLINK_LISTEN_ALL_NSID:
                    nsid = struct.unpack("=i", cdata[:4])[0]
            off = 0
            while off + 16 <= len(data):
                length = struct.unpack_from("=I", data, off)[0]
                if length < 16:
                    break
                yield nsid, data[off : off + length]
                off += (length + 3) & ~3

    def _apply(self, nsid: int | None, msg: bytes) -> None:
        mtype = struct.unpack_from("=H", msg, 4)[0]
        if mtype == RTM_DELNSID and nsid is None:
            self._netns_died(msg)
            return
        if nsid is not None and nsid not in self.pods:
            # A netns not read yet (or forgotten): the scan after this drain reads it whole, and the
            # read shows this event. Not read here: the events queued behind this one happened before
            # such a read and would be applied after it (a bond's DELADDR after the pod's address).
            return
        if mtype in (RTM_NEWLINK, RTM_DELLINK):
            index, flags = struct.unpack_from("=iI", msg, 20)  # ifinfomsg: family, pad, type | index, flags
            self._refresh_links(nsid, event=(index, flags))
        elif mtype in (RTM_NEWADDR, RTM_DELADDR):
            from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

            parsed = ifaddrmsg(msg)
            parsed.decode()
            owner = Owner(nsid, parsed["index"])
            ip = _address(parsed)
            if owner not in self.owners or not ip:
                return
            bond = self.owners[owner][0]
            table = self.tables[bond]
            gid = gid_for_ip(ip)
            self._write(bond, table.add(gid, owner) if mtype == RTM_NEWADDR else table.remove(gid, owner))

    def _netns_died(self, msg: bytes) -> None:
        """RTM_DELNSID: the kernel started tearing a pod netns down (its nsid is dropped first, its
        netdevs and their GIDs follow a few ms later). Drop its GIDs at this point of the stream."""
        off = 16 + 4  # nlmsghdr + rtgenmsg (padded)
        while off + 4 <= len(msg):
            length, atype = struct.unpack_from("=HH", msg, off)
            if length < 4:
                return
            if atype == NETNSA_NSID and length >= 8:
                self._forget_pod(struct.unpack_from("=i", msg, off + 4)[0])
            off += (length + 3) & ~3

    def _forget_pod(self, nsid: int) -> None:
        for owner in [o for o in self.owners if o.nsid == nsid]:
            self._drop(owner)
        self.pods.pop(nsid, None)

    def process(self, timeout: float = 0.0) -> None:
        """Wait up to ``timeout`` s for events, apply all queued ones in order, then scan pods.

        Only in the thread that opened the node: pyroute2's sync client keeps its socket per thread,
        and from another thread it would silently open a new one in *that* thread's netns (the
        host's), find no bonds there and empty every GID table at the next link event.
        """
        assert self.sock is not None
        self._check_thread()
        if timeout > 0:
            select.select([self.sock], [], [], timeout)
        self._drain()
        self.scan_pods()

    def _drain(self) -> None:
        for nsid, msg in self._recv():
            self._apply(nsid, msg)

    def _check_thread(self) -> None:
        if self.thread != threading.get_ident():
            raise RuntimeError(
                "the simulated RDMA node is used from a thread that did not open it; "
                "open it in the thread that serves it (see running())"
            )

    def serve(self, stop: threading.Event, interval: float = 0.02) -> None:
        """Process until ``stop``. A failure is logged with its traceback and counted in ``errors``
        (tests assert it stays 0) rather than ending the node under a running test; being in the
        wrong thread is raised at once (every round would fail the same way)."""
        self._check_thread()
        while not stop.is_set():
            try:
                self.process(interval)
            except Exception:
                self.errors += 1
                log.exception("simulated RDMA node: event processing failed")
