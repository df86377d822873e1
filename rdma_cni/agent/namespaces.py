"""Entering the caller's namespaces, so a worker sees the node exactly as the CNI client does.

The client passes descriptors of its own ``/proc/self/ns/net`` and ``/proc/self/ns/mnt``. Joining the
mount namespace gives the worker the client's ``/sys`` (``ip netns exec`` mounts a per-netns one),
``/var/run/netns`` and state files; joining the network namespace makes "the node" the client's
node. ``setns(CLONE_NEWNS)`` needs a single-threaded process: a freshly forked worker is one.
"""

from __future__ import annotations

import ctypes
import os
import sys

import rdma_cni
from rdma_cni.net.netns import CLONE_NEWNET, CLONE_NEWNS, libc, setns

_own_mounts: tuple[int, int] | None = None  # (dev, inode) of the agent's mount namespace (warm())


def enter_caller(net_fd: int, mnt_fd: int) -> bool:
    """Network first: joining the mount namespace changes nothing the netns join depends on.

    Returns whether the mounts changed. A caller in the agent's own mount namespace (the agent on
    the host, or in the node's ``ip netns exec`` view) sees the same files: joining it again
    would only reset the root and cwd to the namespace's, and the agent runs at that root, so
    the worker only changes its cwd, and its code anchors need no check (~60 us a call)."""
    setns(net_fd, CLONE_NEWNET)
    st = os.fstat(mnt_fd)
    moved = (st.st_dev, st.st_ino) != _own_mounts
    if moved:
        setns(mnt_fd, CLONE_NEWNS)
    os.chdir("/")  # the old cwd belongs to the agent's mount namespace, or is not the caller's
    return moved


class Home:
    """The worker's own network and mount namespaces, held open so it can go back after a call:
    a worker that serves several calls must start each one from where a fresh fork would."""

    def __init__(self) -> None:
        self.net_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self.mnt_fd = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        self.net_inode = os.fstat(self.net_fd).st_ino
        self.mounts = _ident(os.fstat(self.mnt_fd))

    def go_back(self) -> None:
        """Rejoin both namespaces (mounts only if they changed) and check that it took."""
        if _ident(os.stat("/proc/self/ns/mnt")) != self.mounts:
            setns(self.mnt_fd, CLONE_NEWNS)
        setns(self.net_fd, CLONE_NEWNET)
        os.chdir("/")
        if os.stat("/proc/thread-self/ns/net").st_ino != self.net_inode:
            raise OSError(f"still outside the agent's netns after setns (inode {self.net_inode})")
        if _ident(os.stat("/proc/self/ns/mnt")) != self.mounts:
            raise OSError("still outside the agent's mount namespace after setns")


def _ident(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


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
    """Empty when every anchor is the same file here; else which one differs."""
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
    """Load libc in the parent so no worker pays for it; note the agent's own mount namespace."""
    global _own_mounts
    libc()
    st = os.stat("/proc/self/ns/mnt")
    _own_mounts = (st.st_dev, st.st_ino)
