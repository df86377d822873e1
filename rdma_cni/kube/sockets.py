"""Unix sockets of a kubelet plugin, told apart by inode.

kubelet re-creates ``kubelet.sock`` when it restarts and deletes the sockets of the plugins it
served; a plugin (the device plugin's registration loop, the DRA driver's registration socket)
learns that one of those happened by comparing the inode it saw when it served or dialled with the
inode there now. A path alone cannot say it: the new socket has the same name.

    inode = socket_inode("/var/lib/kubelet/device-plugins/kubelet.sock")   # None: no socket there
"""

from __future__ import annotations

import os
import stat


def socket_inode(path: str) -> int | None:
    """The inode of the unix socket at ``path``; None when there is none (or something else is there)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino if stat.S_ISSOCK(st.st_mode) else None


def make_private(path: str) -> None:
    """Serve ``path`` to this process's user alone (root on a node: kubelet, the runtime, Multus),
    or refuse: the socket becomes 0600, and it must be ours, in a directory nobody else may write
    (who can write the directory can put another socket in its place). RuntimeError naming what
    is wrong and the fix, which every server's caller already turns into its exit message."""
    os.chmod(path, 0o600)
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise RuntimeError(f"{path} is not a socket of uid {os.geteuid()} with mode 0600 (mode "
                           f"{stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}): refusing to serve on it")
    directory = os.path.dirname(os.path.abspath(path))
    d = os.stat(directory)
    writable = d.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not d.st_mode & stat.S_ISVTX
    if d.st_uid not in (0, os.geteuid()) or writable:
        raise RuntimeError(
            f"{directory} (uid {d.st_uid}, mode {stat.S_IMODE(d.st_mode):o}) may be written by others, who "
            f"could replace {os.path.basename(path)}: refusing to serve there; make it root's and "
            "not group- or world-writable",
        )
