"""Entering the caller's namespaces and root, so a worker sees the node exactly as the CNI client does.

The client passes descriptors of its own ``/proc/self/ns/net``, ``/proc/self/ns/mnt`` and ``/`` (an
older client only the first two). Joining the mount namespace gives the worker the client's ``/sys``
(``ip netns exec`` mounts a per-netns one), ``/var/run/netns`` and state files; joining the network
namespace makes "the node" the client's node. ``setns(CLONE_NEWNS)`` puts the worker at the
*namespace's* root, which is not the client's when the client runs chrooted: upstream Multus thick
runs its delegates chrooted into ``/hostroot`` (the host's root, an rbind in the Multus container's
mount namespace), and a worker at that namespace's root saw the container's ``/sys`` (no RDMA
device: error 7) and would have kept the plugin's records in the container's ephemeral filesystem.
So the worker also takes the client's root (``fchdir`` + ``chroot``). ``setns(CLONE_NEWNS)`` needs a
single-threaded process: a freshly forked worker is one.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

import rdma_cni
from rdma_cni.net.netns import CLONE_NEWNET, CLONE_NEWNS, libc, setns

_own_mounts: tuple[int, int] | None = None  # (dev, inode) of the agent's mount namespace (warm())

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def enter_caller(net_fd: int, mnt_fd: int, root_fd: int | None = None) -> bool:
    """Network first: joining the mount namespace changes nothing the netns join depends on.

    Returns whether the worker's view of the files changed (mounts or root). A caller in the
    agent's own mount namespace (the agent on the host, or in the node's ``ip netns exec`` view)
    at the agent's root sees the same files: joining it again would only reset the root and cwd to
    the namespace's, and the agent runs at that root, so the worker only changes its cwd, and its
    code anchors need no check (~60 us a call). ``root_fd`` is the caller's ``/`` (None from an
    older client: the namespace's root, as before); a root that differs from the worker's after the
    join is taken, and the code anchors are checked in that view as in another mount namespace."""
    setns(net_fd, CLONE_NEWNET)
    st = os.fstat(mnt_fd)
    moved = (st.st_dev, st.st_ino) != _own_mounts
    if moved:
        setns(mnt_fd, CLONE_NEWNS)  # also puts the worker at that namespace's root
    if root_fd is not None:
        theirs = place(root_fd)
        if theirs is None or theirs != place():
            os.fchdir(root_fd)
            os.chroot(".")
            moved = True
    os.chdir("/")  # the old cwd belongs to the agent's mount namespace, or is not the caller's
    return moved


class Home:
    """The worker's own network and mount namespaces and root, held open so it can go back after a
    call: a worker that serves several calls must start each one from where a fresh fork would.
    ``/proc`` is held too, so the checks read the agent's own proc whatever view the call left."""

    def __init__(self) -> None:
        self.net_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.mnt_fd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        self.root_fd = os.open("/", DIRECTORY)
        self.proc_fd = os.open("/proc", DIRECTORY)
        self.net_inode = os.fstat(self.net_fd).st_ino
        self.mounts = _ident(os.fstat(self.mnt_fd))
        self.root = place()

    def go_back(self) -> None:
        """Rejoin the mount namespace if it changed (that resets the root to the namespace's), take
        the agent's root if that is not it (a chroot within the agent's own mount namespace leaves
        the namespace as it was), rejoin the netns, and check that it all took."""
        if self._mounts_now() != self.mounts:
            setns(self.mnt_fd, CLONE_NEWNS)
        if self.root is None or place() != self.root:
            os.fchdir(self.root_fd)
            os.chroot(".")
        setns(self.net_fd, CLONE_NEWNET)
        os.chdir("/")
        if os.stat("thread-self/ns/net", dir_fd=self.proc_fd).st_ino != self.net_inode:
            raise OSError(f"still outside the agent's netns after setns (inode {self.net_inode})")
        if self._mounts_now() != self.mounts:
            raise OSError("still outside the agent's mount namespace after setns")
        if self.root is not None and place() != self.root:
            raise OSError(f"still outside the agent's root after chroot (mount, inode {self.root})")

    def _mounts_now(self) -> tuple[int, int]:
        return _ident(os.stat("self/ns/mnt", dir_fd=self.proc_fd))


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
STATX_INO = 0x100
STATX_MNT_ID = 0x1000
_STATX = struct.Struct("=I28xQ104xQ")  # struct statx: stx_mask at 0, stx_ino at 32, stx_mnt_id at 144
_statx_buf = ctypes.create_string_buffer(256)


def place(fd: int | None = None) -> tuple[int, int] | None:
    """(mount id, inode) of the directory ``fd``, or of this process's root: a root is a mount and
    a directory on it. The inode alone would not tell the Multus container's ``/hostroot`` (an
    rbind of the host's ``/``) from the host's ``/``, whose submounts (``/sys``) may differ. None
    when the kernel does not say the mount (before Linux 5.8): then roots count as different."""
    statx = getattr(libc(), "statx", None)
    if statx is None:
        return None
    if fd is None:
        rc = statx(AT_FDCWD, b"/", 0, STATX_INO | STATX_MNT_ID, _statx_buf)
    else:
        rc = statx(fd, b"", AT_EMPTY_PATH, STATX_INO | STATX_MNT_ID, _statx_buf)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"statx: {os.strerror(err)}")
    mask, ino, mnt_id = _STATX.unpack_from(_statx_buf)
    return (mnt_id, ino) if mask & STATX_MNT_ID else None


PR_SET_PDEATHSIG = 1

CodeAnchors = dict[str, tuple[int, int]]


def code_anchors() -> CodeAnchors:
    """(device, inode) of the agent's interpreter and package dir, taken in the agent's own mounts.

    A worker imports lazily-loaded modules by path after joining the caller's mount namespace; if
    those paths are other files there (an agent container whose image is not the host's install),
    the call must not run in the agent at all.
    """
    anchors: CodeAnchors = {}
    for path in (sys.executable, os.path.dirname(os.path.abspath(rdma_cni.__file__))):
        try:
            st = os.stat(path)
        except OSError:
            continue  # e.g. a package that lives inside a frozen archive
        anchors[path] = (st.st_dev, st.st_ino)
    return anchors


def code_mismatch(anchors: CodeAnchors) -> str:
    """Empty when every anchor is the same file here; else which one differs. "Here" is the
    caller's view, root included: the anchors are absolute paths, so after a chroot they name the
    files of the chroot (on the test cluster ``/hostroot`` is the host's ``/``, where the agent's
    code is the node's install, the same inodes)."""
    for path, ident in anchors.items():
        try:
            st = os.stat(path)
        except OSError:
            return f"{path} does not exist in the caller's mount namespace"
        if (st.st_dev, st.st_ino) != ident:
            return f"{path} is another file in the caller's mount namespace"
    return ""


def die_with_parent(on: bool) -> None:
    """Arm (SIGKILL) or disarm the signal the kernel sends this process when its parent dies."""
    import signal

    if libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL) if on else 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


def warm() -> None:
    """Load libc (and look up statx) in the parent so no worker pays for it; note the agent's own
    mount namespace."""
    global _own_mounts
    place()
    st = os.stat("/proc/self/ns/mnt")
    _own_mounts = (st.st_dev, st.st_ino)
