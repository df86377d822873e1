"""Network namespaces, opened safely and entered only for as long as it takes to open a socket.

Why not pyroute2's helpers: ``IPRoute(netns=path)`` and ``pyroute2.netns.setns(path)`` open the path
with ``O_CREAT`` (a typo'd or stale ``CNI_NETNS`` would silently create a fresh, empty netns), and
``IPRoute(netns=...)`` forks a child per call. Here the path is opened ``O_RDONLY``, checked to be
an nsfs file (``fstatfs`` magic), and entered with ``setns(2)`` in the calling thread just long
enough to create a netlink or raw socket; the socket stays bound to that netns after we return.

    with open_netns("/var/run/netns/cni-1234") as ns:
        ipr = netlink_in(ns)          # an RtnlSocket talking to the pod's netns
        print(ns.inode)               # identity, recorded in state and checked before DEL
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rdma_cni.cni.errors import INVALID_ENV, CniError
from rdma_cni.net.nlsock import RtnlSocket
from rdma_cni.net.rtnl import light_pyroute2

NSFS_MAGIC = 0x6E736673
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3)
_STATFS_SIZE = 256  # generous: struct statfs is 120 bytes on x86_64/aarch64; f_type is the first long

_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """The C library, loaded once, with errno kept (the syscalls Python 3.11 lacks: setns, fstatfs)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


class NetnsUnavailable(CniError):
    """The path is missing or is not a network namespace. ``gone`` tells DEL it may skip the pod side."""

    def __init__(self, path: str, reason: str, gone: bool) -> None:
        super().__init__(INVALID_ENV, f"CNI_NETNS {path!r} {reason}")
        self.path = path
        self.gone = gone


@dataclass
class Netns:
    """A network namespace held open: its path, the descriptor (-1 once closed) and its inode."""

    path: str
    fd: int
    inode: int

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Netns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fs_magic(fd: int) -> int:
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    if libc().fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def open_netns(path: str) -> Netns:
    """Open an existing netns by path; never creates one. Raises :class:`NetnsUnavailable`."""
    if not path:
        raise NetnsUnavailable(path, "is empty", gone=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise NetnsUnavailable(path, "does not exist", gone=True) from None
    except OSError as exc:
        raise NetnsUnavailable(path, f"cannot be opened: {exc.strerror}", gone=True) from None
    try:
        if fs_magic(fd) != NSFS_MAGIC:
            raise NetnsUnavailable(path, "is not a network namespace (not an nsfs file)", gone=True)
        if _ns_type(fd) not in (None, CLONE_NEWNET):
            raise NetnsUnavailable(path, "is not a network namespace (another kind of namespace)", gone=True)
        inode = os.fstat(fd).st_ino
    except BaseException:
        os.close(fd)
        raise
    return Netns(path, fd, inode)


def _ns_type(fd: int) -> int | None:
    """NS_GET_NSTYPE (Linux >= 4.11); None when the kernel cannot tell."""
    import fcntl

    try:
        return int(fcntl.ioctl(fd, NS_GET_NSTYPE))
    except OSError:
        return None


def netns_inode(path: str) -> int | None:
    """The inode of the netns at ``path``, or None when it is gone or not a netns."""
    try:
        with open_netns(path) as ns:
            return ns.inode
    except NetnsUnavailable:
        return None


def current_inode() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    """Move the calling thread into the namespace behind ``fd``; the kernel refuses an fd of
    another namespace type (``nstype``), so a wrong path can never be joined by accident."""
    if libc().setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns({nstype:#x}): {os.strerror(err)}")


@contextmanager
def entered(ns: Netns) -> Iterator[None]:
    """Run the body with this thread inside ``ns``; always switch back.

    Sockets created in the body stay in ``ns``. Failing to switch back would leave the plugin
    operating on the wrong namespace, so that is raised as a hard error rather than ignored.
    """
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(ns.fd)
        try:
            yield
        finally:
            try:
                setns(home)
            except OSError as exc:  # pragma: no cover - kernel refused to return us home
                raise RuntimeError(f"cannot return to the node netns: {exc}") from exc
    finally:
        os.close(home)


def netlink_in(ns: Netns | None) -> RtnlSocket:
    """An rtnetlink socket bound to ``ns`` (None: the current netns). A netlink socket belongs to
    the netns it was created in, so the thread only visits ``ns`` for the ``socket()`` call."""
    if ns is None:
        return RtnlSocket()
    with entered(ns):
        return RtnlSocket()


def iproute_in(ns: Netns | None) -> Any:
    """pyroute2's full ``IPRoute`` bound to ``ns``: for tools that want its whole API (the simulated
    node); the plugin's own path uses :func:`netlink_in`."""
    light_pyroute2()
    from pyroute2.iproute.linux import IPRoute

    if ns is None:
        ipr = IPRoute()
    else:
        with entered(ns):
            ipr = IPRoute()
    # pyroute2 0.9.7's sync nlm_request() reads this key, which only the async core sets.
    ipr.status.setdefault("nlm_generator", False)
    return ipr


def is_gone_error(exc: BaseException) -> bool:
    """Netlink errors that mean "already not there" (DEL treats them as success)."""
    code = getattr(exc, "code", None)
    if code is None and isinstance(exc, OSError):
        code = exc.errno
    return code in (errno.ENODEV, errno.ENOENT, errno.ESRCH, errno.EADDRNOTAVAIL)
