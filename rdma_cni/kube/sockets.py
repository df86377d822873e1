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
