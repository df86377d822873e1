"""Read RDMA sysfs as a pod sees it: from inside its network namespace, with sysfs mounted there.

``/sys`` shows the netns of the process that mounted it; ``ip netns exec`` remounts it. In shared mode
``class/infiniband`` looks the same from every netns (lab FINDINGS, Q2), but in exclusive mode a pod
sees only the devices moved into it, so a faithful view needs a sysfs mounted from inside the netns.
A forked child does that (setns + a private mount namespace + a fresh sysfs mount on a temporary
directory), runs the reader and sends back JSON; the caller's namespaces are never changed.

Usage::

    entries = read_in_netns("/var/run/netns/pod1", lambda root: [e.gid for e in read_gids(root, d, 1)])
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

from rdma_cni.net.netns import CLONE_NEWNS, libc, open_netns, setns

MS_REC = 0x4000
MS_PRIVATE = 1 << 18
LIVE_SYSFS = "/sys"


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enter_and_mount(netns_fd: int, mountpoint: str) -> None:
    setns(netns_fd)
    _check(libc().unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc().mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    _check(libc().mount(b"sysfs", mountpoint.encode(), b"sysfs", 0, None), "mount sysfs")


def _child(netns_fd: int, sysfs_root: str, reader: Callable[[str], Any], mountpoint: str, wfd: int) -> None:
    try:
        root = sysfs_root
        if os.path.realpath(sysfs_root) == LIVE_SYSFS:
            _enter_and_mount(netns_fd, mountpoint)
            root = mountpoint
        else:  # a simulated tree is the same from every netns: enter only, for what the reader does
            setns(netns_fd)
        out = {"ok": reader(root)}
    except Exception as e:  # noqa: BLE001 - everything goes back to the parent as text
        out = {"error": f"{type(e).__name__}: {e}"}
    os.write(wfd, json.dumps(out).encode())


def read_in_netns(netns_path: str, reader: Callable[[str], Any], sysfs_root: str = LIVE_SYSFS) -> Any:
    """``reader(root)`` run inside the netns at ``netns_path``; its JSON-able result is returned."""
    with open_netns(netns_path) as ns, tempfile.TemporaryDirectory(prefix="rdma-cni-sysfs-") as mnt:
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            os.close(rfd)
            try:
                _child(ns.fd, sysfs_root, reader, mnt, wfd)
            finally:
                os._exit(0)
        os.close(wfd)
        chunks = []
        while chunk := os.read(rfd, 65536):
            chunks.append(chunk)
        os.close(rfd)
        os.waitpid(pid, 0)
    out = json.loads(b"".join(chunks) or b'{"error": "reader died"}')
    if "error" in out:
        raise OSError(f"reading RDMA sysfs in {netns_path}: {out['error']}")
    return out["ok"]
