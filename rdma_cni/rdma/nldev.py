"""A small client for the kernel's RDMA netlink family (``NETLINK_RDMA``, client ``nldev``).

pyroute2 has no RDMA netlink, so messages are built with ``struct``: a ``nlmsghdr`` whose type is
``RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, cmd)`` and a flat list of netlink attributes — the exact bytes the
``rdma`` tool (iproute2) sends (tests compare them with captured traffic byte for byte).

Where the kernel refuses the socket (``EPROTONOSUPPORT``: no ``ib_core``) the same operations fall
back to the ``rdma`` tool, which then usually fails the same way — the error says so.

Usage::

    with NldevSocket() as nl:
        nl.sys_get()                       # SystemInfo(netns_mode="shared", copy_on_fork=True)
        nl.devices()                       # [Device(index=0, name="mlx5_bond_0", ...), ...]
        nl.set_device_netns(0, netns_fd)   # exclusive mode only
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import socket
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from rdma_cni.net.netns import Netns, entered

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5

# enum rdma_nldev_command (include/uapi/rdma/rdma_netlink.h)
RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_CMD_SET = 2
RDMA_NLDEV_CMD_PORT_GET = 5
RDMA_NLDEV_CMD_SYS_GET = 6
RDMA_NLDEV_CMD_SYS_SET = 7

# enum rdma_nldev_attr
RDMA_NLDEV_ATTR_DEV_INDEX = 1  # u32
RDMA_NLDEV_ATTR_DEV_NAME = 2  # string
RDMA_NLDEV_ATTR_PORT_INDEX = 3  # u32
RDMA_NLDEV_ATTR_CAP_FLAGS = 4  # u64
RDMA_NLDEV_ATTR_NODE_GUID = 6  # u64
RDMA_NLDEV_ATTR_SYS_IMAGE_GUID = 7  # u64
RDMA_NLDEV_ATTR_PORT_STATE = 12  # u8
RDMA_NLDEV_ATTR_PORT_PHYS_STATE = 13  # u8
RDMA_NLDEV_ATTR_DEV_NODE_TYPE = 14  # u8
RDMA_NLDEV_ATTR_NDEV_INDEX = 50  # u32
RDMA_NLDEV_ATTR_NDEV_NAME = 51  # string
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66  # u8: 1 shared, 0 exclusive
RDMA_NLDEV_ATTR_DEV_PROTOCOL = 67  # string
RDMA_NLDEV_NET_NS_FD = 68  # u32
RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK = 93  # u8

NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
NLMSG_ERROR = 2
NLMSG_DONE = 3

HDR = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
NLA = struct.Struct("=HH")  # nlattr: len, type

SHARED = "shared"
EXCLUSIVE = "exclusive"
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
NODE_TYPES = {1: "ca", 2: "switch", 3: "router", 4: "rnic", 5: "usnic", 6: "usnic_udp", 7: "unspecified"}


class NldevError(OSError):
    """The kernel answered an nldev request with an error (``errno`` set), or the tool failed."""


def msg_type(cmd: int) -> int:
    """``RDMA_NL_GET_TYPE(client, op)``: the client in the upper bits, the command below."""
    return (RDMA_NL_NLDEV << 10) + cmd


def _align(n: int) -> int:
    return (n + 3) & ~3


def nla(atype: int, payload: bytes) -> bytes:
    length = NLA.size + len(payload)
    return NLA.pack(length, atype) + payload + b"\0" * (_align(length) - length)


def nla_u8(atype: int, value: int) -> bytes:
    return nla(atype, struct.pack("=B", value))


def nla_u32(atype: int, value: int) -> bytes:
    return nla(atype, struct.pack("=I", value))


def nla_str(atype: int, value: str) -> bytes:
    return nla(atype, value.encode() + b"\0")


def encode(cmd: int, flags: int, seq: int, attrs: Iterable[bytes] = (), pid: int = 0) -> bytes:
    body = b"".join(attrs)
    return HDR.pack(HDR.size + len(body), msg_type(cmd), flags, seq & 0xFFFFFFFF, pid & 0xFFFFFFFF) + body


# The requests, each exactly as `rdma` (iproute2) builds it.
def dev_dump_request(seq: int) -> bytes:
    return encode(RDMA_NLDEV_CMD_GET, NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP, seq)


def dev_get_request(seq: int, dev_index: int) -> bytes:
    return encode(
        RDMA_NLDEV_CMD_GET, NLM_F_REQUEST | NLM_F_ACK, seq, [nla_u32(RDMA_NLDEV_ATTR_DEV_INDEX, dev_index)]
    )


def port_get_request(seq: int, dev_index: int, port: int) -> bytes:
    attrs = [nla_u32(RDMA_NLDEV_ATTR_DEV_INDEX, dev_index), nla_u32(RDMA_NLDEV_ATTR_PORT_INDEX, port)]
    return encode(RDMA_NLDEV_CMD_PORT_GET, NLM_F_REQUEST | NLM_F_ACK, seq, attrs)


def sys_get_request(seq: int) -> bytes:
    return encode(RDMA_NLDEV_CMD_SYS_GET, NLM_F_REQUEST | NLM_F_ACK, seq)


def sys_set_request(seq: int, mode: str) -> bytes:
    value = {SHARED: 1, EXCLUSIVE: 0}[mode]
    return encode(
        RDMA_NLDEV_CMD_SYS_SET,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        [nla_u8(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, value)],
    )


def dev_set_netns_request(seq: int, dev_index: int, netns_fd: int) -> bytes:
    attrs = [nla_u32(RDMA_NLDEV_ATTR_DEV_INDEX, dev_index), nla_u32(RDMA_NLDEV_NET_NS_FD, netns_fd)]
    return encode(RDMA_NLDEV_CMD_SET, NLM_F_REQUEST | NLM_F_ACK, seq, attrs)


@dataclass
class Message:
    """One decoded RDMA netlink message."""

    type: int
    flags: int
    seq: int
    pid: int
    attrs: dict[int, bytes] = field(default_factory=dict)
    error: int | None = None  # NLMSG_ERROR: 0 = ACK, else -errno

    @property
    def cmd(self) -> int:
        return self.type & ((1 << 10) - 1)


def parse_attrs(data: bytes) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    off = 0
    while off + NLA.size <= len(data):
        length, atype = NLA.unpack_from(data, off)
        if length < NLA.size:
            break
        out[atype & 0x3FFF] = data[off + NLA.size : off + length]  # strip NLA_F_NESTED/NET_BYTEORDER
        off += _align(length)
    return out


def decode(data: bytes) -> Iterator[Message]:
    """Split a datagram into messages; ``NLMSG_ERROR`` carries its (negative) errno in ``error``."""
    off = 0
    while off + HDR.size <= len(data):
        length, mtype, flags, seq, pid = HDR.unpack_from(data, off)
        if length < HDR.size:
            break
        body = data[off + HDR.size : off + length]
        msg = Message(mtype, flags, seq, pid)
        if mtype == NLMSG_ERROR:
            msg.error = struct.unpack_from("=i", body)[0]
        elif mtype != NLMSG_DONE:
            msg.attrs = parse_attrs(body)
        yield msg
        off += _align(length)


def _u8(attrs: dict[int, bytes], key: int) -> int | None:
    return attrs[key][0] if attrs.get(key) else None


def _u32(attrs: dict[int, bytes], key: int) -> int | None:
    return struct.unpack_from("=I", attrs[key])[0] if len(attrs.get(key, b"")) >= 4 else None


def _u64(attrs: dict[int, bytes], key: int) -> int | None:
    return struct.unpack_from("=Q", attrs[key])[0] if len(attrs.get(key, b"")) >= 8 else None


def _str(attrs: dict[int, bytes], key: int) -> str | None:
    return attrs[key].split(b"\0", 1)[0].decode() if key in attrs else None


def _guid(value: int | None) -> str | None:
    if value is None:
        return None
    h = f"{value:016x}"  # as `rdma dev` prints it: "6477:54ff:fe36:5669"
    return ":".join(h[i : i + 4] for i in range(0, 16, 4))


@dataclass(frozen=True)
class SystemInfo:
    """``rdma system``: the RDMA netns mode, and copy-on-fork (None: the kernel does not say)."""

    netns_mode: str
    copy_on_fork: bool | None


@dataclass(frozen=True)
class Device:
    """An RDMA device (``rdma dev``)."""

    index: int
    name: str
    node_type: str | None = None
    node_guid: str | None = None
    sys_image_guid: str | None = None
    protocol: str | None = None


@dataclass(frozen=True)
class Port:
    """A port of an RDMA device and its netdev (``rdma link``)."""

    dev_index: int
    dev_name: str
    port: int
    state: str | None
    phys_state: int | None
    ndev_index: int | None
    ndev_name: str | None


def system_info(msg: Message) -> SystemInfo:
    mode = _u8(msg.attrs, RDMA_NLDEV_SYS_ATTR_NETNS_MODE)
    if mode is None:
        raise NldevError(errno.EPROTO, "SYS_GET reply without RDMA_NLDEV_SYS_ATTR_NETNS_MODE")
    cof = _u8(msg.attrs, RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK)
    return SystemInfo(SHARED if mode else EXCLUSIVE, None if cof is None else bool(cof))


def device_of(msg: Message) -> Device:
    index, name = _u32(msg.attrs, RDMA_NLDEV_ATTR_DEV_INDEX), _str(msg.attrs, RDMA_NLDEV_ATTR_DEV_NAME)
    if index is None or name is None:
        raise NldevError(errno.EPROTO, "GET reply without device index or name")
    node_type = _u8(msg.attrs, RDMA_NLDEV_ATTR_DEV_NODE_TYPE)
    return Device(
        index=index,
        name=name,
        node_type=None if node_type is None else NODE_TYPES.get(node_type, str(node_type)),
        node_guid=_guid(_u64(msg.attrs, RDMA_NLDEV_ATTR_NODE_GUID)),
        sys_image_guid=_guid(_u64(msg.attrs, RDMA_NLDEV_ATTR_SYS_IMAGE_GUID)),
        protocol=_str(msg.attrs, RDMA_NLDEV_ATTR_DEV_PROTOCOL),
    )


def port_of(msg: Message) -> Port:
    state = _u8(msg.attrs, RDMA_NLDEV_ATTR_PORT_STATE)
    return Port(
        dev_index=_u32(msg.attrs, RDMA_NLDEV_ATTR_DEV_INDEX) or 0,
        dev_name=_str(msg.attrs, RDMA_NLDEV_ATTR_DEV_NAME) or "",
        port=_u32(msg.attrs, RDMA_NLDEV_ATTR_PORT_INDEX) or 0,
        state=None if state is None else PORT_STATES.get(state, str(state)),
        phys_state=_u8(msg.attrs, RDMA_NLDEV_ATTR_PORT_PHYS_STATE),
        ndev_index=_u32(msg.attrs, RDMA_NLDEV_ATTR_NDEV_INDEX),
        ndev_name=_str(msg.attrs, RDMA_NLDEV_ATTR_NDEV_NAME),
    )


class NldevSocket:
    """One NETLINK_RDMA socket; requests are sent and answered one at a time."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
        self.sock.settimeout(timeout)
        self.sock.bind((0, 0))
        self._seq: Iterator[int] = itertools.count(int(time.time()) & 0x7FFFFFFF)

    def __enter__(self) -> NldevSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def request(self, build: Callable[..., bytes], *args: int | str) -> list[Message]:
        """Send ``build(seq, *args)`` and collect the replies up to the ACK (or DONE of a dump)."""
        seq = next(self._seq)
        self.sock.send(build(seq, *args))
        out: list[Message] = []
        while True:
            data = self.sock.recv(65536)
            for msg in decode(data):
                if msg.seq != seq:
                    continue
                if msg.type == NLMSG_ERROR:
                    if msg.error:
                        raise NldevError(-msg.error, os.strerror(-msg.error))
                    return out
                if msg.type == NLMSG_DONE:
                    return out
                out.append(msg)

    def sys_get(self) -> SystemInfo:
        return system_info(self.request(sys_get_request)[0])

    def sys_set_netns_mode(self, mode: str) -> None:
        self.request(sys_set_request, mode)

    def devices(self) -> list[Device]:
        return [device_of(m) for m in self.request(dev_dump_request)]

    def port(self, dev_index: int, port: int) -> Port:
        return port_of(self.request(port_get_request, dev_index, port)[0])

    def set_device_netns(self, dev_index: int, netns_fd: int) -> None:
        self.request(dev_set_netns_request, dev_index, netns_fd)


# --- the `rdma` tool, used only where the kernel refuses the socket ---------------------------------

REFUSED = (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT)


def _rdma_tool(*args: str) -> str:
    # lazy: shutil and subprocess are ~7 ms of a cold plugin call's import CPU (python -X importtime),
    # and a kernel with RDMA netlink (every node with ib_core) never comes here.
    import shutil
    import subprocess

    exe = shutil.which("rdma")
    if exe is None:
        raise NldevError(
            errno.ENOENT, "the RDMA netlink socket is refused and the `rdma` tool is not installed"
        )
    proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10, check=False)
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip() or f"exit {proc.returncode}"
        raise NldevError(errno.EIO, f"rdma {' '.join(args)}: {msg}")
    return proc.stdout


def parse_system_show(text: str) -> SystemInfo:
    """``rdma system show`` output -> SystemInfo ("netns shared copy-on-fork on")."""
    m = re.search(r"\bnetns (shared|exclusive)\b", text)
    if not m:
        raise NldevError(
            errno.EPROTO, f"cannot read the netns mode from `rdma system show`: {text.strip()!r}"
        )
    cof = re.search(r"\bcopy-on-fork (on|off)\b", text)
    return SystemInfo(m.group(1), None if cof is None else cof.group(1) == "on")


def _with_socket(op: str, *args: int | str) -> object:
    with NldevSocket() as nl:
        return getattr(nl, op)(*args)


def system_netns_mode() -> SystemInfo:
    """The netns mode from the kernel: nldev, else ``rdma system show``."""
    try:
        info = _with_socket("sys_get")
        assert isinstance(info, SystemInfo)
        return info
    except OSError as e:
        if e.errno not in REFUSED:
            raise
    return parse_system_show(_rdma_tool("system", "show"))


def set_system_netns_mode(mode: str) -> None:
    """``rdma system set netns <mode>``; the kernel answers EBUSY while another netns exists."""
    if mode not in (SHARED, EXCLUSIVE):
        raise ValueError(f"netns mode must be {SHARED} or {EXCLUSIVE}, not {mode!r}")
    try:
        _with_socket("sys_set_netns_mode", mode)
        return
    except OSError as e:
        if e.errno not in REFUSED:
            raise
    _rdma_tool("system", "set", "netns", mode)


def list_devices() -> list[Device]:
    try:
        devs = _with_socket("devices")
        assert isinstance(devs, list)
        return devs
    except OSError as e:
        if e.errno not in REFUSED:
            raise
    out = []
    for line in _rdma_tool("dev", "show").splitlines():
        m = re.match(r"^(\d+): (\S+): (?:node_type (\S+))?", line)
        if m:
            out.append(Device(int(m.group(1)), m.group(2), m.group(3)))
    return out


def _socket_in(netns_fd: int | None) -> NldevSocket:
    """An nldev socket bound to the netns of ``netns_fd`` (in exclusive mode a device moved into a
    pod is only visible, and can only be sent back, from inside that pod's netns)."""
    if netns_fd is None:
        return NldevSocket()

    with entered(Netns("", netns_fd, 0)):
        return NldevSocket()


def set_device_netns(device: str, netns_fd: int, from_netns_fd: int | None = None) -> None:
    """Move RDMA ``device`` into the netns of ``netns_fd`` (exclusive mode; rxe answers EOPNOTSUPP).

    ``from_netns_fd``: the netns the device is in now (a pod's, when giving it back to the host).
    """
    try:
        with _socket_in(from_netns_fd) as nl:
            for dev in nl.devices():
                if dev.name == device:
                    nl.set_device_netns(dev.index, netns_fd)
                    return
        raise NldevError(errno.ENODEV, f"no RDMA device {device}")
    except OSError as e:
        if e.errno not in REFUSED or from_netns_fd is not None:
            raise
    # iproute2 opens a netns argument containing '/' as a path: hand it our fd through /proc.
    _rdma_tool("dev", "set", device, "netns", f"/proc/{os.getpid()}/fd/{netns_fd}")
