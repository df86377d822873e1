"""A synchronous rtnetlink socket on the standard library: send one request, read its answer.

Why not pyroute2's ``IPRoute`` here: its synchronous API runs an asyncio loop per request and builds
every message through its request filters, ~0.5-1 ms of Python per request and ~1 ms to open one,
against tens of microseconds of kernel work. An ADD makes about fifteen requests in two netns, so
that machinery was most of the plugin's own time. Link messages are few and small and are encoded
here with ``struct``; address, route and rule messages go through :func:`rdma_cni.net.rtnl.encode` /
:func:`~rdma_cni.net.rtnl.decode` (by ``struct`` too, pyroute2's classes for the rare rest), so the
records kept in state stay exactly what the kernel reported, and a replay sends back every attribute
it had.

The socket is opened in the netns of the calling thread and stays bound to it (see
:func:`rdma_cni.net.netns.netlink_in`). Errors are :class:`NetlinkError` (an ``OSError`` with the
kernel's errno, plus the kernel's extended-ack text when it sent one).
"""

from __future__ import annotations

import errno as errnos
import os
import socket
import struct
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from rdma_cni.net import rtnl
from rdma_cni.net.rtnl import Record

SOL_NETLINK = 270
NETLINK_CAP_ACK = 10  # errors do not echo the request back (less to read)
NETLINK_EXT_ACK = 11  # the kernel says *why* a request failed

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP_INTR = 0x10  # on a dump part: the table changed while it was read
NLM_F_DUMP = 0x300
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLM_F_CAPPED = 0x100  # on an NLMSG_ERROR: only the request's header is echoed
NLM_F_ACK_TLVS = 0x200  # on an NLMSG_ERROR: extended-ack attributes follow
NLA_F_NESTED = 0x8000

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSGERR_ATTR_MSG = 1

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_SETLINK = 16, 17, 18, 19
RTM_GETADDR = 22
RTM_GETROUTE = 26
RTM_GETRULE = 34

IFA_FLAGS = 8
IFA_PROTO = 11
IFLA_ADDRESS = 1
IFLA_IFNAME = 3
IFLA_MTU = 4
IFLA_LINK = 5
IFLA_LINKINFO = 18
IFLA_AF_SPEC = 26
IFLA_GROUP = 27
IFLA_NET_NS_FD = 28
IFLA_INFO_KIND = 1
IFLA_INFO_DATA = 2
IFLA_MACVLAN_MODE = 1
IFLA_INET6_ADDR_GEN_MODE = 8
IFLA_INET_CONF = 1
IPV4_DEVCONF_ARP_NOTIFY = 22
IPV4_DEVCONF_ARP_ANNOUNCE = 18
IPV4_DEVCONF_ARP_IGNORE = 19
IFF_UP = 0x1
IFF_LOOPBACK = 0x8
MACVLAN_MODE = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8}
IFLA_IPVLAN_MODE = 1
IPVLAN_MODE = {"l2": 0, "l3": 1, "l3s": 2}

_NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_NLA = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_MSG_TRUNC = int(socket.MSG_TRUNC)  # a plain int: socket's is an IntFlag, whose & runs Python code
DUMP_ATTEMPTS = 5
_RECV_BUFFER = 65536  # the kernel never puts more than 32 KiB into one dump datagram


class NetlinkError(OSError):
    """A request the kernel refused. ``code`` is the errno, as on pyroute2's NetlinkError, so
    callers can test either; ``str()`` carries the kernel's own reason when it gave one."""

    def __init__(self, code: int, reason: str = "") -> None:
        text = os.strerror(code) + (f": {reason}" if reason else "")
        super().__init__(code, text)
        self.code = code


@dataclass(frozen=True)
class LinkInfo:
    """What the plugin reads of a link (RTM_NEWLINK reply)."""

    index: int
    name: str
    mac: str
    mtu: int
    flags: int
    kind: str
    parent_index: int
    group: int = 0  # IFLA_GROUP: the link group (0, the default, for links nobody grouped)


def nla(kind: int, value: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    size = _NLA.size + len(value)
    return _NLA.pack(size, kind) + value + b"\0" * (-size & 3)


def nested(kind: int, *children: bytes) -> bytes:
    return nla(kind | NLA_F_NESTED, b"".join(children))


def attributes(data: bytes | memoryview, offset: int, end: int) -> Iterator[tuple[int, memoryview]]:
    """(type without flag bits, payload) of each attribute in ``data[offset:end]``."""
    view = memoryview(data)
    while offset + _NLA.size <= end:
        size, kind = _NLA.unpack_from(view, offset)
        if size < _NLA.size:
            return
        yield kind & 0x3FFF, view[offset + _NLA.size : offset + size]
        offset += (size + 3) & ~3


def _text(value: memoryview) -> str:
    return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")


def _mac(value: memoryview) -> str:
    return ":".join(f"{b:02x}" for b in bytes(value))


def parse_link(data: bytes) -> LinkInfo:
    """An RTM_NEWLINK message (header included) -> LinkInfo."""
    _, _, index, flags, _ = _IFINFOMSG.unpack_from(data, _NLMSGHDR.size)
    name = mac = kind = ""
    mtu = parent = group = 0
    end = _NLMSGHDR.unpack_from(data)[0]
    for kind_id, value in attributes(data, _NLMSGHDR.size + _IFINFOMSG.size, end):
        if kind_id == IFLA_IFNAME:
            name = _text(value)
        elif kind_id == IFLA_ADDRESS:
            mac = _mac(value)
        elif kind_id == IFLA_MTU:
            mtu = _U32.unpack_from(value)[0]
        elif kind_id == IFLA_LINK:
            parent = _U32.unpack_from(value)[0]
        elif kind_id == IFLA_GROUP:
            group = _U32.unpack_from(value)[0]
        elif kind_id == IFLA_LINKINFO:
            for sub, payload in attributes(value, 0, len(value)):
                if sub == IFLA_INFO_KIND:
                    kind = _text(payload)
    return LinkInfo(index=index, name=name, mac=mac, mtu=mtu, flags=flags, kind=kind, parent_index=parent,
                    group=group)


def _mac_bytes(mac: str) -> bytes:
    return bytes(int(part, 16) for part in mac.split(":"))


class RtnlSocket:
    """One NETLINK_ROUTE socket; one request at a time, answers matched by sequence number."""

    def __init__(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        try:
            for option in (NETLINK_CAP_ACK, NETLINK_EXT_ACK):
                try:
                    sock.setsockopt(SOL_NETLINK, option, 1)
                except OSError:  # older kernels: plain acks, still correct
                    pass
            sock.bind((0, 0))
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._seq = 0
        self._interrupted = False  # the last exchange's dump was marked inconsistent
        self.dumps_repeated = 0  # how often a dump was read again (for logs and tests)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> RtnlSocket:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- transport
    def next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF or 1
        return self._seq

    def request(self, msg_type: int, body: bytes, flags: int = 0) -> list[bytes]:
        """Send a request with NLM_F_ACK; returns the replies before the ack (a GET's answer)."""
        seq = self.next_seq()
        flags |= NLM_F_REQUEST | NLM_F_ACK
        header = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, flags, seq, 0)
        return self.exchange(header + body, seq)

    def dump(self, msg_type: int, body: bytes) -> list[bytes]:
        """Every object of a table. A dump the kernel marks interrupted (the table changed while it
        was read: an entry may be missing) is read again; a snapshot must not miss an address."""
        for _ in range(DUMP_ATTEMPTS):
            seq = self.next_seq()
            header = _NLMSGHDR.pack(_NLMSGHDR.size + len(body), msg_type, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
            replies = self.exchange(header + body, seq)
            if not self._interrupted:
                return replies
            self.dumps_repeated += 1
        raise NetlinkError(errnos.EAGAIN, f"the kernel table kept changing during {DUMP_ATTEMPTS} dumps")

    def exchange(self, data: bytes, seq: int) -> list[bytes]:
        """Send an encoded message (its header carries ``seq``); read until its ack or dump end."""
        self._sock.send(data)
        self._interrupted = False
        replies: list[bytes] = []
        while True:
            chunk, _, msg_flags, _ = self._sock.recvmsg(_RECV_BUFFER)
            if msg_flags & _MSG_TRUNC:
                raise NetlinkError(errnos.EMSGSIZE, "a netlink answer did not fit the receive buffer")
            offset = 0
            while offset + _NLMSGHDR.size <= len(chunk):
                length, kind, flags, got_seq, _ = _NLMSGHDR.unpack_from(chunk, offset)
                if length < _NLMSGHDR.size:
                    break
                message = chunk[offset : offset + length]
                offset += (length + 3) & ~3
                if got_seq != seq:
                    continue  # an answer to a request someone gave up on; not ours
                self._interrupted |= bool(flags & NLM_F_DUMP_INTR)
                if kind == NLMSG_ERROR:
                    _raise_if_error(message, flags)
                    return replies
                if kind == NLMSG_DONE:
                    if len(message) >= _NLMSGHDR.size + 4:
                        code = struct.unpack_from("=i", message, _NLMSGHDR.size)[0]
                        if code < 0:
                            raise NetlinkError(-code)
                    return replies
                replies.append(message)

    # -------------------------------------------------------------- links
    def link_get(self, name: str = "", index: int = 0) -> LinkInfo | None:
        """The link by name or index; None when the kernel has no such link."""
        body = _IFINFOMSG.pack(0, 0, index, 0, 0)
        if name and not index:
            body += nla(IFLA_IFNAME, name.encode() + b"\0")
        try:
            replies = self.request(RTM_GETLINK, body)
        except NetlinkError as exc:
            if exc.code in (errnos.ENODEV, errnos.ENOENT, errnos.EINVAL):
                return None
            raise
        return parse_link(replies[0]) if replies else None

    def link_dump(self) -> list[LinkInfo]:
        return [parse_link(m) for m in self.dump(RTM_GETLINK, _IFINFOMSG.pack(0, 0, 0, 0, 0))]

    def macvlan_add(
        self, name: str, parent: int, netns_fd: int, mode: str, mac: str = "", group: int = 0
    ) -> None:
        """A macvlan on ``parent`` created straight into the netns behind ``netns_fd``, in link
        group ``group`` from its first moment (0: the default group)."""
        attrs = [nla(IFLA_IFNAME, name.encode() + b"\0"), nla(IFLA_LINK, _U32.pack(parent)),
                 nla(IFLA_NET_NS_FD, _U32.pack(netns_fd))]
        if group:
            attrs.append(nla(IFLA_GROUP, _U32.pack(group)))
        if mac:
            attrs.append(nla(IFLA_ADDRESS, _mac_bytes(mac)))
        data = nested(IFLA_INFO_DATA, nla(IFLA_MACVLAN_MODE, _U32.pack(MACVLAN_MODE[mode])))
        attrs.append(nested(IFLA_LINKINFO, nla(IFLA_INFO_KIND, b"macvlan\0"), data))
        body = _IFINFOMSG.pack(0, 0, 0, 0, 0) + b"".join(attrs)
        self.request(RTM_NEWLINK, body, NLM_F_CREATE | NLM_F_EXCL)

    def ipvlan_add(self, name: str, parent: int, netns_fd: int, mode: str, group: int = 0) -> None:
        """An ipvlan (``mode`` l2/l3/l3s) on ``parent`` created straight into the netns behind
        ``netns_fd``, in link group ``group`` from its first moment. A kernel built without IPVLAN
        answers EOPNOTSUPP (what iproute2 prints as "Unknown device type")."""
        attrs = [nla(IFLA_IFNAME, name.encode() + b"\0"), nla(IFLA_LINK, _U32.pack(parent)),
                 nla(IFLA_NET_NS_FD, _U32.pack(netns_fd))]
        if group:
            attrs.append(nla(IFLA_GROUP, _U32.pack(group)))
        data = nested(IFLA_INFO_DATA, nla(IFLA_IPVLAN_MODE, struct.pack("=H", IPVLAN_MODE[mode])))
        attrs.append(nested(IFLA_LINKINFO, nla(IFLA_INFO_KIND, b"ipvlan\0"), data))
        body = _IFINFOMSG.pack(0, 0, 0, 0, 0) + b"".join(attrs)
        self.request(RTM_NEWLINK, body, NLM_F_CREATE | NLM_F_EXCL)

    def link_set(
        self, index: int, name: str = "", mtu: int = 0, up: bool | None = None,
        addrgen_mode: int | None = None, ipv4_conf: dict[int, int] | None = None,
    ) -> None:
        """Change what is given, in one request (the kernel applies it all or fails).
        ``ipv4_conf``: IPV4_DEVCONF_* index -> value (what /proc/sys/net/ipv4/conf/<if>/ shows)."""
        flags = IFF_UP if up else 0
        change = IFF_UP if up is not None else 0
        attrs = []
        if name:
            attrs.append(nla(IFLA_IFNAME, name.encode() + b"\0"))
        if mtu:
            attrs.append(nla(IFLA_MTU, _U32.pack(mtu)))
        per_family = []
        if ipv4_conf:
            conf = b"".join(nla(key, _U32.pack(value)) for key, value in sorted(ipv4_conf.items()))
            per_family.append(nested(socket.AF_INET, nested(IFLA_INET_CONF, conf)))
        if addrgen_mode is not None:
            per_family.append(nested(socket.AF_INET6, nla(IFLA_INET6_ADDR_GEN_MODE, bytes([addrgen_mode]))))
        if per_family:
            attrs.append(nested(IFLA_AF_SPEC, *per_family))
        self.request(RTM_SETLINK, _IFINFOMSG.pack(0, 0, index, flags, change) + b"".join(attrs))

    def link_del(self, index: int) -> None:
        self.request(RTM_DELLINK, _IFINFOMSG.pack(0, 0, index, 0, 0))

    def link_del_group(self, group: int) -> None:
        """Every link of ``group`` in this netns, deleted by one request (no index, no name): the
        kernel unregisters them together, so they share one RCU grace period instead of waiting for
        one each. The kernel refuses group 0 (EPERM), a group holding a link it cannot delete
        (EOPNOTSUPP: none of them is deleted then) and an empty group (ENODEV)."""
        self.request(RTM_DELLINK, _IFINFOMSG.pack(0, 0, 0, 0, 0) + nla(IFLA_GROUP, _U32.pack(group)))

    # -------------------------------------------------------------- addresses, routes, rules
    def send_encoded(self, encode: Callable[[int], bytes]) -> None:
        """A request encoded by ``encode(sequence number)`` (header included, NLM_F_ACK set): sent,
        and its ack read (a refusal raises)."""
        seq = self.next_seq()
        self.exchange(encode(seq), seq)

    def addr_dump(self, family: int = 0, index: int = 0) -> list[Record]:
        """Address records with every attribute (:func:`rdma_cni.net.rtnl.decode`), only those of
        ``index`` when given."""
        return [rtnl.decode("addr", m) for m in self._addr_messages(family, index)]

    def addr_kinds(self, index: int) -> list[tuple[int, int, int, int]]:
        """(family, scope, flags, proto) of each address of ``index``, read from the raw messages
        (IFA_FLAGS when present, else the header's 8 bits; IFA_PROTO, 0 when absent): enough to tell
        which are movable, without decoding."""
        out = []
        for m in self._addr_messages(0, index):
            family, _, flags, scope, _ = _IFADDRMSG.unpack_from(m, _NLMSGHDR.size)
            end = _NLMSGHDR.unpack_from(m)[0]
            proto = 0
            for kind, value in attributes(m, _NLMSGHDR.size + _IFADDRMSG.size, end):
                if kind == IFA_FLAGS:
                    flags = _U32.unpack_from(value)[0]
                elif kind == IFA_PROTO and value:
                    proto = value[0]
            out.append((family, scope, flags, proto))
        return out

    def _addr_messages(self, family: int, index: int) -> list[bytes]:
        """Raw address messages, only those of ``index`` when given (filtered before any decoding)."""
        raw = self.dump(RTM_GETADDR, _IFADDRMSG.pack(family, 0, 0, 0, 0))
        return [m for m in raw if not index or _IFADDRMSG.unpack_from(m, _NLMSGHDR.size)[4] == index]

    def route_dump(
        self, family: int, keep: Callable[[int, int], bool] | None = None,
        links: Collection[int] = (), sources: Collection[bytes] = (),
    ) -> list[Record]:
        """Route records with every attribute; ``keep(table, proto)`` filters before decoding, and
        so do ``links``/``sources`` when given: only routes through one of those ifindexes (or
        multipath ones), or with one of those packed addresses as preferred source, are decoded."""
        raw = self.dump(RTM_GETROUTE, struct.pack("=BBBBBBBBI", family, 0, 0, 0, 0, 0, 0, 0, 0))
        if keep is not None:
            raw = [m for m in raw if keep(m[_NLMSGHDR.size + 4], m[_NLMSGHDR.size + 5])]
        if links or sources:
            raw = [m for m in raw if _route_may_use(m, links, sources)]
        return [rtnl.decode("route", m) for m in raw]

    def rule_dump(self, family: int, keep: Callable[[bytes], bool] | None = None) -> list[Record]:
        """Rule records with every attribute; ``keep(raw message)`` filters before decoding."""
        raw = self.dump(RTM_GETRULE, struct.pack("=BBBBBBBBI", family, 0, 0, 0, 0, 0, 0, 0, 0))
        return [rtnl.decode("rule", m) for m in raw if keep is None or keep(m)]


RTA_OIF, RTA_PREFSRC, RTA_MULTIPATH = 4, 7, 9
_RTMSG_SIZE = 12


def _route_may_use(m: bytes, links: Collection[int], sources: Collection[bytes]) -> bool:
    """From the raw attributes: through one of ``links``, from one of ``sources``, or multipath
    (its hops are nested: left to the decoded message)."""
    end = _NLMSGHDR.unpack_from(m)[0]
    for kind, value in attributes(m, _NLMSGHDR.size + _RTMSG_SIZE, end):
        if kind == RTA_OIF and _U32.unpack_from(value)[0] in links:
            return True
        if kind == RTA_PREFSRC and bytes(value) in sources:
            return True
        if kind == RTA_MULTIPATH:
            return True
    return False


def _raise_if_error(message: bytes, flags: int) -> None:
    code = struct.unpack_from("=i", message, _NLMSGHDR.size)[0]
    if code == 0:
        return
    reason = ""
    if flags & NLM_F_ACK_TLVS:
        # The TLVs follow the echoed request: its header only when capped, else all of it.
        echoed = _NLMSGHDR.unpack_from(message, _NLMSGHDR.size + 4)[0]
        start = _NLMSGHDR.size + 4 + (_NLMSGHDR.size if flags & NLM_F_CAPPED else (echoed + 3) & ~3)
        for kind, value in attributes(message, start, len(message)):
            if kind == NLMSGERR_ATTR_MSG:
                reason = _text(value)
    raise NetlinkError(-code, reason)
